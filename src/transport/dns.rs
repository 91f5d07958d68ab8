//! Host-name resolution in Rust: `/etc/hosts`, then the name servers of `/etc/resolv.conf`
//! (hickory-resolver), never glibc's `getaddrinfo`.
//!
//! Why: the release binary is statically linked against glibc (`cargo static`, see the
//! README's Install), and a static glibc resolves names through NSS, which may `dlopen` the host's
//! `libnss_*.so` modules (`resolve`, `mdns4_minimal`, `myhostname`, LDAP...) built for whatever
//! glibc the host has; the linker says so ("Using 'getaddrinfo' in statically linked
//! applications requires at runtime the shared libraries from the glibc version used for
//! linking"). Resolving in Rust makes an upstream's host name work the same on every host, a
//! chroot with no `/etc` at all included (`localhost` is answered without any file, as RFC 6761
//! asks).
//!
//! Outgoing connections to a user-given host name go through here: QUIC upstreams
//! ([`quic::connect`](super::quic::connect)), and Slack's Socket Mode WebSocket and the
//! gateway's own connections to HTTP upstreams ([`connect_tcp`], which races the
//! addresses). HTTP clients (rmcp's Streamable HTTP client, the webhook sink, Slack's
//! Web API, the admin client) are reqwest clients made by
//! [`http_client`](super::web::http_client), which gives each [`ReqwestResolver`]: this
//! resolver, files read per lookup (reqwest's own hickory resolver would fall back to public
//! name servers when `/etc/resolv.conf` is missing, sending internal names, and then tokens,
//! out). Bind addresses are not resolved here.
//!
//! Two clients do not come here yet, and so resolve through glibc: NATS (async-nats looks a
//! server's name up with `tokio::net::lookup_host`) and the Kubernetes API client
//! (`source::k8s::api`, hyper-util's `HttpConnector`, `getaddrinfo`).
//!
//! The files are read when a [`Resolver`] is made, and [`lookup`] makes one per call: a
//! connect is rare (a start, a reconnect after backoff), and an edited `/etc/hosts` or
//! `/etc/resolv.conf` then applies to the next connect, as it would through glibc.

use std::net::{IpAddr, SocketAddr};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use tokio::net::TcpStream;

/// Where the name servers come from.
const RESOLV_CONF: &str = "/etc/resolv.conf";

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("{target}: expected HOST:PORT")]
    Syntax { target: String },
    #[error("cannot resolve {host}: {message}")]
    Lookup { host: String, message: String },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("cannot set up the DNS resolver: {0}")]
    Setup(String),
}

/// A resolver: name servers, search list and options, and the hosts entries consulted first.
pub struct Resolver {
    inner: TokioResolver,
    /// Why there are no name servers (`/etc/resolv.conf` missing or empty), for the error of
    /// a name that only DNS could have answered.
    no_servers: Option<String>,
}

