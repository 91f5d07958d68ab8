//! Whose budget an HTTP listen stream counts against. HTTP/1.1 gives every open SSE response a
//! TCP connection of its own, so "one connection" means nothing there: a caller the server
//! knows by its token counts against its own budget (`--max-caller-listen-streams`), one with
//! no identity against its client address's (`--max-listen-streams`). Behind a reverse proxy
//! every client's connections come from the proxy, so the client's own address is taken from
//! `Forwarded` or `X-Forwarded-For`, but only when the peer is a trusted proxy
//! (`--trusted-proxy`, loopback by default: a proxy on the same host); from anyone else those
//! headers are ignored, since a client could write any address there.
//!
//! Budgets are kept weakly: one with no open stream (and no open connection holding it) is
//! pruned.

use crate::sync::Recover;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, Weak};

use axum::http::HeaderMap;

use crate::mcp::admission::{Budget, ConnStreams, StreamCounts};
use crate::mcp::caller::Caller;
use crate::mcp::server::SourceServer;

/// The proxies trusted when no `--trusted-proxy` is given: this host.
pub const DEFAULT_TRUSTED_PROXIES: &[&str] = &["127.0.0.0/8", "::1/128"];

/// An address block, `ADDR/BITS` (or one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let bad = || {
            format!(
                "{s:?} is not an address block: write ADDR/BITS (10.0.0.0/8, fd00::/8) or one address"
            )
        };
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let net: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            Some(b) => b
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { net, bits })
    }
}

impl Cidr {
    /// Whether `ip` is in the block (an IPv4-mapped IPv6 address as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix(&n.octets(), &a.octets(), self.bits),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix(&n.octets(), &a.octets(), self.bits),
            _ => false,
        }
    }
}

/// Whether the first `bits` bits of `a` and `b` agree.
fn prefix(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = (usize::from(bits / 8), bits % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

/// The client's address: `peer`, or, when `peer` is a trusted proxy, the nearest address the
/// proxies forwarded that is not one of them (`Forwarded: for=` first, else
/// `X-Forwarded-For`), read from the right as each proxy appends.
pub fn client(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|v| v.trim().to_owned())
            .collect()
    };
    let forwarded: Vec<IpAddr> = values("forwarded")
        .iter()
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                k.trim().eq_ignore_ascii_case("for").then(|| node(v))?
            })
        })
        .collect();
    let hops = if forwarded.is_empty() {
        values("x-forwarded-for")
            .iter()
            .filter_map(|v| node(v))
            .collect()
    } else {
        forwarded
    };
    // From the right: the first hop no trusted proxy vouches for is the client.
    hops.into_iter()
        .rev()
        .find(|ip| !is_trusted(*ip))
        .unwrap_or(peer)
}

/// An address as a `for=` node or an `X-Forwarded-For` entry writes it: `1.2.3.4`,
/// `1.2.3.4:5678`, `"[2001:db8::1]:80"`, `2001:db8::1`; `None` for `unknown` or an
/// obfuscated name.
fn node(v: &str) -> Option<IpAddr> {
    let v = v.trim().trim_matches('"');
    if let Ok(ip) = v.parse() {
        return Some(ip);
    }
    if let Some(rest) = v.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    let (host, port) = v.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse().ok()
}

/// The listen-stream budgets of one HTTP endpoint.
#[derive(Default)]
pub struct Budgets {
    map: Mutex<HashMap<Budget, Weak<StreamCounts>>>,
    trusted: Vec<Cidr>,
}

impl Budgets {
    pub fn new(trusted: Vec<Cidr>) -> Budgets {
        Budgets {
            map: Mutex::default(),
            trusted,
        }
    }

    /// The streams of `budget`, shared with every other holder of it.
    pub fn get(&self, budget: Budget) -> ConnStreams {
        let mut map = self.map.locked();
        if let Some(live) = map.get(&budget).and_then(Weak::upgrade) {
            return ConnStreams::from_shared(live, budget);
        }
        if map.len() >= 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let fresh = ConnStreams::of(budget.clone());
        map.insert(budget, fresh.downgrade());
        fresh
    }

