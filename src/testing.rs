//! In-process fixtures for unit tests (compiled only for them): a real herald memo source
//! served by the real [`SourceServer`] over in-memory pipes, reached through an
//! [`Upstream`] like any server, so client-side code is tested against the real server side
//! with no process, socket or clock of its own. Like `app`, this wires roles together; no
//! role imports it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::mcp::limits::Limits;
use crate::mcp::server::SourceServer;
use crate::source::memo::Memo;
use crate::store::Store;
use crate::transport::client::ConnectError;
use crate::transport::target::Target;
use crate::upstream::{Dialer, Upstream, UpstreamConfig};

const MAX: usize = 4 << 20;

/// A memo source in this process. Dropping it ends its connections.
pub struct MemoServer {
    pub memo: Arc<Memo>,
    server: SourceServer,
    /// Cancelled to end every open connection (a crash); replaced so new ones work.
    conns: Arc<Mutex<CancellationToken>>,
    /// While set, connects are refused (a server that is down).
    down: Arc<AtomicBool>,
    shutdown: CancellationToken,
}

impl Drop for MemoServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl MemoServer {
    pub async fn start() -> MemoServer {
        MemoServer::with_ring(16).await
    }

    /// A memo whose log keeps `ring_capacity` events.
    pub async fn with_ring(ring_capacity: usize) -> MemoServer {
        let memo = Arc::new(
            Memo::open(Store::memory(), ring_capacity, None)
                .await
                .expect("memo opens"),
        );
        // Its tasks run on a context of their own, ended with this server.
        let ctx = crate::runtime::context::RoleContext::new("memo");
        let shutdown = ctx.shutdown().clone();
        let tasks = crate::mcp::tasks::Tasks::open(&ctx, None, "memo").await;
        let server = SourceServer::with_tasks(
            memo.clone(),
            Limits::default(),
            shutdown.clone(),
            Some(tasks),
        );
        MemoServer {
            memo,
            server,
            conns: Arc::new(Mutex::new(shutdown.child_token())),
            down: Arc::new(AtomicBool::new(false)),
            shutdown,
        }
    }

    /// The server itself (for an in-process upstream of it).
    pub fn server(&self) -> SourceServer {
        self.server.clone()
    }

    /// Opens connections to this server, each over its own in-memory pipe.
    pub fn dialer(&self) -> Dialer {
        let server = self.server.clone();
        let conns = self.conns.clone();
        let down = self.down.clone();
        Arc::new(move |relay| {
            let server = server.clone();
            let ct = conns.lock().unwrap().child_token();
            let down = down.load(Ordering::SeqCst);
            Box::pin(async move {
                if down {
                    return Err(ConnectError::Transport {
                        target: "in-process memo".into(),
                        message: "connection refused".into(),
                    });
                }
                let (client, served) = tokio::io::duplex(1 << 16);
                let (sr, sw) = tokio::io::split(served);
                let service = server.for_connection();
                tokio::spawn(crate::transport::lines::serve(service, sr, sw, ct));
                let (cr, cw) = tokio::io::split(client);
                {
                    let tap: Arc<dyn crate::transport::client::Tap> = Arc::new(relay.clone());
                    crate::transport::client::connect_stream_tapped(
                        Target::Stdio("in-process memo".into()),
                        cr,
                        cw,
                        relay,
                        MAX,
                        Some(tap),
                    )
                    .await
                }
            })
        })
    }

    /// An upstream for this server (not yet connected).
    pub fn upstream(&self) -> Arc<Upstream> {
        self.upstream_with(UpstreamConfig::new(
            Target::Stdio("in-process memo".into()),
            Default::default(),
            MAX,
        ))
    }

    /// An upstream for this server configured as `cfg` says (its target only names it).
    pub fn upstream_with(&self, cfg: UpstreamConfig) -> Arc<Upstream> {
        Arc::new(Upstream::dialing(cfg, self.dialer()))
    }

    /// Ends every open connection, as a crashed server would; later connects work.
    pub fn drop_connections(&self) {
        let mut conns = self.conns.lock().unwrap();
        conns.cancel();
        *conns = self.shutdown.child_token();
    }

    /// Takes the server down (its connections end, new ones are refused) or back up.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            self.drop_connections();
        }
    }

    pub async fn set(&self, key: &str, value: Value) {
        self.memo.set(key, value).await.expect("memo_set");
    }
}

/// An upstream whose every connect fails (a server that is down), counting the attempts.
pub fn down_upstream(attempts: Arc<std::sync::atomic::AtomicUsize>) -> Arc<Upstream> {
    let dialer: Dialer = Arc::new(move |_relay| {
        attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async {
            Err(ConnectError::Transport {
                target: "down".into(),
                message: "connection refused".into(),
            })
        })
    });
    Arc::new(Upstream::dialing(
        UpstreamConfig::new(
            Target::Http("http://down/mcp".into()),
            Default::default(),
            MAX,
        ),
        dialer,
    ))
}
