//! The Slack role's settings: four variables, each from the environment or, when unset there,
//! from a file of the same name in a credentials directory (`--credentials DIR`, or systemd's
//! `$CREDENTIALS_DIRECTORY`), so secrets never need to sit in a unit file. Values are checked
//! here, and no message ever contains one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::transport::tls::Secret;

/// The app-level token (`xapp-…`, scope `connections:write`): opens Socket Mode connections.
pub const APP_TOKEN: &str = "SLACK_APP_TOKEN";
/// The bot token (`xoxb-…`): the Web API (history, replies, posting).
pub const BOT_TOKEN: &str = "SLACK_BOT_TOKEN";
/// 32 random bytes, base64 or hex: seals the buffer.
pub const ENCRYPTION_KEY: &str = "SLACK_EVENTS_ENCRYPTION_KEY";
/// Days the buffer keeps a message (default 7, at most 30).
pub const RETENTION_DAYS: &str = "SLACK_EVENTS_RETENTION_DAYS";

pub const DEFAULT_RETENTION_DAYS: u64 = 7;
pub const MAX_RETENTION_DAYS: u64 = 30;

/// The three variables the event feed needs, in the order they are named when missing.
pub const REQUIRED: [&str; 3] = [APP_TOKEN, BOT_TOKEN, ENCRYPTION_KEY];

/// The buffer's AES-256 key. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(pub [u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

/// What the role was given.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub app_token: Option<Secret>,
    pub bot_token: Option<Secret>,
    pub key: Option<Key>,
    pub retention: Duration,
}

/// Everything the event feed needs, present.
#[derive(Debug, Clone)]
pub struct Configured {
    pub app_token: Secret,
    pub bot_token: Secret,
    pub key: Key,
    pub retention: Duration,
}

/// A variable that is set but wrong. Names the variable and what is wrong, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("{name} does not start with {prefix}; use the {what} from the Slack app's settings")]
    Prefix {
        name: &'static str,
        prefix: &'static str,
        what: &'static str,
    },
    #[error(
        "{ENCRYPTION_KEY} must be 32 bytes, base64 or hex (make one with `openssl rand -base64 32`); {why}"
    )]
    Key { why: String },
    #[error("{RETENTION_DAYS} must be a whole number of days from 1 to {MAX_RETENTION_DAYS}")]
    Retention,
    #[error("cannot read {name} from {}: {message}", path.display())]
    Read {
        name: &'static str,
        path: PathBuf,
        message: String,
    },
}

/// Where a value came from: `lookup` (the environment) first, then `dir/NAME`. Blank counts
/// as unset; surrounding whitespace (a file's trailing newline) is dropped.
fn value(
    name: &'static str,
    lookup: &dyn Fn(&str) -> Option<String>,
    dir: Option<&Path>,
) -> Result<Option<String>, SettingsError> {
    if let Some(v) = lookup(name).map(|v| v.trim().to_owned())
        && !v.is_empty()
    {
        return Ok(Some(v));
    }
    let Some(dir) = dir else { return Ok(None) };
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(v) => Ok(Some(v.trim().to_owned()).filter(|v| !v.is_empty())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SettingsError::Read {
            name,
            path,
            message: e.kind().to_string(),
        }),
    }
}

fn token(
    name: &'static str,
    prefix: &'static str,
    what: &'static str,
    v: Option<String>,
) -> Result<Option<Secret>, SettingsError> {
    match v {
        None => Ok(None),
        // Rotating tokens carry `xoxe.` in front of the usual prefix.
        Some(v)
            if v.starts_with(prefix)
                || v.strip_prefix("xoxe.")
                    .is_some_and(|r| r.starts_with(prefix)) =>
        {
            Ok(Some(Secret(v)))
        }
        Some(_) => Err(SettingsError::Prefix { name, prefix, what }),
    }
}

/// Decodes a 32-byte key from hex (64 digits) or base64 (standard or URL-safe, padded or
/// not).
pub fn parse_key(text: &str) -> Result<Key, SettingsError> {
    crate::store::seal::decode_key(text)
        .map(Key)
        .map_err(|why| SettingsError::Key { why })
}