    /// The budget a listen from `caller`, at `peer` with `headers`, counts against.
    pub fn for_listen(
        &self,
        server: &SourceServer,
        caller: &Caller,
        headers: &HeaderMap,
        peer: IpAddr,
    ) -> ConnStreams {
        self.get(match server.identity(caller) {
            Some(name) => Budget::Caller(name),
            None => Budget::Address(client(peer, headers, &self.trusted)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidrs(v: &[&str]) -> Vec<Cidr> {
        v.iter().map(|c| c.parse().unwrap()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(v: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, val) in v {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                val.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn blocks_are_parsed_and_matched() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains(ip("10.200.1.2")) && !c.contains(ip("11.0.0.1")));
        assert!(c.contains(ip("::ffff:10.1.1.1")), "an IPv4-mapped address");
        let c: Cidr = "fd00::/8".parse().unwrap();
        assert!(c.contains(ip("fd12::1")) && !c.contains(ip("fe80::1")));
        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let c: Cidr = "192.0.2.0/25".parse().unwrap();
        assert!(c.contains(ip("192.0.2.127")) && !c.contains(ip("192.0.2.128")));
        for bad in ["10.0.0.0/33", "nope", "10.0.0.0/x", "::/129"] {
            assert!(
                bad.parse::<Cidr>().unwrap_err().contains("ADDR/BITS"),
                "{bad}"
            );
        }
    }

    #[test]
    fn forwarded_addresses_count_only_from_a_trusted_proxy() {
        let trusted = cidrs(DEFAULT_TRUSTED_PROXIES);
        let xff = headers(&[("x-forwarded-for", "203.0.113.9, 127.0.0.1")]);
        // From the proxy on this host: the client it names.
        assert_eq!(client(ip("127.0.0.1"), &xff, &trusted), ip("203.0.113.9"));
        // From anyone else: what they wrote is ignored.
        assert_eq!(
            client(ip("198.51.100.1"), &xff, &trusted),
            ip("198.51.100.1")
        );
        // A client that writes its own header behind the proxy: the proxy's entry (the
        // rightmost untrusted one) counts, not the forged one on the left.
        let forged = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.9")]);
        assert_eq!(
            client(ip("127.0.0.1"), &forged, &trusted),
            ip("203.0.113.9")
        );
        // Forwarded (RFC 7239) first, with ports, brackets and quotes.
        let fwd = headers(&[
            (
                "forwarded",
                "for=\"[2001:db8::7]:4711\";proto=https, for=127.0.0.1",
            ),
            ("x-forwarded-for", "192.0.2.1"),
        ]);
        assert_eq!(client(ip("::1"), &fwd, &trusted), ip("2001:db8::7"));
        // Nothing forwarded, or only unknowns: the peer.
        let unknown = headers(&[("forwarded", "for=unknown")]);
        assert_eq!(client(ip("127.0.0.1"), &unknown, &trusted), ip("127.0.0.1"));
        assert_eq!(
            client(ip("127.0.0.1"), &HeaderMap::new(), &trusted),
            ip("127.0.0.1")
        );
        // No proxy trusted at all.
        assert_eq!(client(ip("127.0.0.1"), &xff, &[]), ip("127.0.0.1"));
    }

    #[test]
    fn a_budget_is_shared_while_held_and_pruned_after() {
        let b = Budgets::default();
        let one = b.get(Budget::Caller("ops".into()));
        let slot = one.try_acquire(2).unwrap();
        let again = b.get(Budget::Caller("ops".into()));
        assert_eq!(again.open(), 1, "the same budget");
        assert_eq!(b.get(Budget::Caller("dev".into())).open(), 0);
        drop((slot, one, again));
        assert_eq!(b.get(Budget::Caller("ops".into())).open(), 0);
    }
}