impl Resolver {
    /// The system's: `/etc/resolv.conf` (name servers, `search`, `options`) and `/etc/hosts`,
    /// read now. Without a usable `/etc/resolv.conf`, names still resolve from `/etc/hosts`
    /// and `localhost` still resolves; other names fail, naming the file.
    pub fn system() -> Result<Resolver, DnsError> {
        match TokioResolver::builder_tokio() {
            Ok(builder) => Resolver::build(builder, None),
            Err(e) => Resolver::build(
                TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, vec![], vec![]),
                    TokioRuntimeProvider::default(),
                ),
                Some(format!("{RESOLV_CONF}: {e}")),
            ),
        }
    }

    /// Name servers at `servers` (UDP, any port) and the entries of `hosts` (the `/etc/hosts`
    /// format) instead of the system's files. For tests, which run their own name server.
    pub fn with_servers(servers: &[SocketAddr], hosts: &str) -> Result<Resolver, DnsError> {
        let servers = servers
            .iter()
            .map(|s| {
                let mut ns = NameServerConfig::udp(s.ip());
                for c in &mut ns.connections {
                    c.port = s.port();
                }
                ns
            })
            .collect();
        let mut builder = TokioResolver::builder_with_config(
            ResolverConfig::from_parts(None, vec![], servers),
            TokioRuntimeProvider::default(),
        );
        builder.options_mut().use_hosts_file = hickory_resolver::config::ResolveHosts::Never;
        let mut resolver = Resolver::build(builder, None)?;
        let mut entries = hickory_resolver::Hosts::default();
        // Reading from a byte slice cannot fail; a malformed line is skipped, as in the file.
        let _ = entries.read_hosts_conf(hosts.as_bytes());
        resolver.inner.set_hosts(std::sync::Arc::new(entries));
        Ok(resolver)
    }

    fn build(
        mut builder: hickory_resolver::ResolverBuilder<TokioRuntimeProvider>,
        no_servers: Option<String>,
    ) -> Result<Resolver, DnsError> {
        // A and AAAA both, IPv4 first: QUIC dials one address, and herald's servers listen on
        // IPv4 by default. (hickory's default puts AAAA first, so `localhost` would be ::1,
        // RFC 6761's answer, even where /etc/hosts maps it to 127.0.0.1 only.)
        builder.options_mut().ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        // Building fails only when setting up encrypted DNS transports, which herald does
        // not configure; the error is kept anyway rather than assumed away.
        let inner = builder
            .build()
            .map_err(|e| DnsError::Setup(e.to_string()))?;
        Ok(Resolver { inner, no_servers })
    }

    /// The addresses of `host` (a name or an IP literal) with `port`: IPv4 first, then IPv6.
    pub async fn lookup(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, DnsError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let found = self.inner.lookup_ip(host).await.map_err(|e| {
            let message = match &self.no_servers {
                Some(why) => format!("not in /etc/hosts, and no name server to ask ({why})"),
                // hickory's own words for these quote its query structs.
                None if e.is_nx_domain() => "no such host".to_owned(),
                None if e.is_no_records_found() => {
                    "it has no address (no A or AAAA record)".to_owned()
                }
                None if matches!(e, hickory_resolver::net::NetError::Timeout) => {
                    format!("the name servers of {RESOLV_CONF} did not answer")
                }
                None => e.to_string(),
            };
            DnsError::Lookup {
                host: host.to_owned(),
                message,
            }
        })?;
        let addrs: Vec<SocketAddr> = found.iter().map(|ip| SocketAddr::new(ip, port)).collect();
        if addrs.is_empty() {
            return Err(DnsError::NoAddress {
                host: host.to_owned(),
            });
        }
        Ok(addrs)
    }
}

/// herald's resolver for reqwest: [`Resolver::system`] per lookup, so the two files are read
/// as they are now, and no name ever goes to a name server the host did not configure.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReqwestResolver;

impl reqwest::dns::Resolve for ReqwestResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = Resolver::system()?.lookup(&host, 0).await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Splits `HOST:PORT` (`[v6]:PORT` for an IPv6 literal) into the host, brackets removed, and
/// the port.
pub fn split_host_port(target: &str) -> Result<(&str, u16), DnsError> {
    let syntax = || DnsError::Syntax {
        target: target.to_owned(),
    };
    let (host, port) = target.rsplit_once(':').ok_or_else(syntax)?;
    let port: u16 = port.parse().map_err(|_| syntax())?;
    let host = match host.strip_prefix('[') {
        Some(rest) => rest.strip_suffix(']').ok_or_else(syntax)?,
        None if host.contains(':') => return Err(syntax()),
        None => host,
    };
    if host.is_empty() {
        return Err(syntax());
    }
    Ok((host, port))
}

/// Resolves `HOST:PORT` with the system's resolver: the host (for TLS server names) and its
/// addresses.
pub async fn lookup(target: &str) -> Result<(String, Vec<SocketAddr>), DnsError> {
    let (host, port) = split_host_port(target)?;
    let addrs = Resolver::system()?.lookup(host, port).await?;
    Ok((host.to_owned(), addrs))
}

