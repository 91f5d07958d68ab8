//! A role's own gate (`--access FILE` on `herald memo`, `file`, `k8s`, `slack`): the callers
//! its HTTP and QUIC endpoints let in, for a role served on its own rather than as a slug of
//! a gateway (which has its own, `gateway/access.rs`).
//!
//! The file is the gateway config's `[[token]]` and `[[issuer]]` tables and nothing else, so
//! the same lines serve both:
//!
//! - a `[[token]]` (`sha256` = the token's SHA-256) lets its holder use the role when its
//!   `slugs` name the role (`memo`, …) or `*`; one that names neither is refused at load, as
//!   a gateway refuses a slug it does not have;
//! - an `[[issuer]]`'s access tokens (JWTs, checked as the gateway checks them) let their
//!   holder in by scope: `herald:ROLE` or `herald:*` for everything, `herald:ROLE:read` or
//!   `herald:*:read` for reads and read-only tools alone (a tool that changes things is then
//!   `insufficient_scope`, HTTP `403`, so an OAuth client can step up). An access token with
//!   neither is an unknown token.
//!
//! stdio needs no token (its caller started the process). Every network caller needs one:
//! there is no loopback exemption once a file is given. [`Guarded`] puts the gate in front
//! of a source by answering [`Source::authenticates`], checking the caller again in every
//! operation (a webhook subscription polls long after its request, with the token it was
//! made with; a token may expire while its request's body is read), and narrowing what a
//! caller that may not write lists and calls; the rest is the source's own. What a role
//! publishes on NATS (`--publish-events`) is another channel, guarded by NATS and the
//! deployment's key, not by this file.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{
    CallToolResponse, CompleteRequestParams, CompleteResult, GetPromptResponse,
    InputRequiredResult, JsonObject, Prompt, Resource, ResourceTemplate, Tool,
};
use serde_json::Value;

use crate::auth::issuer::{Grant, IssuerFile, Issuers};
use crate::mcp::hub::ChangeFeed;
use crate::mcp::source::{
    Admission, Authentication, Call, Caller, Contents, ListenFilter, ProtectedResource, Read,
    Source, SourceError, SourceInfo, is_read_only,
};

/// One `[[token]]` as written (the gateway's shape).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    name: Option<String>,
    sha256: String,
    slugs: Vec<String>,
}

/// The file as written.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessFile {
    #[serde(default)]
    token: Vec<TokenFile>,
    #[serde(default)]
    issuer: Vec<IssuerFile>,
}

/// Who may use one role. See the module docs.
pub struct RoleAccess {
    role: String,
    /// `(sha256, name)` of each `[[token]]` that names the role.
    tokens: Vec<([u8; 32], String)>,
    issuers: Option<Arc<Issuers>>,
}

impl std::fmt::Debug for RoleAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleAccess")
            .field("role", &self.role)
            .field("tokens", &self.tokens.len())
            .field("issuers", &self.issuers.as_ref().map(|i| i.urls()))
            .finish()
    }
}

