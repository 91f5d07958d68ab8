//! NATS as a role's backend (`--backend nats://HOST:PORT[,…]`): how to reach it, what
//! `herald check` can say of the settings without connecting, and the connection's health for
//! `/ready` and `/metrics`. The roles keep their own state in it (memo: a key-value bucket,
//! `source::memo::nats`; slack: a stream and a lease, `source::slack::shared`). Whoever
//! follows a stream in order does it with [`ordered::Follow`], and looks at it again when
//! NATS says to with [`lookout::Lookout`].

use std::path::PathBuf;
use std::time::Duration;

use crate::runtime::metrics::{Counter, Metrics, Summary};

pub mod claim;
pub mod events;
pub mod holder;
pub mod lookout;
pub mod ordered;
mod seal;

/// How to reach NATS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsConfig {
    /// `nats://host:port[,nats://host:port…]` (or `tls://…`).
    pub urls: String,
    /// A `.creds` file (JWT and nkey seed).
    pub creds: Option<PathBuf>,
    /// A file holding an nkey seed.
    pub nkey: Option<PathBuf>,
    /// A CA certificate (PEM) to trust for TLS, which it then requires.
    pub tls_ca: Option<PathBuf>,
    /// The key-value bucket.
    pub bucket: String,
}

impl NatsConfig {
    /// The server list as given, without userinfo (for messages, and what async-nats is
    /// given: it would log a URL's password at debug).
    pub fn redacted(&self) -> String {
        let pieces = || self.urls.split(',');
        // A `,` inside a password (to be written `%2C`) splits it across two pieces: then
        // only what follows each piece's `@` is shown.
        if pieces().any(|u| !u.contains("://") && u.contains('@')) {
            return pieces()
                .map(|u| u.rfind('@').map_or("…", |at| &u[at + 1..]))
                .collect::<Vec<_>>()
                .join(",");
        }
        pieces()
            .map(|u| without_userinfo(u).0)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The user and password (or token) the URLs carry, decoded: the same in every URL that
    /// has one, and not besides a credentials or nkey file.
    fn url_credentials(&self) -> Result<Option<UrlCredentials>, String> {
        let mut infos = self.urls.split(',').filter_map(|u| without_userinfo(u).1);
        let Some(info) = infos.next() else {
            return Ok(None);
        };
        let shown = self.redacted();
        if infos.any(|other| other != info) {
            return Err(format!(
                "--backend {shown}: its URLs give different users or passwords; give the same in each, or in the first only"
            ));
        }
        if self.creds.is_some() || self.nkey.is_some() {
            return Err(format!(
                "--backend {shown} has a user and password, and --nats-creds or --nats-nkey too: give one of them"
            ));
        }
        let decoded = |part: &str| {
            crate::runtime::percent::decode(part).map_err(|_| {
                format!(
                    "--backend {shown}: the user or password in the URL has a bad %-escape; write % as %25"
                )
            })
        };
        Ok(Some(match info.split_once(':') {
            Some(("", _)) => {
                return Err(format!(
                    "--backend {shown}: a password with no user; give nats://USER:PASSWORD@HOST:PORT"
                ));
            }
            Some((user, pass)) => UrlCredentials::User(decoded(user)?, decoded(pass)?),
            None => UrlCredentials::Token(decoded(info)?),
        }))
    }

    /// Checks what can be checked without connecting.
    pub fn check(&self) -> Result<(), String> {
        for u in self.urls.split(',') {
            let scheme_ok = ["nats://", "tls://"].iter().any(|s| u.starts_with(s));
            if !scheme_ok || u.len() <= "nats://".len() {
                let shown = self.redacted();
                return Err(format!(
                    "--backend {shown:?} is not a list of NATS servers; give nats://HOST:PORT (comma-separated for a cluster; a `,` in a password written %2C)"
                ));
            }
        }
        for (flag, path) in [
            ("--nats-creds", &self.creds),
            ("--nats-nkey", &self.nkey),
            ("--nats-tls-ca", &self.tls_ca),
        ] {
            if let Some(p) = path
                && !p.is_file()
            {
                return Err(format!("{flag} {}: no such file", p.display()));
            }
        }
        self.url_credentials()?;
        if self.bucket.is_empty()
            || !self
                .bucket
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(format!(
                "bucket name {:?}: use letters, digits, '_' and '-'",
                self.bucket
            ));
        }
        Ok(())
    }

