//! The appliance's config: one TOML file names the roles `herald up` runs in its one process
//! (`[memo]`, `[file]`, `[k8s]`, `[slack]`), the external servers beside them (`[[slug]]`),
//! who may use what (`[[token]]`), the watches (`[[watch]]`, notices to `[notify]`), and where
//! the gateway in front of all of them listens (`[listen]`).
//!
//! ```toml
//! [listen]
//! http = "127.0.0.1:8750"
//! quic = "127.0.0.1:8751"
//!
//! [memo]
//!
//! [file]
//! roots = ["/srv/data"]
//!
//! [[slug]]
//! name = "cluster"
//! http = "http://10.0.0.5:8753/mcp"
//!
//! [[watch]]
//! name = "notes"
//! uri = "memo://notes"
//! ```
//!
//! Every table is strict: an unknown key is an error that names its line.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};

use crate::cli::file::FileToml;
pub use crate::cli::k8s::K8sToml;
pub use crate::cli::memo::MemoToml;
use crate::cli::slack::SlackToml;
use crate::gateway::config::{GatewayConfig, Slug, SlugFile, Token, TokenFile};

/// Where the gateway serves HTTP by default.
pub const DEFAULT_HTTP: &str = "127.0.0.1:8750";
/// Where it serves QUIC by default.
pub const DEFAULT_QUIC: &str = "127.0.0.1:8751";

/// The roles `herald up` can run in its own process; each is a slug of that name.
pub const ROLES: [&str; 4] = ["memo", "file", "k8s", "slack"];

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenToml {
    /// `""` turns HTTP off.
    pub http: Option<String>,
    /// `""` turns QUIC off.
    pub quic: Option<String>,
    /// The admin address (`/live`, `/ready`, `/metrics`, `/status`); `""` turns it off.
    pub admin: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_origins: Vec<String>,
    /// Reverse proxies whose forwarded client address counts (`--trusted-proxy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxies: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WatchToml {
    pub name: String,
    pub uri: String,
    /// Python run once per event (inline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_event: Option<String>,
    /// Python run once per event, from this file (relative to the config).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_event_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyToml {
    /// Run this (with `sh -c`) per notice, the notice on its stdin.
    pub exec: Option<String>,
    /// POST each notice to this URL.
    pub webhook: Option<String>,
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpToml {
    #[serde(default)]
    pub listen: ListenToml,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memo: Option<MemoToml>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<FileToml>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s: Option<K8sToml>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slack: Option<SlackToml>,
    #[serde(default, rename = "slug", skip_serializing_if = "Vec::is_empty")]
    pub slugs: Vec<SlugFile>,
    #[serde(default, rename = "token", skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<TokenFile>,
    #[serde(default, rename = "issuer", skip_serializing_if = "Vec::is_empty")]
    pub issuers: Vec<crate::auth::issuer::IssuerFile>,
    #[serde(default, rename = "watch", skip_serializing_if = "Vec::is_empty")]
    pub watches: Vec<WatchToml>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notify: Option<NotifyToml>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish: Option<PublishToml>,
    /// `[events]`: webhook subscriptions' callback allowlist and error codes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<crate::hooks::EventsOptions>,
}

/// `[publish]`: every event log of the roles here, published to NATS for gateways elsewhere
/// (as a role's `--publish-events`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PublishToml {
    /// `nats://HOST:PORT[,…]`.
    pub nats: String,
    /// The name they are published under (a gateway slug's `nats_source`); default: this
    /// host's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_creds: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nats_tls_ca: Option<PathBuf>,
    /// In the clear (as `--publish-plaintext`); else sealed with `HERALD_EVENTS_KEY`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plaintext: bool,
}

impl PublishToml {
    /// As `--publish-events`, `--publish-as`, `--publish-creds`, `--publish-tls-ca`.
    pub fn args(&self) -> crate::cli::serve::PublishArgs {
        crate::cli::serve::PublishArgs {
            publish_events: Some(self.nats.clone()),
            publish_as: Some(self.name.clone().unwrap_or_else(host_name)),
            publish_creds: self.nats_creds.clone(),
            publish_tls_ca: self.nats_tls_ca.clone(),
            publish_plaintext: self.plaintext,
        }
    }
}