/// How long a connection attempt has to itself before the next address is tried beside it
/// (RFC 8305's "Connection Attempt Delay", the 250 ms it recommends; hyper-util, under
/// reqwest, waits 300 ms).
const ATTEMPT_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// Opens a TCP connection to `host:port`, with `TCP_NODELAY` (the callers send small frames).
/// Its addresses are raced as RFC 8305 asks: the families taken in turn, the next attempt
/// started when one fails or has had [`ATTEMPT_DELAY`] to itself, the first to connect kept
/// and the others dropped. An address that swallows SYNs (an IPv6 route that goes nowhere)
/// then costs 250 ms, not the caller's whole connect timeout.
pub async fn connect_tcp(host: &str, port: u16) -> Result<TcpStream, std::io::Error> {
    let addrs = async { Resolver::system()?.lookup(host, port).await }
        .await
        .map_err(std::io::Error::other)?;
    let stream = race(interleave(addrs), ATTEMPT_DELAY, TcpStream::connect)
        .await
        .map_err(|e| e.unwrap_or_else(|| std::io::Error::other(format!("{host}: no address"))))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// `addrs` with their families taken in turn, each family in its own order (the first
/// address first).
fn interleave(addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let first_v6 = addrs.first().is_some_and(SocketAddr::is_ipv6);
    let (a, b): (Vec<_>, Vec<_>) = addrs.into_iter().partition(|x| x.is_ipv6() == first_v6);
    let (mut a, mut b) = (a.into_iter(), b.into_iter());
    let mut out = Vec::with_capacity(a.len() + b.len());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return out,
            (x, y) => out.extend(x.into_iter().chain(y)),
        }
    }
}