impl RoleAccess {
    /// Reads `path` for role `role`; errors name the file and say what to change. The
    /// issuers' keys are not fetched yet ([`start`](Self::start)).
    pub fn load(path: &Path, role: &str) -> Result<RoleAccess, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--access {}: {e}", path.display()))?;
        RoleAccess::parse(&text, role).map_err(|e| format!("--access {}: {e}", path.display()))
    }

    /// The access `text` (TOML) gives role `role`.
    pub fn parse(text: &str, role: &str) -> Result<RoleAccess, String> {
        let file: AccessFile = toml::from_str(text).map_err(|e| {
            format!(
                "{} (the file holds [[token]] and [[issuer]] entries as a gateway's config does)",
                e.message()
            )
        })?;
        let mut tokens = Vec::new();
        for (i, t) in file.token.into_iter().enumerate() {
            let label = t.name.unwrap_or_else(|| format!("token #{}", i + 1));
            let Some(bytes) = hex::decode(t.sha256.trim()).ok().filter(|b| b.len() == 32) else {
                return Err(format!(
                    "{label}: sha256 must be 64 hex digits, the SHA-256 of the token (printf %s TOKEN | sha256sum)"
                ));
            };
            if !t.slugs.iter().any(|s| s == role || s == "*") {
                return Err(format!(
                    "{label}: slugs must name {role} (or \"*\") for the token to use this server; it names {:?}",
                    t.slugs
                ));
            }
            let mut sha256 = [0u8; 32];
            sha256.copy_from_slice(&bytes);
            tokens.push((sha256, label));
        }
        let configs = (file.issuer.into_iter())
            .map(IssuerFile::validate)
            .collect::<Result<Vec<_>, _>>()?;
        let issuers = match configs.is_empty() {
            true => None,
            false => Some(Arc::new(Issuers::new(configs)?)),
        };
        if tokens.is_empty() && issuers.is_none() {
            return Err(
                "it has no [[token]] and no [[issuer]], so it would let no network caller in; add one (sha256 = the output of `printf %s TOKEN | sha256sum`, slugs = [\"*\"])".into(),
            );
        }
        Ok(RoleAccess {
            role: role.to_owned(),
            tokens,
            issuers,
        })
    }

    /// Starts keeping the issuers' keys fresh (fetched now, then with rotation).
    pub fn start(&self) {
        if let Some(i) = &self.issuers {
            i.start();
        }
    }

    /// The issuers, for the status board.
    pub fn issuers(&self) -> Option<&Arc<Issuers>> {
        self.issuers.as_ref()
    }

    /// The `[[token]]` `caller` presented: its digest compared with each in constant time.
    fn token(&self, caller: &Caller) -> Option<&([u8; 32], String)> {
        let digest = caller.token_sha256()?;
        let mut found = None;
        for t in &self.tokens {
            if crate::auth::same_digest(&t.0, digest) && found.is_none() {
                found = Some(t);
            }
        }
        found
    }

    /// `caller`'s token as an access token (a JWT that is no `[[token]]`, with issuers).
    fn access_token<'a>(&'a self, caller: &'a Caller) -> Option<(&'a str, &'a Arc<Issuers>)> {
        crate::auth::access_token(caller, self.issuers.as_ref(), self.token(caller).is_some())
    }

    /// What `caller`'s access token grants, with the keys held now.
    fn grant(&self, caller: &Caller) -> Option<Grant> {
        crate::auth::grant(caller, self.issuers.as_ref(), self.token(caller).is_some())
    }

    /// Whether `grant` entitles this role: `Some(true)` for reading alone.
    fn entitles(&self, grant: &Grant) -> Option<bool> {
        let mut out: Option<bool> = None;
        for scope in &grant.scopes {
            let Some(rest) = scope.strip_prefix("herald:") else {
                continue;
            };
            let (name, read_only) = match rest.strip_suffix(":read") {
                Some(name) => (name, true),
                None => (rest, false),
            };
            if name == "*" || name == self.role {
                out = Some(out.unwrap_or(true) && read_only);
            }
        }
        out
    }

    /// Whether `caller` is let in (see the module docs).
    pub fn authenticates(&self, caller: &Caller) -> Authentication {
        if caller.local {
            return Authentication::Known;
        }
        match caller.token.as_deref() {
            None => Authentication::TokenRequired,
            Some(_) if self.token(caller).is_some() => Authentication::Known,
            Some(_)
                if self
                    .grant(caller)
                    .is_some_and(|g| self.entitles(&g).is_some()) =>
            {
                Authentication::Known
            }
            Some(_) => Authentication::UnknownToken,
        }
    }

    /// Whether `caller` may change things: local, a `[[token]]`'s holder, or an access token
    /// that verifies now with a scope for all of this role. Anything else (a read-only grant,
    /// and a token that no longer verifies: expired while its request's body was read, its
    /// key dropped) may not.
    pub fn may_write(&self, caller: &Caller) -> bool {
        caller.local
            || self.token(caller).is_some()
            || self.grant(caller).and_then(|g| self.entitles(&g)) == Some(false)
    }

    /// `Ok` while `caller` is let in now (checked again by every operation, not only when
    /// its request arrived: a webhook subscription's polls run long after, with the token it
    /// was made with); else one refusal, whatever was asked.
    fn still_known(&self, caller: &Caller) -> Result<(), SourceError> {
        match self.authenticates(caller) {
            Authentication::Known => Ok(()),
            _ => Err(SourceError::Forbidden),
        }
    }

    /// Refuses a tool that changes things to a caller that may not write: the scope that
    /// would do when it is let in (a read-only grant, so an OAuth client can step up), else
    /// the one refusal.
    fn may_call(
        &self,
        caller: &Caller,
        tool: Option<&Tool>,
        name: &str,
    ) -> Result<(), SourceError> {
        self.still_known(caller)?;
        if self.may_write(caller) || tool.is_some_and(is_read_only) {
            return Ok(());
        }
        Err(SourceError::InsufficientScope {
            slug: self.role.clone(),
            tool: name.to_owned(),
            scope: format!("herald:{}", self.role),
        })
    }
}

/// A source behind a [`RoleAccess`]. See the module docs.
pub struct Guarded<S: ?Sized> {
    access: RoleAccess,
    inner: Arc<S>,
}

impl<S: Source + ?Sized> Guarded<S> {
    pub fn new(access: RoleAccess, inner: Arc<S>) -> Guarded<S> {
        Guarded { access, inner }
    }
}