/// This host's name as a publisher name: letters, digits, `_` and `-` (others become `-`).
fn host_name() -> String {
    let h: String = crate::nats::hostname()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if h.is_empty() { "herald".into() } else { h }
}

/// A checked config, ready to run.
#[derive(Debug, Clone)]
pub struct UpConfig {
    /// As written, with every default filled in (`--print-config`).
    pub file: UpToml,
    pub slugs: Vec<Slug>,
    pub tokens: Vec<Token>,
    /// `[[issuer]]`s: identity providers whose access tokens are taken.
    pub issuers: Vec<crate::auth::issuer::IssuerConfig>,
    /// `(name, uri, python)` per watch.
    pub watches: Vec<(String, String, Option<String>)>,
    /// The admin address is the default, not one the config or a flag chose: when it is
    /// taken (another herald on this host), the appliance warns and runs without it.
    pub admin_defaulted: bool,
}

pub use crate::transport::is_loopback;

impl UpToml {
    /// The demo with no config: memo, the files of `demo_dir`, Slack (inert until its
    /// variables are set), and watches on them.
    pub fn demo(demo_dir: &Path) -> UpToml {
        UpToml {
            memo: Some(MemoToml::default()),
            file: Some(FileToml {
                roots: vec![demo_dir.to_owned()],
                ..FileToml::default()
            }),
            slack: Some(SlackToml::default()),
            watches: vec![
                // One of memo's two views, or every change would be announced twice; the
                // notes' diff reads as the change (`MODIFIED todo: "buy milk" → 1`).
                watch("notes", crate::source::memo::NOTES_URI),
                watch(
                    "demo-files",
                    &crate::source::file::events_uri(demo_dir, true),
                ),
            ],
            ..UpToml::default()
        }
    }

