//! What a server's webhook subscriptions are configured with: `[events]` and its flags, the
//! error-code profile, and the deployment's events key (`HERALD_EVENTS_KEY`).

use rmcp::model::ErrorCode;

use super::deliver::CallbackPolicy;

/// The variable (or credentials file) holding the key webhook subscriptions are sealed under.
pub const KEY_VAR: &str = "HERALD_EVENTS_KEY";

/// Which error codes the Events errors carry: the draft's (SEP-3415, -32023…-32027) or the
/// earlier sketch's that ChatGPT-facing servers use (-32011…-32015).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    #[default]
    Draft,
    Chatgpt,
}

impl Profile {
    pub(super) fn code(self, draft: i32) -> ErrorCode {
        match self {
            Profile::Draft => ErrorCode(draft),
            Profile::Chatgpt => ErrorCode(draft + 12),
        }
    }
}

/// What a server's webhook subscriptions are configured with (its `Debug` leaves the key
/// out).
#[derive(Clone)]
pub struct HookSettings {
    /// The sealing key (32 bytes).
    pub key: [u8; 32],
    pub policy: CallbackPolicy,
    pub profile: Profile,
    /// The store key prefix (the role's name).
    pub role: String,
}

/// What the flags and config (`[events]`) say of webhook subscriptions; the key comes from
/// the environment ([`EventsOptions::settings`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsOptions {
    /// URL prefixes a callback may start with to reach a private address or plain http.
    pub callback_allow: Vec<String>,
    pub profile: Profile,
    /// Where slugs that deliver events only by webhook POST them to the gateway
    /// (`{receiver_url}/{id}`); the gateway's own `--http` address when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receiver_url: Option<String>,
}

impl EventsOptions {
    /// The settings of `role`'s webhook subscriptions: `None` without a key (they are off),
    /// an error naming the variable when the key is malformed.
    pub fn settings(&self, role: &str) -> Result<Option<HookSettings>, String> {
        Ok(events_key()?.map(|key| HookSettings {
            key,
            policy: CallbackPolicy {
                allow: self.callback_allow.clone(),
            },
            profile: self.profile,
            role: role.to_owned(),
        }))
    }
}

/// The deployment's events key, `HERALD_EVENTS_KEY` (or `$CREDENTIALS_DIRECTORY/
/// HERALD_EVENTS_KEY`): what seals webhook subscriptions and the event logs published on
/// NATS. `None` when unset; an error naming the variable when malformed. The variable is
/// never passed on to a child (a stdio upstream, a helper command).
pub fn events_key() -> Result<Option<[u8; 32]>, String> {
    crate::runtime::secrets::register(KEY_VAR);
    key_from(
        &|n| std::env::var(n).ok(),
        std::env::var_os("CREDENTIALS_DIRECTORY").map(std::path::PathBuf::from),
    )
}

/// `HERALD_EVENTS_KEY` from the environment, or the file of that name in `dir` (systemd's
/// credentials): 32 bytes, base64 or hex. Never shown in an error.
fn key_from(
    lookup: &dyn Fn(&str) -> Option<String>,
    dir: Option<std::path::PathBuf>,
) -> Result<Option<[u8; 32]>, String> {
    let raw = match lookup(KEY_VAR)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
    {
        Some(v) => v,
        None => match dir.map(|d| d.join(KEY_VAR)) {
            Some(path) => match std::fs::read_to_string(&path) {
                Ok(v) if !v.trim().is_empty() => v.trim().to_owned(),
                Ok(_) => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => {
                    return Err(format!(
                        "cannot read {KEY_VAR} from {}: {}",
                        path.display(),
                        e.kind()
                    ));
                }
            },
            None => return Ok(None),
        },
    };
    crate::store::seal::decode_key(&raw)
        .map(Some)
        .map_err(|why| {
            format!(
                "{KEY_VAR} must be 32 bytes, base64 or hex (make one with `openssl rand -base64 32`); {why}"
            )
        })
}

impl std::fmt::Debug for HookSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookSettings")
            .field("policy", &self.policy)
            .field("profile", &self.profile)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_key_never_reaches_a_child() {
        let _ = EventsOptions::default().settings("test");
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "printf %s \"${HERALD_EVENTS_KEY-unset}\""])
            .env(KEY_VAR, "k");
        let out = crate::runtime::secrets::scrub(&mut cmd)
            .output()
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "unset");
    }

    #[test]
    fn profiles_number_the_errors() {
        assert_eq!(Profile::Draft.code(-32027), ErrorCode(-32027));
        assert_eq!(Profile::Chatgpt.code(-32027), ErrorCode(-32015));
        assert_eq!(Profile::Chatgpt.code(-32023), ErrorCode(-32011));
    }
}
