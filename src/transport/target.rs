//! Where a server is: a command speaking stdio, an HTTP endpoint or a QUIC address, as the
//! user named it, and how it may be shown to someone who must not see its keys.

/// Where a server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A command line, run with `sh -c`, speaking stdio.
    Stdio(String),
    /// A Streamable HTTP endpoint URL.
    Http(String),
    /// `HOST:PORT` of a QUIC endpoint.
    Quic(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Stdio(c) if c.starts_with(NATS_MIRROR) => write!(f, "{c}"),
            Target::Stdio(c) => write!(f, "stdio:{c}"),
            Target::Http(u) => write!(f, "{u}"),
            Target::Quic(a) => write!(f, "quic://{a}"),
        }
    }
}

/// How the target of a role in this process (`herald up`'s, over in-memory pipes) begins:
/// `in-process memo`.
pub const IN_PROCESS: &str = "in-process ";

/// How the target of a gateway's `nats` slug begins (served in this process from the event
/// logs a source publishes): `nats: the event logs of edge1 on nats://n1:4222`.
pub const NATS_MIRROR: &str = "nats: the event logs of ";

impl Target {
    /// The target as an unauthenticated report may show it (the admin address's `/status`):
    /// an HTTP URL without userinfo or query, a command without its arguments (either may
    /// carry a key).
    pub fn redacted(&self) -> String {
        match self {
            // A role of this process (`herald up`'s), a NATS mirror (its servers without
            // userinfo): nothing to hide, nothing left out.
            Target::Stdio(c) if c.starts_with(IN_PROCESS) || c.starts_with(NATS_MIRROR) => {
                c.clone()
            }
            Target::Stdio(c) => {
                let mut words = c.split_whitespace();
                let program = words.next().unwrap_or_default();
                if words.next().is_some() {
                    format!("stdio:{program} …")
                } else {
                    format!("stdio:{program}")
                }
            }
            Target::Http(u) => {
                let u = u.split(['?', '#']).next().unwrap_or_default();
                match u.split_once("://") {
                    Some((scheme, rest)) => {
                        let host_end = rest.find('/').unwrap_or(rest.len());
                        match rest[..host_end].rfind('@') {
                            Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                            None => u.to_owned(),
                        }
                    }
                    None => u.to_owned(),
                }
            }
            Target::Quic(a) => format!("quic://{a}"),
        }
    }
}
