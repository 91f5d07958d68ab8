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
//! ([`quic::connect`](super::quic::connect)) and Slack's Socket Mode WebSocket
//! ([`connect_tcp`]). HTTP clients (rmcp's Streamable HTTP client, the webhook sink, Slack's
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

/// Opens a TCP connection to `host:port`, trying each address in turn, with `TCP_NODELAY`
/// (the callers send small frames).
pub async fn connect_tcp(host: &str, port: u16) -> Result<TcpStream, std::io::Error> {
    let addrs = async { Resolver::system()?.lookup(host, port).await }
        .await
        .map_err(std::io::Error::other)?;
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other(format!("{host}: no address"))))
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
}