    /// Parses a config file's text. `base` is where relative paths start (the file's
    /// directory).
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<UpToml> {
        let mut t: UpToml = toml::from_str(text)
            .map_err(|e| anyhow!("{}", crate::gateway::config::toml_message(text, &e)))?;
        if let Some(f) = &mut t.file {
            for r in &mut f.roots {
                if r.is_relative() {
                    *r = base.join(&*r);
                }
            }
        }
        if let Some(s) = &mut t.slack {
            s.resolve(base);
        }
        if let Some(p) = &mut t.publish {
            for f in [&mut p.nats_creds, &mut p.nats_tls_ca]
                .into_iter()
                .flatten()
            {
                if f.is_relative() {
                    *f = base.join(&*f);
                }
            }
        }
        if let Some(m) = &mut t.memo {
            m.nats.resolve(base);
        }
        for w in &mut t.watches {
            if let Some(p) = &mut w.on_event_file
                && p.is_relative()
            {
                *p = base.join(&*p);
            }
        }
        Ok(t)
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> anyhow::Result<UpToml> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        UpToml::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("bad config {}", path.display()))
    }

    /// The roles this config runs in-process, in a fixed order.
    pub fn roles(&self) -> Vec<&'static str> {
        let on = [
            self.memo.is_some(),
            self.file.is_some(),
            self.k8s.is_some(),
            self.slack.is_some(),
        ];
        ROLES
            .iter()
            .zip(on)
            .filter(|(_, on)| *on)
            .map(|(r, _)| *r)
            .collect()
    }

    /// Checks everything that can be checked without starting anything.
    pub fn check(self) -> anyhow::Result<UpConfig> {
        let roles = self.roles();
        let (slugs, tokens) =
            GatewayConfig::validate(self.slugs.clone(), self.tokens.clone(), &roles)
                .map_err(|e| anyhow!("{e}"))?;
        let issuers = crate::gateway::config::validate_issuers(self.issuers.clone())
            .map_err(|e| anyhow!("{e}"))?;
        if roles.is_empty() && slugs.is_empty() {
            bail!("nothing to serve: add a role ([memo], [file], [k8s], [slack]) or a [[slug]]");
        }
        if let Some(f) = &self.file {
            f.to_config().context("[file]")?;
        }
        if let Some(k) = &self.k8s {
            k.via()?;
        }
        if let Some(n) = self.memo.as_ref().and_then(MemoToml::nats) {
            n.check().map_err(|e| {
                anyhow!(
                    "[memo]: {}",
                    e.replace("--backend", "backend")
                        .replace("--nats-", "nats_")
                )
            })?;
        }
        if let Some(p) = &self.publish {
            let args = p.args();
            let cfg = crate::nats::NatsConfig {
                urls: p.nats.clone(),
                creds: p.nats_creds.clone(),
                nkey: None,
                tls_ca: p.nats_tls_ca.clone(),
                bucket: crate::nats::events::BUCKET.into(),
            };
            cfg.check().map_err(|e| {
                anyhow!(
                    "[publish]: {}",
                    e.replace("--backend", "nats").replace("--nats-", "nats_")
                )
            })?;
            let name = args.publish_as.unwrap_or_default();
            if !crate::nats::events::valid_name(&name) {
                bail!("[publish]: name {name:?}: use letters, digits, '_' and '-'");
            }
        }
        if let Some(s) = &self.slack {
            s.shared().map_err(|e| {
                anyhow!(
                    "[slack]: {}",
                    e.to_string()
                        .replace("--backend", "backend")
                        .replace("--nats-", "nats_")
                )
            })?;
        }
        let mut t = self;
        let admin_defaulted = t.listen.admin.is_none();
        t.listen.http.get_or_insert_with(|| DEFAULT_HTTP.to_owned());
        t.listen.quic.get_or_insert_with(|| DEFAULT_QUIC.to_owned());
        t.listen
            .admin
            .get_or_insert_with(|| crate::app::admin::DEFAULT_ADMIN.to_owned());
        for proxy in &t.listen.trusted_proxies {
            crate::transport::http::budget::trusted_proxy(proxy)
                .map_err(|e| anyhow::anyhow!("[listen] trusted_proxies: {e}"))?;
        }
        let tokenless = tokens.is_empty() && issuers.is_empty();
        if tokenless && (!t.listen.allowed_hosts.is_empty() || !t.listen.allowed_origins.is_empty())
        {
            bail!(
                "[listen] allowed_hosts or allowed_origins with no [[token]]: they exist for callers through a proxy or another name, who would then use every role without a token. \
                 Add a [[token]] (sha256 = the output of `printf %s TOKEN | sha256sum`, slugs = [\"*\"])"
            );
        }
        if tokenless {
            for addr in [&t.listen.http, &t.listen.quic]
                .into_iter()
                .filter_map(crate::transport::listen_addr)
            {
                if !is_loopback(addr) {
                    bail!(
                        "[listen] {addr} is not a loopback address and there is no [[token]]: anyone who can reach it could use every role. \
                         Add a [[token]] (sha256 = the output of `printf %s TOKEN | sha256sum`, slugs = [\"*\"]) or listen on 127.0.0.1"
                    );
                }
            }
        }
        let mut names = std::collections::BTreeSet::new();
        let mut watches = Vec::new();
        for w in &t.watches {
            if w.name.is_empty() || w.uri.is_empty() {
                bail!("a [[watch]] needs a name and a uri");
            }
            if !names.insert(w.name.clone()) {
                bail!("[[watch]] {} is defined twice", w.name);
            }
            let code = match (&w.on_event, &w.on_event_file) {
                (Some(_), Some(_)) => bail!(
                    "[[watch]] {}: give on_event (inline Python) or on_event_file, not both",
                    w.name
                ),
                (Some(c), None) => Some(c.clone()),
                (None, Some(p)) => Some(std::fs::read_to_string(p).with_context(|| {
                    format!(
                        "[[watch]] {}: cannot read on_event_file {}",
                        w.name,
                        p.display()
                    )
                })?),
                (None, None) => None,
            };
            watches.push((w.name.clone(), w.uri.clone(), code));
        }
        if let Some(n) = &t.notify
            && n.exec.is_some()
            && n.webhook.is_some()
        {
            bail!("[notify]: give exec or webhook, not both");
        }
        t.memo = t.memo.map(MemoToml::with_defaults);
        t.file = t.file.map(FileToml::with_defaults);
        t.k8s = t.k8s.map(K8sToml::with_defaults);
        t.slack = t.slack.map(SlackToml::with_defaults);
        Ok(UpConfig {
            file: t,
            slugs,
            tokens,
            issuers,
            watches,
            admin_defaulted,
        })
    }
}

