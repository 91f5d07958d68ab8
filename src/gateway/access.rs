//! [`Access`]: who may use which slug. A caller is known by its token (its SHA-256 compared
//! with every configured hash, in constant time), or needs none (local, or on loopback when
//! the gateway is open to loopback); its slugs are its token's entitlement (every slug for a
//! caller that needs no token), narrowed by `?servers=`. Anything else is `Forbidden`, one
//! message whether the slug exists or not. Shared by the gateway and its tasks; `names.rs`
//! routes shown names through it and `prompts.rs` seals `requestState` with it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::Digest;

use crate::gateway::config::Token;
use crate::mcp::source::{Authentication, Caller, SourceError};
use crate::upstream::Upstream;

/// Who may use which slug: the upstreams, the tokens and their entitlements.
pub(crate) struct Access {
    pub(super) upstreams: Vec<Arc<Upstream>>,
    tokens: Vec<Token>,
    /// Callers on a loopback address may use every slug without a token (set only for a
    /// gateway bound to loopback alone with no tokens configured).
    open_to_loopback: AtomicBool,
    /// The one slug whose tools and prompts keep their upstream names (`prefix = false`).
    pub(super) bare: std::sync::OnceLock<String>,
    /// Seals the `requestState` an upstream hands a caller to this caller and slug.
    pub(super) states: crate::mcp::sealed::Sealer,
}

impl Access {
    /// Access to `upstreams` for the holders of `tokens`; closed to loopback callers without
    /// a token, no bare slug.
    pub(super) fn new(upstreams: Vec<Arc<Upstream>>, tokens: Vec<Token>) -> Access {
        Access {
            upstreams,
            tokens,
            open_to_loopback: AtomicBool::new(false),
            bare: std::sync::OnceLock::new(),
            states: crate::mcp::sealed::Sealer::new(),
        }
    }

    /// Lets callers on a loopback address in without a token.
    pub(super) fn open_to_loopback(&self) {
        self.open_to_loopback.store(true, Ordering::Release);
    }

    /// The configured token `t` is, if any. Every hash is compared, so the time taken does
    /// not say which one matched.
    fn token(&self, t: &str) -> Option<&Token> {
        let digest: [u8; 32] = sha2::Sha256::digest(t.as_bytes()).into();
        let mut found = None;
        for tok in &self.tokens {
            if same(&tok.sha256, &digest) && found.is_none() {
                found = Some(tok);
            }
        }
        found
    }

    /// A caller let in without a token: local (stdio), or on loopback when the gateway is
    /// open to loopback (whatever stale token it may carry).
    fn needs_no_token(&self, caller: &Caller) -> bool {
        caller.local || (self.open_to_loopback.load(Ordering::Acquire) && caller.loopback)
    }

    /// The slugs `caller` may use: its token's entitlement, or every slug for a caller that
    /// needs no token, narrowed by `?servers=`.
    fn allowed(&self, caller: &Caller) -> BTreeSet<String> {
        let token = caller.token.as_deref().and_then(|t| self.token(t));
        let mut set: BTreeSet<String> = match token {
            Some(tok) => tok.slugs.clone(),
            None if self.needs_no_token(caller) => {
                self.upstreams.iter().map(|u| u.name.clone()).collect()
            }
            None => BTreeSet::new(),
        };
        if let Some(only) = &caller.servers {
            set.retain(|s| only.iter().any(|o| o == s));
        }
        set
    }

    /// Whether `caller` presented a token this gateway knows, or needs none.
    pub(super) fn authenticates(&self, caller: &Caller) -> Authentication {
        if self.needs_no_token(caller) {
            Authentication::Known
        } else if self.tokens.is_empty() {
            Authentication::NoTokens
        } else {
            match caller.token.as_deref().map(|t| self.token(t).is_some()) {
                Some(true) => Authentication::Known,
                Some(false) => Authentication::UnknownToken,
                None => Authentication::TokenRequired,
            }
        }
    }

    /// The upstreams `caller` may use.
    pub(super) fn selected(&self, caller: &Caller) -> Vec<Arc<Upstream>> {
        let allowed = self.allowed(caller);
        self.upstreams
            .iter()
            .filter(|u| allowed.contains(&u.name))
            .cloned()
            .collect()
    }

    /// The slug `name` if the caller may use it; Forbidden (one message) otherwise.
    pub(crate) fn slug(&self, caller: &Caller, name: &str) -> Result<Arc<Upstream>, SourceError> {
        self.selected(caller)
            .into_iter()
            .find(|u| u.name == name)
            .ok_or(SourceError::Forbidden)
    }
}

/// Compares in constant time.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Who gets in and what they may use: a configured token its slugs, an unknown token
    /// nothing and a refusal (never an empty entitlement), a loopback caller of a gateway
    /// open to loopback every slug whatever stale token it carries.
    #[test]
    fn callers_are_known_by_their_tokens_or_by_needing_none() {
        let up = crate::testing::down_upstream(Default::default());
        let name = up.name.clone();
        let token = |t: &str| Caller {
            token: Some(t.into()),
            ..Caller::default()
        };
        let access = Access::new(
            vec![up],
            vec![Token {
                label: "t".into(),
                sha256: sha2::Sha256::digest(b"good").into(),
                slugs: [name.clone()].into(),
            }],
        );
        let all: BTreeSet<String> = [name].into();
        assert_eq!(access.authenticates(&token("good")), Authentication::Known);
        assert_eq!(access.allowed(&token("good")), all);
        assert_eq!(
            access.authenticates(&token("bad")),
            Authentication::UnknownToken
        );
        assert!(access.allowed(&token("bad")).is_empty());
        let anonymous = Caller {
            loopback: true,
            ..Caller::default()
        };
        assert_eq!(
            access.authenticates(&anonymous),
            Authentication::TokenRequired
        );
        assert_eq!(
            access.authenticates(&Caller::local()),
            Authentication::Known
        );

        let open = Access::new(access.upstreams.clone(), Vec::new());
        open.open_to_loopback();
        let stale = Caller {
            loopback: true,
            ..token("stale")
        };
        assert_eq!(open.authenticates(&stale), Authentication::Known);
        assert_eq!(open.allowed(&stale), all);
        assert_eq!(open.authenticates(&token("x")), Authentication::NoTokens);
    }
}
