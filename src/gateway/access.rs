//! [`Access`]: who may use which slug. A caller is known by its token (its SHA-256 compared
//! with every configured hash, in constant time), or needs none (local, or on loopback when
//! the gateway is open to loopback); its slugs are its token's entitlement (every slug for a
//! caller that needs no token), narrowed by `?servers=`. Anything else is `Forbidden`, one
//! message whether the slug exists or not. Shared by the gateway and its tasks; `names.rs`
//! routes shown names through it and `prompts.rs` seals `requestState` with it.
//!
//! What a reload changes (the upstreams, the tokens, the bare slug, the loopback rule) is one
//! [`Entitled`] snapshot, swapped whole: a request sees the old one or the new one, never a
//! mix. Each listen stream admitted through the gateway is [`held`](Access::hold) with its
//! caller and the upstreams it watches; a swap ends (cancels) every held stream whose caller
//! may no longer use one of them, or whose upstream was removed or replaced.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};

use tokio_util::sync::CancellationToken;

use crate::auth::issuer::{Grant, Issuers};
use crate::gateway::config::Token;
use crate::mcp::source::{Authentication, Caller, SourceError};
use crate::sync::{Recover, RecoverRw};
use crate::upstream::Upstream;

/// What one config entitles: the upstreams, the tokens and the rules over them.
#[derive(Default, Clone)]
pub(crate) struct Entitled {
    pub(super) upstreams: Vec<Arc<Upstream>>,
    tokens: Vec<Token>,
    /// Callers on a loopback address may use every slug without a token (set only for a
    /// gateway bound to loopback alone with no tokens configured).
    open_to_loopback: bool,
    /// The one slug whose tools and prompts keep their upstream names (`prefix = false`).
    pub(super) bare: Option<String>,
    /// `[[issuer]]`s: identity providers whose access tokens (JWTs) are taken beside the
    /// tokens, their scopes entitling (`herald:SLUG`, `herald:SLUG:read`, `herald:*`).
    issuers: Option<Arc<Issuers>>,
}

impl Entitled {
    /// `upstreams` for the holders of `tokens`, closed to loopback callers without a token,
    /// no bare slug.
    pub(crate) fn new(upstreams: Vec<Arc<Upstream>>, tokens: Vec<Token>) -> Entitled {
        Entitled {
            upstreams,
            tokens,
            open_to_loopback: false,
            bare: None,
            issuers: None,
        }
    }

    /// Takes the access tokens `issuers` issue (none when empty).
    pub(crate) fn issuers(mut self, issuers: Option<Arc<Issuers>>) -> Entitled {
        self.issuers = issuers.filter(|i| !i.is_empty());
        self
    }

    /// The issuers taken now, if any (a reload keeps them when its `[[issuer]]`s are the same).
    pub(crate) fn issuers_now(&self) -> Option<&Arc<Issuers>> {
        self.issuers.as_ref()
    }