impl UpConfig {
    /// No `[[token]]` nor `[[issuer]]`: callers on this host need no token (and the
    /// appliance listens on loopback only).
    pub fn tokenless(&self) -> bool {
        self.tokens.is_empty() && self.issuers.is_empty()
    }

    /// The `[[watch]]`es as the watch client takes them.
    pub fn watch_specs(&self) -> Vec<crate::watch::WatchSpec> {
        self.watches
            .iter()
            .map(|(name, uri, on_event)| crate::watch::WatchSpec {
                name: name.clone(),
                uri: uri.clone(),
                on_event: on_event.clone(),
            })
            .collect()
    }
}

fn watch(name: &str, uri: &str) -> WatchToml {
    WatchToml {
        name: name.into(),
        uri: uri.into(),
        on_event: None,
        on_event_file: None,
    }
}

impl UpConfig {
    /// Where the gateway serves HTTP, if it does.
    pub fn http(&self) -> Option<&str> {
        crate::transport::listen_addr(&self.file.listen.http)
    }

    /// The trusted proxies (`None`: the default, this host), checked at load.
    pub fn trusted_proxies(&self) -> Option<Vec<crate::transport::http::budget::Cidr>> {
        let listed: Vec<_> = (self.file.listen.trusted_proxies.iter())
            .filter_map(|c| crate::transport::http::budget::trusted_proxy(c).ok())
            .collect();
        crate::transport::http::budget::trusted_proxies(&listed)
    }

    /// Where the gateway serves QUIC, if it does.
    pub fn quic(&self) -> Option<&str> {
        crate::transport::listen_addr(&self.file.listen.quic)
    }

    /// Where the admin address is served, if it is.
    pub fn admin(&self) -> Option<&str> {
        crate::transport::listen_addr(&self.file.listen.admin)
    }