    /// Connects (the reconnects after are async-nats's own), counting connects and
    /// disconnects in `metrics`.
    pub async fn connect(&self, metrics: &Metrics) -> Result<Connection, String> {
        self.check()?;
        let counts = NatsMetrics::register(metrics);
        let (event, events) = tokio::sync::watch::channel(());
        let mut opts = async_nats::ConnectOptions::new()
            .name("herald")
            .connection_timeout(Duration::from_secs(5))
            .event_callback(move |ev| {
                let counts = counts.clone();
                let event = event.clone();
                async move {
                    match &ev {
                        async_nats::Event::Disconnected => {
                            counts.disconnects.inc();
                            tracing::warn!("NATS connection lost; reconnecting")
                        }
                        async_nats::Event::Connected => {
                            counts.connects.inc();
                            tracing::info!("NATS connected")
                        }
                        // A permission refused (the advisories a follower subscribes to,
                        // say): what the operator must grant.
                        async_nats::Event::ServerError(e) => {
                            tracing::warn!(error = %e, "the NATS server refused something")
                        }
                        other => tracing::debug!(event = %other, "NATS"),
                    }
                    // Every event, not only `Connected`: async-nats drops events when its
                    // queue of them is full, and a lookout compares the client's own count
                    // of connects at each.
                    event.send_replace(());
                }
            });
        if let Some(c) = &self.creds {
            opts = opts
                .credentials_file(c)
                .await
                .map_err(|e| format!("--nats-creds {}: {e}", c.display()))?;
        }
        if let Some(n) = &self.nkey {
            let seed = std::fs::read_to_string(n)
                .map_err(|e| format!("--nats-nkey {}: {e}", n.display()))?;
            opts = opts.nkey(seed.trim().to_owned());
        }
        if let Some(ca) = &self.tls_ca {
            opts = opts.add_root_certificates(ca.clone()).require_tls(true);
        }
        // async-nats reads no user and password from a URL (and would log them): they are
        // given to it apart.
        match self.url_credentials()? {
            Some(UrlCredentials::User(user, pass)) => opts = opts.user_and_password(user, pass),
            Some(UrlCredentials::Token(token)) => opts = opts.token(token),
            None => {}
        }
        let urls: Vec<async_nats::ServerAddr> = self
            .redacted()
            .split(',')
            .map(|u| u.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("--backend {}: {e}", self.redacted()))?;
        let client = opts.connect(urls).await.map_err(|e| {
            use async_nats::ConnectErrorKind::{Authentication, AuthorizationViolation};
            match e.kind() {
                Authentication | AuthorizationViolation => format!(
                    "NATS at {} refused herald's credentials ({e}); check the user and password (or token) in the URL, or --nats-creds / --nats-nkey",
                    self.redacted()
                ),
                _ => format!(
                    "no NATS server answered at {} ({e}); is nats-server running there with -js?",
                    self.redacted()
                ),
            }
        })?;
        Ok(Connection { client, events })
    }
}

/// What a URL's userinfo gives: `USER:PASSWORD`, or a token alone.
enum UrlCredentials {
    User(String, String),
    Token(String),
}

/// `u` without its userinfo, and the userinfo (still %-escaped).
fn without_userinfo(u: &str) -> (String, Option<&str>) {
    match (u.find("://"), u.rfind('@')) {
        (Some(s), Some(at)) if at > s => (
            format!("{}{}", &u[..s + 3], &u[at + 1..]),
            Some(&u[s + 3..at]),
        ),
        _ => (u.to_owned(), None),
    }
}

