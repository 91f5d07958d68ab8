//! What a watch's `on_event` filter must pass before any subscription is made, the same for
//! a watch starting ([`WatchManager`](crate::watch::WatchManager)) and for `herald check`
//! ([`check_filters`]): it must be source text, it must compile, a dry run on a sample event
//! must not hit a NameError (missing keys in the sample are fine), and when the sample gives
//! nothing, the code must be able to give something: code that ends in a statement (`if`,
//! `for`, an assignment) has no value, and unless it prints, it would drop every event.

use std::sync::Arc;

use serde_json::json;

use crate::filter::pool::{Catalog as FilterHost, FilterError, FilterPool, PoolConfig};
use crate::filter::shape;
use crate::watch::filter_catalog::FilterCatalog;
use crate::watch::spec::{WatchError, WatchSpec};

/// What `code` must be before it runs: source text, not nothing, not a function's repr.
pub fn text(code: &str) -> Result<(), WatchError> {
    let trimmed = code.trim();
    if trimmed.is_empty() {
        return Err(WatchError::Invalid(
            "on_event is empty; pass Python source text or no on_event".into(),
        ));
    }
    if trimmed.starts_with("<function")
        || trimmed.starts_with("<bound method")
        || trimmed.starts_with("<lambda")
    {
        return Err(WatchError::Invalid(format!(
            "on_event must be Python source text, not a function object ({}); pass the code itself as a string",
            trimmed.lines().next().unwrap_or_default()
        )));
    }
    Ok(())
}

/// Dry-runs `code` (watch `name` on `uri`) in `pool`'s scope `scope`, which is dropped after.
pub async fn dry_run(
    pool: &FilterPool,
    catalog: Arc<dyn FilterHost>,
    scope: &str,
    name: &str,
    uri: &str,
    code: &str,
) -> Result<(), WatchError> {
    text(code)?;
    let sample = json!({"watch": name, "uri": uri, "type": "ADDED", "seq": 1, "key": "sample",
        "object": {"metadata": {"name": "sample", "namespace": "default", "uid": "sample"}},
        "new": {}, "item": {}, "old": null, "changed": []});
    let r = pool.run(scope, code, sample, catalog).await;
    pool.drop_scope(scope).await;
    match r {
        Err(FilterError::Python(e)) if e.exc_type == "SyntaxError" || e.exc_type == "NameError" => {
            Err(WatchError::Invalid(format!(
                "on_event failed its dry run on a sample event: {e}"
            )))
        }
        Err(FilterError::Worker(e)) => Err(WatchError::Unavailable(format!(
            "on_event could not be dry-run: {e}"
        ))),
        Ok(o) if !o.value.is_null() || !o.printed.trim().is_empty() => Ok(()),
        // The sample gave nothing (or raised on a key it lacks): fine, unless nothing ever can.
        _ => match shape::never_notices(code) {
            Some(why) => Err(WatchError::Invalid(why)),
            None => Ok(()),
        },
    }
}

/// One filter's verdict from [`check_filters`].
#[derive(Debug)]
pub enum Verdict {
    /// It would be refused at start.
    Refused(String),
    /// It calls a name no built-in has: fine if a server offers a tool by that name, which
    /// only a connected watch client knows.
    MaybeATool(String),
}

/// Dry-runs every watch's filter as a start would, in worker processes of `exe` (the herald
/// binary), with no server connected: `(watch name, verdict)` for each that is not plainly
/// fine.
pub async fn check_filters(
    exe: std::path::PathBuf,
    watches: &[WatchSpec],
) -> Vec<(String, Verdict)> {
    let with_code: Vec<(&WatchSpec, &str)> = watches
        .iter()
        .filter_map(|w| Some((w, w.on_event.as_deref()?)))
        .collect();
    if with_code.is_empty() {
        return Vec::new();
    }
    let mut cfg = PoolConfig::new(exe);
    cfg.workers = 1;
    let pool = FilterPool::new(cfg);
    let catalog: Arc<dyn FilterHost> = Arc::new(FilterCatalog {
        servers: Vec::new(),
        code: None,
    });
    let mut out = Vec::new();
    for (i, (w, code)) in with_code.into_iter().enumerate() {
        let scope = format!("\u{0}check:{i}");
        match dry_run(&pool, catalog.clone(), &scope, &w.name, &w.uri, code).await {
            Ok(()) => {}
            Err(e) => {
                let text = e.to_string();
                let verdict = match called_unknown_name(&text, code) {
                    true => Verdict::MaybeATool(text),
                    false => Verdict::Refused(text),
                };
                out.push((w.name.clone(), verdict));
            }
        }
    }
    out
}

/// Whether `error` is a NameError for a name `code` calls (`name(`, spaces allowed before
/// the parenthesis, not part of a longer name): a tool's, perhaps.
fn called_unknown_name(error: &str, code: &str) -> bool {
    let Some(rest) = error.split("NameError: name '").nth(1) else {
        return false;
    };
    let Some(name) = rest.split('\'').next() else {
        return false;
    };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    !name.is_empty()
        && code.match_indices(name).any(|(i, _)| {
            let before = code[..i].chars().next_back();
            let after = code[i + name.len()..].trim_start().chars().next();
            !before.is_some_and(|c| ident(c) || c == '.') && after == Some('(')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_called_unknown_name_may_be_a_tool() {
        let e = "on_event failed its dry run on a sample event: NameError: name 'memo_get' is not defined (line 1, column 1)";
        assert!(called_unknown_name(e, "memo_get(key='x')"));
        assert!(called_unknown_name(e, "x = memo_get (key='x')"));
        assert!(!called_unknown_name(e, "memo_get + 1"));
        let get = "NameError: name 'get' is not defined";
        assert!(!called_unknown_name(get, "memo_get(key='x') and get"));
        assert!(!called_unknown_name("SyntaxError: x", "f("));
    }
}