    /// The effective config as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(&self.file).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn parse(text: &str) -> anyhow::Result<UpConfig> {
        UpToml::parse(text, Path::new("/etc/herald"))?.check()
    }

    #[test]
    fn a_full_config_checks_and_prints_its_defaults() {
        let c = parse(&format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\n\
             [memo]\n[file]\nroots = [\"data\"]\n\
             [[slug]]\nname = \"ext\"\nstdio = \"herald memo\"\n\
             [[token]]\nsha256 = \"{HASH}\"\nslugs = [\"memo\", \"ext\"]\n\
             [[watch]]\nname = \"n\"\nuri = \"memo://notes\"\non_event = \"emit(event)\"\n"
        ))
        .unwrap();
        assert_eq!(c.http(), Some("127.0.0.1:0"));
        assert_eq!(c.quic(), None, "\"\" turns QUIC off");
        assert_eq!(c.file.roles(), ["memo", "file"]);
        assert_eq!(c.slugs[0].name, "ext");
        assert_eq!(
            c.tokens[0].slugs.iter().collect::<Vec<_>>(),
            ["ext", "memo"]
        );
        assert_eq!(c.watches[0].2.as_deref(), Some("emit(event)"));
        let printed = c.to_toml();
        assert!(printed.contains("debounce_ms = 50"), "{printed}");
        assert!(
            printed.contains("roots = [\"/etc/herald/data\"]"),
            "{printed}"
        );
        // What --print-config prints is itself a valid config.
        parse(&printed).unwrap();
    }

    #[test]
    fn memo_on_nats_is_checked() {
        let c = parse("[memo]\nbackend = \"nats://127.0.0.1:4222\"\n").unwrap();
        let n = c.file.memo.as_ref().unwrap().nats().unwrap();
        assert_eq!(n.bucket, "herald_memo");
        assert!(c.to_toml().contains("backend = \"nats://127.0.0.1:4222\""));
        let e = format!(
            "{:#}",
            parse("[memo]\nbackend = \"redis://x\"\n").unwrap_err()
        );
        assert!(
            e.contains("[memo]") && e.contains("nats://HOST:PORT"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            parse("[memo]\nbackend = \"nats://a:1\"\nnats_creds = \"nope.creds\"\n").unwrap_err()
        );
        assert!(e.contains("nats_creds /etc/herald/nope.creds"), "{e}");
    }

    #[test]
    fn publish_is_checked() {
        let c = parse(
            "[memo]\n[publish]\nnats = \"nats://127.0.0.1:4222\"\nname = \"site-a\"\nnats_creds = \"p.creds\"\n",
        );
        let e = format!("{:#}", c.unwrap_err());
        assert!(
            e.contains("[publish]") && e.contains("nats_creds /etc/herald/p.creds"),
            "{e}"
        );
        let c = parse("[memo]\n[publish]\nnats = \"nats://127.0.0.1:4222\"\n").unwrap();
        let args = c.file.publish.as_ref().unwrap().args();
        assert!(
            args.publish_as
                .is_some_and(|n| crate::nats::events::valid_name(&n))
        );
        let e = format!(
            "{:#}",
            parse("[memo]\n[publish]\nnats = \"x\"\n").unwrap_err()
        );
        assert!(
            e.contains("[publish]") && e.contains("nats://HOST:PORT"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            parse("[memo]\n[publish]\nnats = \"nats://a:1\"\nname = \"a.b\"\n").unwrap_err()
        );
        assert!(e.contains("[publish]: name"), "{e}");
    }

    #[test]
    fn slack_on_nats_is_checked() {
        let c = parse("[slack]\nbackend = \"nats://127.0.0.1:4222\"\nlease_stale_ms = 9000\nlease_heartbeat_ms = 3000\n").unwrap();
        let s = c.file.slack.as_ref().unwrap().shared().unwrap().unwrap();
        assert_eq!(s.nats.bucket, "herald_slack");
        assert_eq!(s.stale, std::time::Duration::from_secs(9));
        for (bad, says) in [
            ("backend = \"redis://x\"", "nats://HOST:PORT"),
            (
                "backend = \"nats://a:1\"\nnats_nkey = \"seed.nk\"",
                "nats_nkey /etc/herald/seed.nk",
            ),
            (
                "backend = \"nats://a:1\"\nnats_bucket = \"no spaces\"",
                "bucket name",
            ),
            (
                "backend = \"nats://a:1\"\nlease_stale_ms = 89999",
                "must be at least three times --lease-heartbeat-ms",
            ),
        ] {
            let e = format!("{:#}", parse(&format!("[slack]\n{bad}\n")).unwrap_err());
            assert!(e.contains("[slack]") && e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn k8s_watch_via_is_checked_and_defaulted() {
        let c = parse("[k8s]\n").unwrap();
        assert!(
            c.to_toml().contains("watch_via = \"api\""),
            "{}",
            c.to_toml()
        );
        parse("[k8s]\nwatch_via = \"kubectl\"\n").unwrap();
        let e = format!("{:#}", parse("[k8s]\nwatch_via = \"ssh\"\n").unwrap_err());
        assert!(e.contains("watch_via") && e.contains("\"kubectl\""), "{e}");
    }

    #[test]
    fn an_unknown_key_names_its_line() {
        let e = format!(
            "{:#}",
            parse("[memo]\n\n[file]\nroots = [\"/x\"]\ncolour = 1\n").unwrap_err()
        );
        assert!(e.contains("line 5"), "{e}");
        assert!(e.contains("unknown field `colour`"), "{e}");
        // The line itself is never quoted: it may hold a secret.
        let e = format!(
            "{:#}",
            parse("[slack]\nbot_token = \"xoxb-s3cret\"\n").unwrap_err()
        );
        assert!(e.contains("line 2") && !e.contains("s3cret"), "{e}");
    }

    /// Found by `fuzz_up_config_mutated_structure`: a string where a table belongs was
    /// refused with the string quoted (`invalid type: string "…", expected …`).
    #[test]
    fn a_value_in_the_wrong_place_is_not_quoted() {
        for (text, needle) in [
            (
                "slug = \"s3cret-a\"\n[memo]\n",
                "line 1: slug: expected an array, found a string",
            ),
            (
                "[listen]\nhttp = [\"s3cret-b\"]\n[memo]\n",
                "line 2: http: expected a string, found an array",
            ),
            (
                "[memo]\n[[watch]]\nname = \"n\"\nuri = \"memo://notes\"\non_event = 5\n",
                "line 5: on_event: expected a string, found an integer",
            ),
            (
                "slack = \"s3cret-c\"\n",
                "line 1: slack: expected a table, found a string",
            ),
        ] {
            let e = format!("{:#}", parse(text).unwrap_err());
            assert!(e.contains(needle) && !e.contains("s3cret"), "{text}: {e}");
        }
    }

    #[test]
    fn no_token_is_refused_off_loopback_only() {
        parse("[listen]\nhttp = \"127.0.0.1:8750\"\nquic = \"[::1]:8751\"\n[memo]\n").unwrap();
        parse("[listen]\nhttp = \"localhost:8750\"\n[memo]\n").unwrap();
        let e = parse("[listen]\nhttp = \"0.0.0.0:8750\"\n[memo]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.0.0.0:8750") && e.contains("[[token]]"), "{e}");
        let e = parse("[listen]\nallowed_hosts = [\"mcp.example.com\"]\n[memo]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("allowed_hosts") && e.contains("[[token]]"),
            "{e}"
        );
        parse(&format!(
            "[listen]\nhttp = \"0.0.0.0:8750\"\n[memo]\n[[token]]\nsha256 = \"{HASH}\"\nslugs = [\"*\"]\n"
        ))
        .unwrap();
    }

    #[test]
    fn mistakes_say_what_to_fix() {
        for (text, needle) in [
            ("", "nothing to serve"),
            (
                "[memo]\n[[slug]]\nname = \"memo\"\nstdio = \"x\"\n",
                "name of a role",
            ),
            (
                &format!("[memo]\n[[token]]\nsha256 = \"{HASH}\"\nslugs = [\"file\"]\n"),
                "not a [[slug]]",
            ),
            ("[file]\n", "no roots"),
            (
                "[memo]\n[[watch]]\nname = \"a\"\nuri = \"memo://notes\"\n[[watch]]\nname = \"a\"\nuri = \"memo://log\"\n",
                "defined twice",
            ),
            (
                "[memo]\n[[watch]]\nname = \"a\"\nuri = \"memo://notes\"\non_event_file = \"nope.py\"\n",
                "cannot read on_event_file /etc/herald/nope.py",
            ),
            (
                "[memo]\n[notify]\nexec = \"cat\"\nwebhook = \"http://x\"\n",
                "not both",
            ),
        ] {
            let e = format!("{:#}", parse(text).unwrap_err());
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn the_demo_is_a_valid_config() {
        let c = UpToml::demo(Path::new("/tmp/herald-demo")).check().unwrap();
        assert_eq!(c.file.roles(), ["memo", "file", "slack"]);
        assert_eq!(c.http(), Some(DEFAULT_HTTP));
        assert_eq!(c.quic(), Some(DEFAULT_QUIC));
        // One watch of memo (its notes, not also its log: each change once) and the files.
        let uris: Vec<&str> = c.watches.iter().map(|w| w.1.as_str()).collect();
        assert_eq!(
            uris,
            [
                "memo://notes",
                "file-events://watch/tmp/herald-demo?recursive=true"
            ]
        );
    }
}

#[cfg(test)]
#[path = "config_fuzz.rs"]
mod fuzz;