#[async_trait]
impl<S: Source + ?Sized> Source for Guarded<S> {
    async fn authenticates(&self, caller: &Caller) -> Authentication {
        // A token naming a key the set lacks (a rotation) fetches the keys once first.
        if let Some((t, issuers)) = self.access.access_token(caller) {
            let _ = issuers.verify_fresh(t).await;
        }
        self.access.authenticates(caller)
    }

    fn identity(&self, caller: &Caller) -> Option<(String, String)> {
        if let Some((sha256, label)) = self.access.token(caller) {
            return Some((hex::encode(&sha256[..16]), label.clone()));
        }
        Some(self.access.grant(caller)?.identity(caller))
    }

    fn known_as(&self, caller: &Caller) -> Option<String> {
        self.access.grant(caller)?.known_as()
    }

    fn expires_in(&self, caller: &Caller) -> Option<Duration> {
        let is_static = self.access.token(caller).is_some();
        crate::auth::expires_in(caller, self.access.issuers.as_ref(), is_static)
    }

    fn protected_resource(&self) -> Option<ProtectedResource> {
        self.access.issuers.as_ref()?.protected_resource()
    }

    fn tools(&self, caller: &Caller) -> std::borrow::Cow<'_, [Tool]> {
        let tools = self.inner.tools(caller);
        if self.access.may_write(caller) {
            return tools;
        }
        let mut tools = tools.into_owned();
        tools.retain(is_read_only);
        tools.into()
    }

    fn tool(&self, caller: &Caller, name: &str) -> Option<Tool> {
        let t = self.inner.tool(caller, name)?;
        (self.access.may_write(caller) || is_read_only(&t)).then_some(t)
    }

    async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<CallToolResponse, SourceError> {
        let tool = self.inner.tool(caller, name);
        self.access.may_call(caller, tool.as_ref(), name)?;
        self.inner.call_tool(caller, name, args, call).await
    }

    async fn before_task(
        &self,
        caller: &Caller,
        name: &str,
        args: &JsonObject,
        call: &Call,
    ) -> Result<Option<InputRequiredResult>, SourceError> {
        let tool = self.inner.tool(caller, name);
        self.access.may_call(caller, tool.as_ref(), name)?;
        self.inner.before_task(caller, name, args, call).await
    }

    // The rest is the source's own.

    fn info(&self) -> SourceInfo {
        self.inner.info()
    }

    fn resources(&self, caller: &Caller) -> Vec<Resource> {
        self.inner.resources(caller)
    }

    fn templates(&self, caller: &Caller) -> Vec<ResourceTemplate> {
        self.inner.templates(caller)
    }

    async fn read(&self, caller: &Caller, read: Read<'_>) -> Result<Contents, SourceError> {
        self.access.still_known(caller)?;
        self.inner.read(caller, read).await
    }

    async fn admit(&self, caller: &Caller, filter: &ListenFilter) -> Admission {
        if let Err(e) = self.access.still_known(caller) {
            let mut refused = Admission::default();
            for uri in filter.uris() {
                refused.refuse(&uri, e.clone());
            }
            return refused;
        }
        self.inner.admit(caller, filter).await
    }

    fn changes(&self) -> ChangeFeed {
        self.inner.changes()
    }

    fn prompts(&self, caller: &Caller) -> Vec<Prompt> {
        self.inner.prompts(caller)
    }

    async fn get_prompt(
        &self,
        caller: &Caller,
        name: &str,
        args: JsonObject,
        call: Call,
    ) -> Result<GetPromptResponse, SourceError> {
        self.access.still_known(caller)?;
        self.inner.get_prompt(caller, name, args, call).await
    }

    async fn complete(
        &self,
        caller: &Caller,
        request: CompleteRequestParams,
    ) -> Result<CompleteResult, SourceError> {
        self.access.still_known(caller)?;
        self.inner.complete(caller, request).await
    }

    fn task_support(&self, caller: &Caller, name: &str) -> crate::mcp::tasks::TaskSupport {
        self.inner.task_support(caller, name)
    }

    fn task_relay(&self) -> Option<Arc<dyn crate::mcp::tasks::relaying::TaskRelay>> {
        self.inner.task_relay()
    }

    fn webhook_receiver(&self) -> Option<Arc<dyn crate::mcp::server::webhooks::Receiver>> {
        self.inner.webhook_receiver()
    }

    async fn events_advertised(&self, caller: &Caller) -> bool {
        self.inner.events_advertised(caller).await
    }

    async fn events_list(&self, caller: &Caller) -> Result<Vec<Value>, SourceError> {
        self.access.still_known(caller)?;
        self.inner.events_list(caller).await
    }

    async fn events_poll(&self, caller: &Caller, params: JsonObject) -> Result<Value, SourceError> {
        self.access.still_known(caller)?;
        self.inner.events_poll(caller, params).await
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
