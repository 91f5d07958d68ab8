//! How the gateway names its slugs' tools and prompts: `slug__name`, or the upstream's own
//! name for the one `[[slug]]` with `prefix = false`, and the way back from a shown name to
//! its slug.

use std::sync::Arc;

use super::access::Access;
use crate::mcp::source::{Caller, SourceError};
use crate::upstream::Upstream;

/// Which of a slug's names a route looks up: its tools or its prompts.
#[derive(Clone, Copy)]
pub(crate) enum Names {
    Tools,
    Prompts,
}

impl Access {
    /// The slug and upstream name behind a shown tool or prompt name: the bare slug's own
    /// name when it lists one (and this caller may use it), else `slug__name`. `None` when
    /// the name has neither shape (the caller learns it is unknown, never whether a slug
    /// exists: a slug it may not use is `Forbidden`).
    pub(crate) fn route_name(
        &self,
        caller: &Caller,
        name: &str,
        names: Names,
    ) -> Option<Result<(Arc<Upstream>, String), SourceError>> {
        // One snapshot for the whole route (a reload swaps it whole).
        let now = self.now();
        let slug_of = |slug: &str| now.slug(caller, slug);
        // A name whose prefix is a slug goes to that slug, whatever the bare slug lists.
        if let Some((slug, rest)) = name.split_once("__")
            && now.upstreams.iter().any(|u| u.name == slug)
        {
            return Some(slug_of(slug).map(|up| (up, rest.to_owned())));
        }
        if let Some(bare) = now.bare.as_deref()
            && let Ok(up) = slug_of(bare)
        {
            // Until it has connected once, its names are not known: not "unknown" yet.
            let Some(c) = up.catalog() else {
                return Some(Err(SourceError::Unavailable(format!(
                    "server {bare} has not connected yet, so its names are not known; try again shortly"
                ))));
            };
            let listed = match names {
                Names::Tools => c.tools.iter().any(|t| t.name == name),
                Names::Prompts => c.prompts.iter().any(|p| p.name == name),
            };
            if listed {
                return Some(Ok((up, name.to_owned())));
            }
        }
        let (slug, rest) = name.split_once("__")?;
        Some(slug_of(slug).map(|up| (up, rest.to_owned())))
    }
}