/// A connection to NATS: async-nats's client, which reconnects by itself, and its events
/// told as they happen (what a [`lookout::Lookout`] waits on for a reconnect).
#[derive(Clone)]
pub struct Connection {
    pub client: async_nats::Client,
    /// Changed at each of the connection's events (a connect, the first and every
    /// reconnect, among them, after the client's own count, `statistics().connects`, went
    /// up).
    pub events: tokio::sync::watch::Receiver<()>,
}

/// Opens the key-value bucket `name`, or makes it (keeping `history` revisions a key).
pub async fn bucket(
    js: &async_nats::jetstream::Context,
    name: &str,
    description: &str,
    history: i64,
    servers: &str,
) -> Result<async_nats::jetstream::kv::Store, String> {
    open_bucket(
        js,
        async_nats::jetstream::kv::Config {
            bucket: name.to_owned(),
            description: description.to_owned(),
            history,
            ..Default::default()
        },
        servers,
    )
    .await
}

/// [`bucket`] with every setting of `config` (a `max_age`, say), made as it says if absent.
pub async fn open_bucket(
    js: &async_nats::jetstream::Context,
    config: async_nats::jetstream::kv::Config,
    servers: &str,
) -> Result<async_nats::jetstream::kv::Store, String> {
    let name = config.bucket.clone();
    if let Ok(kv) = js.get_key_value(&name).await {
        return Ok(kv);
    }
    js.create_key_value(config).await.map_err(|e| {
        format!(
            "cannot open or make the key-value bucket {name} at {servers} ({e}); JetStream must be on (nats-server -js)"
        )
    })
}

/// Whether stream `name` is gone for certain: JetStream answers "stream not found" (10059),
/// not a timeout, a refusal or a stream between leaders. Only then is it made again.
pub async fn stream_gone(js: &async_nats::jetstream::Context, name: &str) -> bool {
    use async_nats::jetstream::ErrorCode;
    use async_nats::jetstream::context::GetStreamErrorKind;
    match js.get_stream(name).await {
        Ok(_) => false,
        Err(e) => {
            matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND)
        }
    }
}

/// This host's name (`localhost` when it cannot be read): what identifies a process of it
/// to the others (a Slack lease holder, an event-log publisher).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Whether `client` is connected now (what `/ready` asks of a role on NATS).
pub fn connected(client: &async_nats::Client) -> bool {
    client.connection_state() == async_nats::connection::State::Connected
}

/// Enters `client` on the process's status board: `/ready` waits while it is not connected,
/// and `/status` and `/metrics` show it.
pub fn enter(
    ctx: &crate::runtime::context::RoleContext,
    role: &str,
    cfg: &NatsConfig,
    client: async_nats::Client,
) {
    let _ = enter_later(ctx, role, cfg).set(client);
}

/// Enters a backend on the status board before its client exists (a connect that keeps
/// trying): disconnected until the returned cell holds the client.
pub fn enter_later(
    ctx: &crate::runtime::context::RoleContext,
    role: &str,
    cfg: &NatsConfig,
) -> std::sync::Arc<std::sync::OnceLock<async_nats::Client>> {
    let cell: std::sync::Arc<std::sync::OnceLock<async_nats::Client>> = Default::default();
    let seen = cell.clone();
    ctx.status().add_backend(
        format!("{role} nats"),
        cfg.redacted(),
        std::sync::Arc::new(move || seen.get().is_some_and(connected)),
        ctx.shutdown().clone(),
    );
    cell
}