/// The first of `addrs` that `connect` reaches, attempts staggered by `delay` (or started at
/// once when the one before failed); `Err(None)` with no address, else the last error.
async fn race<T, F, Fut>(
    addrs: Vec<SocketAddr>,
    delay: std::time::Duration,
    connect: F,
) -> Result<T, Option<std::io::Error>>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: Future<Output = std::io::Result<T>>,
{
    use futures::StreamExt;
    let mut waiting = addrs.into_iter();
    let mut running = futures::stream::FuturesUnordered::new();
    let mut last = None;
    loop {
        if running.is_empty() {
            let Some(next) = waiting.next() else {
                return Err(last);
            };
            running.push(connect(next));
        }
        let more = waiting.len() > 0;
        tokio::select! {
            // An attempt done wins a tie with the delay: no attempt started for nothing.
            biased;
            done = running.next() => match done {
                Some(Ok(stream)) => return Ok(stream),
                Some(Err(e)) => {
                    last = Some(e);
                    if let Some(next) = waiting.next() {
                        running.push(connect(next));
                    }
                }
                // (Never: `running` was not empty.)
                None => {}
            },
            () = tokio::time::sleep(delay), if more => {
                if let Some(next) = waiting.next() {
                    running.push(connect(next));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use tokio::net::UdpSocket;

    /// A name server that knows one name: `name` has the A record `addr`; everything else is
    /// NXDOMAIN, and `name`'s AAAA is an empty answer. Enough of RFC 1035 for a stub
    /// resolver's queries (one question; the EDNS record hickory adds is ignored).
    async fn fake_dns(name: &'static str, addr: Ipv4Addr) -> SocketAddr {
        let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind udp");
        let local = sock.local_addr().expect("local addr");
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                    return;
                };
                if let Some(reply) = answer(&buf[..n], name, addr) {
                    let _ = sock.send_to(&reply, peer).await;
                }
            }
        });
        local
    }

    fn answer(query: &[u8], name: &str, addr: Ipv4Addr) -> Option<Vec<u8>> {
        // The question: labels up to the root, then QTYPE and QCLASS.
        let mut i = 12;
        let mut labels = Vec::new();
        loop {
            let len = *query.get(i)? as usize;
            i += 1;
            if len == 0 {
                break;
            }
            labels.push(String::from_utf8_lossy(query.get(i..i + len)?).to_ascii_lowercase());
            i += len;
        }
        let qtype = u16::from_be_bytes([*query.get(i)?, *query.get(i + 1)?]);
        let question_end = i + 4;
        let asked = labels.join(".");
        let known = asked == name;
        let mut reply = Vec::with_capacity(question_end + 16);
        reply.extend_from_slice(&query[..2]); // id
        let rd = query[2] & 0x01;
        reply.push(0x80 | rd); // QR, opcode 0, RD copied
        reply.push(if known { 0x80 } else { 0x83 }); // RA, NOERROR or NXDOMAIN
        let answers: u16 = u16::from(known && qtype == 1);
        reply.extend_from_slice(&1u16.to_be_bytes()); // QDCOUNT
        reply.extend_from_slice(&answers.to_be_bytes()); // ANCOUNT
        reply.extend_from_slice(&[0, 0, 0, 0]); // NSCOUNT, ARCOUNT
        reply.extend_from_slice(query.get(12..question_end)?);
        if answers == 1 {
            reply.extend_from_slice(&[0xc0, 12]); // the name: a pointer to the question's
            reply.extend_from_slice(&[0, 1, 0, 1]); // A, IN
            reply.extend_from_slice(&60u32.to_be_bytes()); // TTL
            reply.extend_from_slice(&4u16.to_be_bytes());
            reply.extend_from_slice(&addr.octets());
        }
        Some(reply)
    }

    #[tokio::test]
    async fn a_name_resolves_through_a_name_server() {
        let dns = fake_dns("upstream.herald.test", Ipv4Addr::new(127, 0, 0, 42)).await;
        let resolver = Resolver::with_servers(&[dns], "").unwrap();
        let addrs = resolver
            .lookup("upstream.herald.test", 8751)
            .await
            .expect("resolves");
        assert_eq!(addrs, vec!["127.0.0.42:8751".parse().unwrap()]);
        let err = resolver
            .lookup("missing.herald.test", 1)
            .await
            .expect_err("NXDOMAIN");
        assert!(
            err.to_string()
                .starts_with("cannot resolve missing.herald.test"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn hosts_entries_come_before_the_name_server() {
        let dns = fake_dns("db.herald.test", Ipv4Addr::new(127, 0, 0, 42)).await;
        let resolver = Resolver::with_servers(&[dns], "10.1.2.3 db.herald.test db\n").unwrap();
        let addrs = resolver
            .lookup("db.herald.test", 5)
            .await
            .expect("resolves");
        assert_eq!(addrs, vec!["10.1.2.3:5".parse().unwrap()]);
    }

    #[tokio::test]
    async fn localhost_needs_no_file_and_no_server() {
        let resolver = Resolver::with_servers(&[], "").unwrap();
        let addrs = resolver.lookup("localhost", 80).await.expect("resolves");
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
        assert_eq!(addrs[0], "127.0.0.1:80".parse().unwrap(), "IPv4 first");
    }

    #[tokio::test]
    async fn the_system_resolver_reads_etc_hosts() {
        // Every Linux machine (and container) this runs on maps localhost in /etc/hosts;
        // the answer is loopback either way, from the file or from RFC 6761.
        let (host, addrs) = lookup("localhost:8750").await.expect("resolves");
        assert_eq!(host, "localhost");
        assert!(
            addrs
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 8750)
        );
    }

    #[tokio::test]
    async fn ip_literals_are_not_looked_up() {
        let resolver = Resolver::with_servers(&[], "").unwrap();
        assert_eq!(
            resolver.lookup("::1", 9).await.unwrap(),
            vec!["[::1]:9".parse().unwrap()]
        );
        let (host, addrs) = lookup("[::1]:9").await.unwrap();
        assert_eq!((host.as_str(), addrs[0].port()), ("::1", 9));
    }

    #[test]
    fn host_port_syntax() {
        assert_eq!(split_host_port("a.b:1").unwrap(), ("a.b", 1));
        assert_eq!(split_host_port("[::1]:2").unwrap(), ("::1", 2));
        assert_eq!(split_host_port("1.2.3.4:3").unwrap(), ("1.2.3.4", 3));
        for bad in ["a.b", "a.b:x", ":1", "::1:2", "[::1:2", "a:99999"] {
            assert!(split_host_port(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn connect_tcp_reaches_a_named_listener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
        let stream = connect_tcp("localhost", port).await.expect("connects");
        assert!(stream.nodelay().unwrap());
        accept.await.unwrap().unwrap();
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_families_are_taken_in_turn() {
        let got = interleave(
            ["1.0.0.1:1", "1.0.0.2:1", "1.0.0.3:1", "[::1]:1", "[::2]:1"]
                .map(addr)
                .to_vec(),
        );
        let want = ["1.0.0.1:1", "[::1]:1", "1.0.0.2:1", "[::2]:1", "1.0.0.3:1"].map(addr);
        assert_eq!(got, want);
        let got = interleave(["[::1]:1", "1.0.0.1:1"].map(addr).to_vec());
        assert_eq!(got, ["[::1]:1", "1.0.0.1:1"].map(addr));
    }

    /// An address that never answers (a black-holed route) holds the race for one attempt
    /// delay, not for ever, and keeps its chance beside the next; one that fails hands on at
    /// once; the winner is the first to connect. tokio's clock is paused: the delays are
    /// virtual.
    #[tokio::test(start_paused = true)]
    async fn a_silent_address_costs_one_attempt_delay() {
        let delay = std::time::Duration::from_millis(250);
        let tried = std::sync::Mutex::new(Vec::new());
        let start = tokio::time::Instant::now();
        // Port 1 never answers, 2 is refused, 3 connects at once, 4 connects after 300 ms.
        let connect = |a: SocketAddr| {
            tried
                .lock()
                .unwrap()
                .push((a.port(), start.elapsed().as_millis()));
            async move {
                match a.port() {
                    1 => std::future::pending().await,
                    2 => Err(std::io::Error::other("refused")),
                    4 => {
                        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                        Ok(a)
                    }
                    _ => Ok(a),
                }
            }
        };
        let within = |f| tokio::time::timeout(std::time::Duration::from_secs(10), f);
        let won = within(race(
            ["10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3", "10.0.0.9:3"]
                .map(addr)
                .to_vec(),
            delay,
            connect,
        ))
        .await
        .expect("not one at a time")
        .expect("the third address connects");
        assert_eq!(won, addr("10.0.0.3:3"));
        // The silent first had 250 ms to itself; the refused second handed on at once; the
        // last was never needed.
        assert_eq!(*tried.lock().unwrap(), [(1, 0), (2, 250), (3, 250)]);
        assert_eq!(start.elapsed(), delay);

        // A slow address beside a silent one: the slow one wins, 300 ms after it began, and
        // the silent one after it waits its turn.
        tried.lock().unwrap().clear();
        let start2 = tokio::time::Instant::now();
        let won = within(race(
            ["10.0.0.4:4", "10.0.0.1:1"].map(addr).to_vec(),
            delay,
            connect,
        ))
        .await
        .expect("not one at a time")
        .expect("the slow one connects");
        assert_eq!(won, addr("10.0.0.4:4"));
        assert_eq!(start2.elapsed(), std::time::Duration::from_millis(300));
        let ports: Vec<_> = tried.lock().unwrap().iter().map(|(p, _)| *p).collect();
        assert_eq!(ports, [4, 1], "the silent one started beside the slow one");

        let err = within(race(["10.0.0.2:2"].map(addr).to_vec(), delay, connect))
            .await
            .expect("at once")
            .expect_err("refused");
        assert_eq!(err.expect("the refusal").to_string(), "refused");
        assert!(
            race(Vec::new(), delay, connect)
                .await
                .expect_err("none")
                .is_none()
        );
    }
}