impl Settings {
    /// Reads the four variables: each from `lookup` (the environment), else from a file of
    /// its name in `credentials`.
    pub fn load(
        lookup: &dyn Fn(&str) -> Option<String>,
        credentials: Option<&Path>,
    ) -> Result<Settings, SettingsError> {
        let app_token = token(
            APP_TOKEN,
            "xapp-",
            "app-level token",
            value(APP_TOKEN, lookup, credentials)?,
        )?;
        let bot_token = token(
            BOT_TOKEN,
            "xoxb-",
            "bot token",
            value(BOT_TOKEN, lookup, credentials)?,
        )?;
        let key = value(ENCRYPTION_KEY, lookup, credentials)?
            .map(|k| parse_key(&k))
            .transpose()?;
        let days = match value(RETENTION_DAYS, lookup, credentials)? {
            None => DEFAULT_RETENTION_DAYS,
            Some(d) => match d.parse::<u64>() {
                Ok(n) if (1..=MAX_RETENTION_DAYS).contains(&n) => n,
                _ => return Err(SettingsError::Retention),
            },
        };
        Ok(Settings {
            app_token,
            bot_token,
            key,
            retention: Duration::from_secs(days * 86_400),
        })
    }

    /// From the process environment and `credentials`.
    pub fn from_env(credentials: Option<&Path>) -> Result<Settings, SettingsError> {
        Settings::load(&|name| std::env::var(name).ok(), credentials)
    }

    /// The names (never the values) of the required variables that are not set.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.app_token.is_none() {
            out.push(APP_TOKEN);
        }
        if self.bot_token.is_none() {
            out.push(BOT_TOKEN);
        }
        if self.key.is_none() {
            out.push(ENCRYPTION_KEY);
        }
        out
    }

    /// Everything the event feed needs, when all of it is there.
    pub fn configured(&self) -> Option<Configured> {
        Some(Configured {
            app_token: self.app_token.clone()?,
            bot_token: self.bot_token.clone()?,
            key: self.key.clone()?,
            retention: self.retention,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    const HEX_KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn nothing_set_is_not_configured_and_names_all_three() {
        let s = Settings::load(&env(&[]), None).unwrap();
        assert!(s.configured().is_none());
        assert_eq!(s.missing(), vec![APP_TOKEN, BOT_TOKEN, ENCRYPTION_KEY]);
        assert_eq!(s.retention, Duration::from_secs(7 * 86_400));
    }

    #[test]
    fn keys_are_hex_or_base64_of_32_bytes() {
        let k = parse_key(HEX_KEY).unwrap();
        assert_eq!(k.0[31], 31);
        let b64 = base64::engine::general_purpose::STANDARD.encode(k.0);
        assert_eq!(parse_key(&b64).unwrap(), k);
        assert_eq!(parse_key(b64.trim_end_matches('=')).unwrap(), k);
        let e = parse_key("c2hvcnQ=").unwrap_err().to_string();
        assert!(e.contains("decodes to 5 bytes"), "{e}");
        assert!(!e.contains("c2hvcnQ"), "the value never appears: {e}");
        assert!(parse_key("not a key!").is_err());
    }

    #[test]
    fn wrong_prefixes_and_retention_are_refused_without_the_value() {
        let e = Settings::load(&env(&[(APP_TOKEN, "xoxb-secret-value")]), None).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("SLACK_APP_TOKEN") && text.contains("xapp-"),
            "{text}"
        );
        assert!(!text.contains("secret-value"), "{text}");
        for bad in ["0", "31", "seven"] {
            let e = Settings::load(&env(&[(RETENTION_DAYS, bad)]), None).unwrap_err();
            assert_eq!(e, SettingsError::Retention);
        }
        let s = Settings::load(&env(&[(RETENTION_DAYS, "30")]), None).unwrap();
        assert_eq!(s.retention, Duration::from_secs(30 * 86_400));
    }

    #[test]
    fn a_credentials_directory_fills_what_the_environment_lacks() {
        let dir = std::env::temp_dir().join(format!("herald-slack-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(BOT_TOKEN), "xoxb-from-file\n").unwrap();
        std::fs::write(dir.join(ENCRYPTION_KEY), format!("{HEX_KEY}\n")).unwrap();
        std::fs::write(dir.join(APP_TOKEN), "xapp-from-file").unwrap();
        let s = Settings::load(&env(&[(APP_TOKEN, "xapp-from-env")]), Some(&dir)).unwrap();
        let c = s.configured().expect("all three present");
        assert_eq!(c.app_token.0, "xapp-from-env", "the environment wins");
        assert_eq!(c.bot_token.0, "xoxb-from-file", "trailing newline dropped");
        assert_eq!(c.key, parse_key(HEX_KEY).unwrap());
        assert!(!format!("{c:?}").contains("from-file"), "Debug redacts");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