/// What this process counts of its NATS backends, registered by this module in the
/// context's [`Metrics`] (the role runner registers it up front, so the series are there
/// whether or not a role uses NATS).
#[derive(Debug, Clone)]
pub struct NatsMetrics {
    pub connects: Counter,
    pub disconnects: Counter,
    /// JetStream publishes that failed (event logs and the Slack feed).
    pub publish_failures: Counter,
    /// Event-log events not published (`--publish-events`): the queue was full, or NATS
    /// refused them.
    pub events_publish_dropped: Counter,
    /// Publish-to-acknowledgement times of the JetStream publishes that succeeded.
    pub publish_seconds: Summary,
    /// Streams and buckets made again by a running process because they were gone.
    pub remade: Counter,
}

impl NatsMetrics {
    /// Registers (or finds) NATS's counters in `metrics`.
    pub fn register(metrics: &Metrics) -> NatsMetrics {
        NatsMetrics {
            connects: metrics.counter(
                "herald_nats_connects_total",
                "connections to a NATS backend made (the first and every reconnect)",
            ),
            disconnects: metrics.counter(
                "herald_nats_disconnects_total",
                "times a NATS backend connection was lost",
            ),
            publish_failures: metrics.counter(
                "herald_nats_publish_failures_total",
                "JetStream publishes that failed (retried, or the lease was lost)",
            ),
            events_publish_dropped: metrics.counter(
                "herald_events_publish_dropped_total",
                "event-log events not published to NATS (--publish-events): the queue was full, or NATS refused them",
            ),
            publish_seconds: metrics.summary(
                "herald_nats_publish_seconds",
                "time from a JetStream publish to its acknowledgement",
            ),
            remade: metrics.counter(
                "herald_nats_streams_remade_total",
                "JetStream streams and buckets a running process made again because they were gone (NATS lost its data)",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(urls: &str) -> NatsConfig {
        NatsConfig {
            urls: urls.into(),
            bucket: "b".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_urls_user_and_password_are_taken_apart_and_never_shown() {
        let c = config("nats://me:p%40ss%2Cw@h1:4222,nats://me:p%40ss%2Cw@h2:4222");
        assert_eq!(c.redacted(), "nats://h1:4222,nats://h2:4222");
        assert!(matches!(
            c.url_credentials(),
            Ok(Some(UrlCredentials::User(u, p))) if u == "me" && p == "p@ss,w"
        ));
        assert!(c.check().is_ok());
        // Only the first URL says: it counts for all.
        let first = config("nats://me:pw@h1:4222,nats://h2:4222");
        assert!(matches!(
            first.url_credentials(),
            Ok(Some(UrlCredentials::User(..)))
        ));
        assert_eq!(first.redacted(), "nats://h1:4222,nats://h2:4222");
        assert!(matches!(
            config("nats://s3cret@h:4222").url_credentials(),
            Ok(Some(UrlCredentials::Token(t))) if t == "s3cret"
        ));
        assert!(matches!(
            config("nats://h:4222").url_credentials(),
            Ok(None)
        ));
        // A `,` left in a password: nothing of it is shown.
        let split = config("nats://me:zq1,zq2@h:4222");
        assert_eq!(split.redacted(), "…,h:4222");
        let e = split.check().unwrap_err();
        assert!(e.contains("%2C") && !e.contains("zq"), "{e}");
    }

    #[test]
    fn credentials_given_twice_or_half_are_refused_without_the_secret() {
        let cases = [
            (
                config("nats://me:zq1@h1:4222,nats://me:zq2@h2:4222"),
                "different users",
            ),
            (config("nats://:zq3@h:4222"), "a password with no user"),
            (config("nats://me:zq4%zz@h:4222"), "bad %-escape"),
            (
                NatsConfig {
                    creds: Some(std::env::current_exe().unwrap()),
                    ..config("nats://me:zq5@h:4222")
                },
                "--nats-creds or --nats-nkey too",
            ),
        ];
        for (c, said) in cases {
            let e = c.check().unwrap_err();
            assert!(e.contains(said), "{e}");
            assert!(!e.contains("zq"), "{e}");
        }
    }
}