    /// `caller`'s token when it is to be checked as an access token (a JWT, not a
    /// `[[token]]`, with issuers configured), and the issuers to check it with.
    fn access_token<'a>(&'a self, caller: &'a Caller) -> Option<(&'a str, &'a Arc<Issuers>)> {
        crate::auth::access_token(caller, self.issuers.as_ref(), self.token(caller).is_some())
    }

    /// What `caller`'s access token grants: one an issuer's keys verify, with the keys held
    /// now.
    fn grant(&self, caller: &Caller) -> Option<Grant> {
        crate::auth::grant(caller, self.issuers.as_ref(), self.token(caller).is_some())
    }

    /// The slugs a grant's scopes entitle, each `true` when only for reading:
    /// `herald:SLUG` and `herald:*` for everything, `herald:SLUG:read` and `herald:*:read`
    /// for reads and read-only tools alone. Other scopes are not herald's and entitle nothing.
    fn granted(&self, grant: &Grant) -> BTreeMap<String, bool> {
        let mut out: BTreeMap<String, bool> = BTreeMap::new();
        let mut give = |slug: &str, read_only: bool| {
            let e = out.entry(slug.to_owned()).or_insert(read_only);
            *e = *e && read_only;
        };
        for scope in &grant.scopes {
            let Some(rest) = scope.strip_prefix("herald:") else {
                continue;
            };
            let (slug, read_only) = match rest.strip_suffix(":read") {
                Some(slug) => (slug, true),
                None => (rest, false),
            };
            if slug == "*" {
                for u in &self.upstreams {
                    give(&u.name, read_only);
                }
            } else if self.upstreams.iter().any(|u| u.name == slug) {
                give(slug, read_only);
            }
        }
        out
    }

    /// Whether `caller` may use slug `slug` only for reading (an access token with
    /// `herald:SLUG:read` and no wider scope for it): its tools that do not say they only
    /// read are neither listed nor called.
    pub(crate) fn read_only(&self, caller: &Caller, slug: &str) -> bool {
        self.grant(caller)
            .is_some_and(|g| self.granted(&g).get(slug) == Some(&true))
    }

    /// Whether `caller` may call `up`'s tool `tool`, from this one snapshot: any tool of a
    /// slug it is entitled to wholly, and with a read-only grant one its catalog says only
    /// reads (a tool not in the catalog, not connected yet, is not taken as read-only). A
    /// caller no longer entitled to the slug (a reload since its route was found, an access
    /// token expired or its key dropped) may call nothing.
    fn may_call(&self, caller: &Caller, up: &Upstream, tool: &str) -> Result<(), SourceError> {
        if !self.may_use(caller, &up.name) {
            return Err(SourceError::Forbidden);
        }
        if !self.read_only(caller, &up.name)
            || up.catalog().and_then(|c| c.read_only(tool)) == Some(true)
        {
            return Ok(());
        }
        Err(SourceError::InsufficientScope {
            slug: up.name.clone(),
            tool: tool.to_owned(),
            scope: format!("herald:{}", up.name),
        })
    }

    /// Lets callers on a loopback address in without a token.
    pub(crate) fn open_to_loopback(mut self, open: bool) -> Entitled {
        self.open_to_loopback = open;
        self
    }

    /// Shows slug `name`'s tools and prompts under their upstream names.
    pub(crate) fn bare(mut self, name: Option<&str>) -> Entitled {
        self.bare = name.map(str::to_owned);
        self
    }

    /// The configured token `caller` presented, if any. Every hash is compared, so the time
    /// taken does not say which one matched.
    fn token(&self, caller: &Caller) -> Option<&Token> {
        let digest = caller.token_sha256()?;
        let mut found = None;
        for tok in &self.tokens {
            if crate::auth::same_digest(&tok.sha256, digest) && found.is_none() {
                found = Some(tok);
            }
        }
        found
    }

    /// A caller let in without a token: local (stdio), or on loopback when the gateway is
    /// open to loopback (whatever stale token it may carry).
    fn needs_no_token(&self, caller: &Caller) -> bool {
        caller.local || (self.open_to_loopback && caller.loopback)
    }

    /// What `caller`'s credentials entitle it to, before `?servers=` narrows it: the one place
    /// the kinds of credential are told apart (the checks below all start here).
    fn entitlement(&self, caller: &Caller) -> Entitlement<'_> {
        match self.token(caller) {
            Some(tok) => Entitlement::Slugs(&tok.slugs),
            None if self.needs_no_token(caller) => Entitlement::Every,
            None => match self.grant(caller) {
                Some(g) => Entitlement::Granted(self.granted(&g)),
                None => Entitlement::Nothing,
            },
        }
    }

    /// Whether `entitlement` includes slug `slug` of this config.
    fn includes(&self, entitlement: &Entitlement, slug: &str) -> bool {
        match entitlement {
            Entitlement::Slugs(slugs) => slugs.contains(slug),
            Entitlement::Every => self.upstreams.iter().any(|u| u.name == slug),
            Entitlement::Granted(granted) => granted.contains_key(slug),
            Entitlement::Nothing => false,
        }
    }

    /// The slugs `caller` may use: its token's entitlement, or every slug for a caller that
    /// needs no token, narrowed by `?servers=`.
    fn allowed(&self, caller: &Caller) -> BTreeSet<String> {
        let mut set: BTreeSet<String> = match self.entitlement(caller) {
            Entitlement::Slugs(slugs) => slugs.clone(),
            Entitlement::Every => self.upstreams.iter().map(|u| u.name.clone()).collect(),
            Entitlement::Granted(granted) => granted.into_keys().collect(),
            Entitlement::Nothing => BTreeSet::new(),
        };
        set.retain(|s| narrowed_to(caller, s));
        set
    }

    /// Whether `slug` is among the slugs `caller` may use ([`Entitled::allowed`]), worked out
    /// for that one slug without building the set: the check of every call.
    fn may_use(&self, caller: &Caller, slug: &str) -> bool {
        self.includes(&self.entitlement(caller), slug) && narrowed_to(caller, slug)
    }

    /// Whether `caller` presented a token this config knows, or needs none, and (when it
    /// narrows with `?servers=`) kept any server to use.
    fn authenticates(&self, caller: &Caller) -> Authentication {
        let known = self.known(caller);
        if known == Authentication::Known
            && caller.servers.is_some()
            && self.allowed(caller).is_empty()
        {
            return Authentication::NothingSelected;
        }
        known
    }

    /// The `[[token]]` `caller` presented, when this config knows it: its digest's start as
    /// the key (two tokens of one name stay apart), its name to say.
    fn identity(&self, caller: &Caller) -> Option<(String, String)> {
        match self.token(caller) {
            Some(token) => Some((hex::encode(&token.sha256[..16]), token.label.clone())),
            None => self.grant(caller).map(|g| g.identity(caller)),
        }
    }

    /// Whether `caller` presented a token this config knows, or needs none.
    fn known(&self, caller: &Caller) -> Authentication {
        if self.needs_no_token(caller) {
            Authentication::Known
        } else if self.tokens.is_empty() && self.issuers.is_none() {
            Authentication::NoTokens
        } else {
            match caller.token.as_deref() {
                Some(_) if self.token(caller).is_some() || self.grant(caller).is_some() => {
                    Authentication::Known
                }
                Some(_) => Authentication::UnknownToken,
                None => Authentication::TokenRequired,
            }
        }
    }

    /// Whether `other` entitles exactly what this does (the same upstreams, tokens and rules).
    pub(super) fn same_as(&self, other: &Entitled) -> bool {
        self.upstreams.len() == other.upstreams.len()
            && self
                .upstreams
                .iter()
                .zip(&other.upstreams)
                .all(|(a, b)| Arc::ptr_eq(a, b))
            && self.tokens == other.tokens
            && match (&self.issuers, &other.issuers) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
            && self.open_to_loopback == other.open_to_loopback
            && self.bare == other.bare
    }

    /// A tool's or prompt's name as the gateway shows it: `slug__name`, or `name` for the
    /// slug configured with `prefix = false`.
    pub(crate) fn shown(&self, slug: &str, name: &str) -> String {
        if self.bare.as_deref() == Some(slug) {
            name.to_owned()
        } else {
            format!("{slug}__{name}")
        }
    }

    /// Whether `caller` is known and may use every one of `upstreams` (a held stream keeps
    /// what it watches).
    fn keeps(&self, caller: &Caller, upstreams: &[Arc<Upstream>]) -> bool {
        let selected = self.selected(caller);
        self.authenticates(caller) == Authentication::Known
            && upstreams
                .iter()
                .all(|u| selected.iter().any(|s| Arc::ptr_eq(s, u)))
    }

    /// The slug `name` if `caller` may use it; Forbidden otherwise, with one message whether
    /// it exists or not. A caller entitled to every slug learns nothing from being told that
    /// none is named so, and which are: it is.
    pub(super) fn slug(&self, caller: &Caller, name: &str) -> Result<Arc<Upstream>, SourceError> {
        if let Some(u) = self.upstreams.iter().find(|u| u.name == name)
            && self.may_use(caller, name)
        {
            return Ok(u.clone());
        }
        if !self.upstreams.iter().any(|u| u.name == name) && self.entitled_to_all(caller) {
            let names: Vec<&str> = self.upstreams.iter().map(|u| u.name.as_str()).collect();
            return Err(SourceError::InvalidParams(format!(
                "no server named {name}; servers: {}",
                names.join(", ")
            )));
        }
        Err(SourceError::Forbidden)
    }

    /// Whether `caller`'s token (or its needing none) entitles it to every slug, whatever
    /// `?servers=` narrows.
    fn entitled_to_all(&self, caller: &Caller) -> bool {
        match self.entitlement(caller) {
            Entitlement::Nothing => false,
            e => self.upstreams.iter().all(|u| self.includes(&e, &u.name)),
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
}

/// What a caller's credentials entitle it to ([`Entitled::entitlement`]).
enum Entitlement<'a> {
    /// A `[[token]]`'s slugs.
    Slugs(&'a BTreeSet<String>),
    /// Every slug: a caller that needs no token.
    Every,
    /// An access token's: the slugs its scopes name (each `true` when for reading only).
    Granted(BTreeMap<String, bool>),
    Nothing,
}

/// Whether `caller`'s `?servers=` (if any) keeps slug `slug`.
fn narrowed_to(caller: &Caller, slug: &str) -> bool {
    (caller.servers.as_ref()).is_none_or(|only| only.iter().any(|o| o == slug))
}

/// One listen stream admitted through the gateway: who asked, what it watches, how to end it.
struct Held {
    caller: Caller,
    upstreams: Vec<std::sync::Weak<Upstream>>,
    end: CancellationToken,
}

/// Who may use which slug, as the current config says.
pub(crate) struct Access {
    now: RwLock<Arc<Entitled>>,
    /// The listen streams admitted through the gateway (pruned of ended ones as it grows).
    held: Mutex<HeldStreams>,
    /// Seals the `requestState` an upstream hands a caller to this caller and slug.
    pub(super) states: crate::mcp::sealed::Sealer,
}

#[derive(Default)]
struct HeldStreams {
    streams: Vec<Held>,
    /// Pruned of ended streams when it reaches this many.
    prune_at: usize,
}

impl Access {
    /// Access as `entitled` says.
    pub(super) fn new(entitled: Entitled) -> Access {
        Access {
            now: RwLock::new(Arc::new(entitled)),
            held: Mutex::default(),
            states: crate::mcp::sealed::Sealer::new(),
        }
    }

    /// What the config entitles now.
    pub(super) fn now(&self) -> Arc<Entitled> {
        self.now.read_locked().clone()
    }

    /// Puts `entitled` in place of what was, and ends every held stream its caller may no
    /// longer keep (its token gone or narrowed, its upstream removed or replaced). Returns
    /// what was, and how many streams it ended.
    pub(super) fn swap(&self, entitled: Entitled) -> (Arc<Entitled>, usize) {
        let entitled = Arc::new(entitled);
        let old = std::mem::replace(&mut *self.now.write_locked(), entitled.clone());
        let mut held = self.held.locked();
        held.streams.retain(|h| !h.end.is_cancelled());
        let mut ended = 0;
        for h in &held.streams {
            // An upstream gone from memory was removed: it is not kept.
            let watched: Option<Vec<Arc<Upstream>>> =
                h.upstreams.iter().map(std::sync::Weak::upgrade).collect();
            if !watched.is_some_and(|w| entitled.keeps(&h.caller, &w)) {
                h.end.cancel();
                ended += 1;
            }
        }
        held.streams.retain(|h| !h.end.is_cancelled());
        held.prune_at = (held.streams.len() * 2).max(64);
        (old, ended)
    }

    /// Holds a listen stream of `caller` watching `upstreams`: the token returned is
    /// cancelled when a reload takes its access away (and should be when the stream ends).
    pub(super) fn hold(&self, caller: &Caller, upstreams: &[Arc<Upstream>]) -> CancellationToken {
        let end = CancellationToken::new();
        let mut held = self.held.locked();
        if held.streams.len() >= held.prune_at {
            held.streams.retain(|h| !h.end.is_cancelled());
            held.prune_at = (held.streams.len() * 2).max(64);
        }
        held.streams.push(Held {
            caller: caller.clone(),
            upstreams: upstreams.iter().map(Arc::downgrade).collect(),
            end: end.clone(),
        });
        end
    }

    /// Streams held now (tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        let held = self.held.locked();
        held.streams
            .iter()
            .filter(|h| !h.end.is_cancelled())
            .count()
    }

    /// Whether `caller` presented a token this gateway knows, or needs none.
    pub(super) fn authenticates(&self, caller: &Caller) -> Authentication {
        self.now().authenticates(caller)
    }

    /// [`authenticates`](Self::authenticates), first fetching an issuer's keys again when
    /// `caller`'s access token names a key its set lacks (a rotation). Each request's first
    /// check, where it may wait.
    pub(super) async fn authenticates_fresh(&self, caller: &Caller) -> Authentication {
        let now = self.now();
        if let Some((t, issuers)) = now.access_token(caller) {
            let _ = issuers.verify_fresh(t).await;
        }
        now.authenticates(caller)
    }

    /// Who an access token's caller is across its tokens: `oauth:` and the hash of its
    /// issuer and subject. `None` for every other caller (known by its token).
    pub(super) fn known_as(&self, caller: &Caller) -> Option<String> {
        self.now().grant(caller)?.known_as()
    }

    /// How long `caller`'s access token has left (with the clock skew allowed): nothing for
    /// one that no longer verifies (expired since it was let in, its key dropped); `None` for
    /// a caller known otherwise.
    pub(super) fn expires_in(&self, caller: &Caller) -> Option<std::time::Duration> {
        let now = self.now();
        crate::auth::expires_in(caller, now.issuers.as_ref(), now.token(caller).is_some())
    }

    /// Whether `caller` may use slug `slug` only for reading (see [`Entitled::read_only`]).
    pub(crate) fn read_only(&self, caller: &Caller, slug: &str) -> bool {
        self.now().read_only(caller, slug)
    }

    /// Whether `caller` may call `up`'s tool `tool` (see [`Entitled::may_call`]).
    pub(crate) fn may_call(
        &self,
        caller: &Caller,
        up: &Upstream,
        tool: &str,
    ) -> Result<(), SourceError> {
        self.now().may_call(caller, up, tool)
    }

    /// The `[[token]]` `caller` presented, when the config knows it (see `Entitled::identity`).
    pub(super) fn identity(&self, caller: &Caller) -> Option<(String, String)> {
        self.now().identity(caller)
    }

    /// Whether `caller`, held watching `upstreams`, may keep them under the config now.
    pub(super) fn keeps(&self, caller: &Caller, upstreams: &[Arc<Upstream>]) -> bool {
        self.now().keeps(caller, upstreams)
    }

    /// The upstreams `caller` may use.
    pub(super) fn selected(&self, caller: &Caller) -> Vec<Arc<Upstream>> {
        self.now().selected(caller)
    }

    /// The slug `name` if the caller may use it (see [`Entitled::slug`]).
    pub(crate) fn slug(&self, caller: &Caller, name: &str) -> Result<Arc<Upstream>, SourceError> {
        self.now().slug(caller, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest as _;

    /// A token entitled to `slugs`, its secret `t`.
    fn tok(t: &[u8], slugs: &[&str]) -> Token {
        Token {
            label: "t".into(),
            sha256: sha2::Sha256::digest(t).into(),
            slugs: slugs.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// A caller presenting token `t`.
    fn caller(t: &str) -> Caller {
        Caller {
            token: Some(t.into()),
            ..Caller::default()
        }
    }

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
        let good = Token {
            label: "t".into(),
            sha256: sha2::Sha256::digest(b"good").into(),
            slugs: [name.clone()].into(),
        };
        let access = Access::new(Entitled::new(vec![up.clone()], vec![good.clone()]));
        let allowed = |a: &Access, c: &Caller| a.now().allowed(c);
        let all: BTreeSet<String> = [name].into();
        assert_eq!(access.authenticates(&token("good")), Authentication::Known);
        assert_eq!(allowed(&access, &token("good")), all);
        assert_eq!(
            access.authenticates(&token("bad")),
            Authentication::UnknownToken
        );
        assert!(allowed(&access, &token("bad")).is_empty());
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

        let open = Access::new(Entitled::new(vec![up.clone()], Vec::new()).open_to_loopback(true));
        let stale = Caller {
            loopback: true,
            ..token("stale")
        };
        assert_eq!(open.authenticates(&stale), Authentication::Known);
        assert_eq!(allowed(&open, &stale), all);
        assert_eq!(open.authenticates(&token("x")), Authentication::NoTokens);
    }

    /// The check of one slug on every call says what the whole entitlement says, for each
    /// kind of caller here: a token's slugs, none for an unknown token, every slug for a
    /// caller needing none, each narrowed by `?servers=`. (Access tokens' scopes, which need
    /// an issuer's keys, are called through a gateway in tests/it/oauth.rs.)
    #[test]
    fn one_slugs_check_agrees_with_the_whole_entitlement() {
        let named = |n: &str| {
            let mut up = crate::testing::down_upstream(Default::default());
            Arc::get_mut(&mut up).unwrap().name = n.into();
            up
        };
        let (a, b) = (named("a"), named("b"));
        let tokens = vec![tok(b"ta", &["a"]), tok(b"tab", &["a", "b"])];
        let closed = Entitled::new(vec![a.clone(), b.clone()], tokens);
        let open = Entitled::new(vec![a, b], Vec::new()).open_to_loopback(true);
        let narrowed = |c: Caller, only: &[&str]| Caller {
            servers: Some(only.iter().map(|s| s.to_string()).collect()),
            ..c
        };
        let loopback = Caller {
            loopback: true,
            ..Caller::default()
        };
        let callers = [
            caller("ta"),
            caller("tab"),
            narrowed(caller("tab"), &["b"]),
            narrowed(caller("ta"), &["b"]),
            caller("unknown"),
            Caller::local(),
            narrowed(Caller::local(), &["a"]),
            loopback.clone(),
            narrowed(loopback, &["b", "c"]),
        ];
        let mut seen = 0;
        for entitled in [&closed, &open] {
            for c in &callers {
                let allowed = entitled.allowed(c);
                for slug in ["a", "b", "c"] {
                    let may = entitled.may_use(c, slug);
                    assert_eq!(may, allowed.contains(slug), "{c:?} on {slug}");
                    assert_eq!(entitled.slug(c, slug).is_ok(), may, "{c:?} on {slug}");
                    seen += usize::from(may);
                }
            }
        }
        // (Neither always nor never.)
        assert!(seen > 0 && seen < 2 * 9 * 3, "{seen}");
    }

    /// A swap ends the held streams it takes access from, and only those: a revoked token's,
    /// a narrowed token's on the slug it lost, every stream on a replaced upstream; an
    /// unchanged token's stream on an unchanged upstream is untouched.
    #[test]
    fn a_swap_ends_the_streams_it_takes_access_from() {
        let a = crate::testing::down_upstream(Default::default());
        let name = a.name.clone();
        let access = Access::new(Entitled::new(
            vec![a.clone()],
            vec![tok(b"keep", &[&name]), tok(b"drop", &[&name])],
        ));
        let kept = access.hold(&caller("keep"), std::slice::from_ref(&a));
        let dropped = access.hold(&caller("drop"), std::slice::from_ref(&a));
        let local = access.hold(&Caller::local(), std::slice::from_ref(&a));
        let (_, ended) = access.swap(Entitled::new(vec![a.clone()], vec![tok(b"keep", &[&name])]));
        assert_eq!(ended, 1);
        assert!(dropped.is_cancelled());
        assert!(!kept.is_cancelled() && !local.is_cancelled());
        assert_eq!(access.held(), 2);

        // The same slug, another upstream (its config changed): every stream on the old one
        // ends, whoever holds it.
        let b = crate::testing::down_upstream(Default::default());
        assert_eq!(b.name, name);
        let (_, ended) = access.swap(Entitled::new(vec![b], vec![tok(b"keep", &[&name])]));
        assert_eq!(ended, 2);
        assert!(kept.is_cancelled() && local.is_cancelled());
        assert_eq!(access.held(), 0);
    }

    /// A slug that does not exist is named so to a caller entitled to every slug, and is the
    /// one Forbidden to any other (which must not learn what exists).
    #[test]
    fn only_a_caller_entitled_to_every_slug_is_told_a_slug_does_not_exist() {
        let a = crate::testing::down_upstream(Default::default());
        let b = crate::testing::down_upstream(Default::default());
        let (an, bn) = (a.name.clone(), "other".to_owned());
        let b = Arc::new(Upstream::dialing(
            crate::upstream::UpstreamConfig {
                name: bn.clone(),
                ..crate::upstream::UpstreamConfig::new(
                    b.target.clone(),
                    Default::default(),
                    1 << 20,
                )
            },
            Arc::new(|_| Box::pin(std::future::pending())),
        ));
        let access = Access::new(Entitled::new(
            vec![a, b],
            vec![tok(b"all", &[&an, &bn]), tok(b"one", &[&an])],
        ));
        let e = access
            .slug(&caller("all"), "nosuch")
            .err()
            .expect("refused");
        assert_eq!(
            e.to_string(),
            SourceError::InvalidParams(format!("no server named nosuch; servers: {an}, other"))
                .to_string()
        );
        // Narrowed by ?servers=, it is still entitled to all: told the same.
        let narrowed = Caller {
            servers: Some(vec![an.clone()]),
            ..caller("all")
        };
        assert!(
            access
                .slug(&narrowed, "nosuch")
                .err()
                .expect("refused")
                .to_string()
                .contains("no server named")
        );
        // A token with one slug: the same Forbidden for a slug that exists and one that does not.
        let one = caller("one");
        assert_eq!(
            access.slug(&one, "nosuch").err().expect("refused"),
            SourceError::Forbidden
        );
        assert_eq!(
            access.slug(&one, "other").err().expect("refused"),
            SourceError::Forbidden
        );
        assert!(
            access
                .slug(&Caller::local(), "nosuch")
                .err()
                .expect("refused")
                .to_string()
                .contains("servers:")
        );
    }
}
