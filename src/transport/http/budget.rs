//! Whose budget an HTTP listen stream counts against. HTTP/1.1 gives every open SSE response a
//! TCP connection of its own, so "one connection" means nothing there: a caller the server
//! knows by its token counts against its own budget (`--max-caller-listen-streams`, kept by
//! the server on every transport), one with no identity against its client address's (`--max-listen-streams`; an IPv6 client by its
//! /64, which one host may rotate through). Behind a reverse proxy every client's connections
//! come from the proxy, so the client's own address is taken from `X-Forwarded-For`, the one
//! header the common proxies write, read from the right past the trusted proxies, and only
//! when the peer is a trusted proxy (`--trusted-proxy`, loopback by default: a proxy on the
//! same host); from anyone else it is ignored, since a client could write any address there.
//! A hop that does not parse ends the walk at the peer: nothing left of it is believed.
//!
//! Budgets are kept weakly (`mcp::admission::Budgets`): one with no open stream (and no open
//! connection holding it) is pruned.

use std::net::IpAddr;

use axum::http::HeaderMap;

use crate::mcp::admission::{Budget, ConnStreams};
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

/// A `--trusted-proxy` value: a block, or `none` (no proxy is trusted, loopback included).
pub fn trusted_proxy(s: &str) -> Result<Option<Cidr>, String> {
    if s.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    s.parse().map(Some)
}

/// The trusted proxies `values` name (`None`: none named, so the default).
pub fn trusted_proxies(values: &[Option<Cidr>]) -> Option<Vec<Cidr>> {
    (!values.is_empty()).then(|| values.iter().flatten().copied().collect())
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

/// The client's address: `peer`, or, when `peer` is a trusted proxy, the nearest address in
/// `X-Forwarded-For` that is not one of them, read from the right as each proxy appends. A hop
/// that does not parse (`unknown`, a name) stops the walk: the peer counts.
pub fn client(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    for hop in hops.into_iter().rev() {
        match node(hop) {
            Some(ip) if is_trusted(ip) => continue,
            Some(ip) => return ip,
            None => return peer,
        }
    }
    peer
}

/// The address a budget is kept for: an IPv4-mapped address as its IPv4 one, any other IPv6
/// address as its /64 (what one host, or one customer of a provider, holds).
pub fn budget_address(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mut o = v6.octets();
            o[8..].fill(0);
            IpAddr::V6(o.into())
        }
        v4 => v4,
    }
}

/// An address as an `X-Forwarded-For` entry writes it: `1.2.3.4`, `1.2.3.4:5678`,
/// `[2001:db8::1]:80`, `2001:db8::1`; `None` for `unknown` or a name.
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

/// The listen-stream budgets of one HTTP endpoint: by client address, for callers with no
/// identity (a caller known by its token is budgeted by the server, on every transport).
#[derive(Default)]
pub struct Budgets {
    addresses: crate::mcp::admission::Budgets,
    trusted: Vec<Cidr>,
}

impl Budgets {
    pub fn new(trusted: Vec<Cidr>) -> Budgets {
        Budgets {
            addresses: Default::default(),
            trusted,
        }
    }

    /// The streams of `budget`, shared with every other holder of it.
    pub fn get(&self, budget: Budget) -> ConnStreams {
        self.addresses.get(budget)
    }

    /// The budget of its own a listen from `caller`, at `peer` with `headers`, counts against:
    /// for a caller the server knows by its token, its TCP connection's (one stream: the
    /// server counts the caller's), else its client address's.
    pub fn for_listen(
        &self,
        server: &SourceServer,
        caller: &Caller,
        headers: &HeaderMap,
        peer: IpAddr,
    ) -> ConnStreams {
        match server.identity(caller) {
            Some(_) => ConnStreams::default(),
            None => self.get(Budget::Address(budget_address(client(
                peer,
                headers,
                &self.trusted,
            )))),
        }
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
        // Ports and brackets, and several header lines in order.
        let ported = headers(&[
            ("x-forwarded-for", "[2001:db8::7]:4711"),
            ("x-forwarded-for", "127.0.0.1:80"),
        ]);
        assert_eq!(client(ip("::1"), &ported, &trusted), ip("2001:db8::7"));
        // RFC 7239's header is not read: the common proxies write X-Forwarded-For, and a
        // client behind them could write any Forwarded it likes.
        let spoof = headers(&[("forwarded", "for=192.0.2.99")]);
        assert_eq!(client(ip("127.0.0.1"), &spoof, &trusted), ip("127.0.0.1"));
        // A hop that does not parse stops the walk: what is left of it is not believed.
        let unknown = headers(&[("x-forwarded-for", "192.0.2.5, unknown")]);
        assert_eq!(client(ip("127.0.0.1"), &unknown, &trusted), ip("127.0.0.1"));
        assert_eq!(
            client(ip("127.0.0.1"), &HeaderMap::new(), &trusted),
            ip("127.0.0.1")
        );
        // No proxy trusted at all.
        assert_eq!(client(ip("127.0.0.1"), &xff, &[]), ip("127.0.0.1"));
    }

    #[test]
    fn an_address_is_budgeted_canonically_and_ipv6_by_its_64() {
        assert_eq!(budget_address(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(budget_address(ip("192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(
            budget_address(ip("2001:db8:1:2:aaaa::1")),
            budget_address(ip("2001:db8:1:2:bbbb::9"))
        );
        assert_ne!(
            budget_address(ip("2001:db8:1:2::1")),
            budget_address(ip("2001:db8:1:3::1"))
        );
    }

    #[test]
    fn a_budget_is_shared_while_held_and_pruned_after() {
        let ops = || Budget::Caller {
            key: "k1".into(),
            name: "ops".into(),
        };
        let b = Budgets::default();
        let one = b.get(ops());
        let slot = one.try_acquire(2).unwrap();
        let again = b.get(ops());
        assert_eq!(again.open(), 1, "the same budget");
        let dev = Budget::Caller {
            key: "k2".into(),
            name: "dev".into(),
        };
        assert_eq!(b.get(dev).open(), 0);
        drop((slot, one, again));
        assert_eq!(b.get(ops()).open(), 0);
        // Many budgets come and go: the map is pruned, not grown for ever.
        for i in 0..5000u32 {
            drop(b.get(Budget::Address(IpAddr::from(i.to_be_bytes()))));
        }
        assert!(b.addresses.kept() <= 2048, "pruned");
    }
}
