//! A slug whose tool list changes, behind the gateway, and a gateway listener that asked for
//! `toolsListChanged`. No sleeps: every wait is for a message, under a timeout.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{ServerNotification, SubscriptionFilter, Tool};

use super::*;
use crate::gateway::Gateway;
use crate::mcp::limits::Limits;
use crate::mcp::server::SourceServer;
use crate::mcp::source::{
    Admission, Caller, Contents, ListenFilter, Source, SourceError, SourceInfo,
};
use crate::runtime::context::RoleContext;
use crate::transport::target::Target;
use crate::upstream::{UpstreamConfig, local};

const WAIT: Duration = Duration::from_secs(10);

/// A source whose tools are whatever the test sets, announced on its feed.
struct Changing {
    feed: ChangeFeed,
    tools: Mutex<Vec<Tool>>,
}

impl Changing {
    fn add(&self, name: &str) {
        let t = Tool::new(name.to_owned(), "a tool", serde_json::Map::new());
        self.tools.lock().unwrap().push(t);
    }
}

#[async_trait::async_trait]
impl Source for Changing {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            name: "changing".into(),
            list_changed: true,
            ..SourceInfo::default()
        }
    }
    fn resources(&self, _: &Caller) -> Vec<rmcp::model::Resource> {
        Vec::new()
    }
    async fn read(
        &self,
        _: &Caller,
        read: crate::mcp::source::Read<'_>,
    ) -> Result<Contents, SourceError> {
        Err(SourceError::NotFound {
            uri: read.uri.into(),
        })
    }
    async fn admit(&self, _: &Caller, _: &ListenFilter) -> Admission {
        Admission::default()
    }
    fn changes(&self) -> ChangeFeed {
        self.feed.clone()
    }
    fn tools(&self, _: &Caller) -> std::borrow::Cow<'_, [Tool]> {
        self.tools.lock().unwrap().clone().into()
    }
}

/// `server` in this process, as an upstream named `name`.
fn in_process(name: &str, server: SourceServer, ctx: &RoleContext) -> Arc<Upstream> {
    Arc::new(local::upstream(
        UpstreamConfig {
            name: name.into(),
            context: Some(ctx.clone()),
            ..UpstreamConfig::new(
                Target::Stdio(format!("in-process {name}")),
                Default::default(),
                1 << 20,
            )
        },
        server,
        ctx,
    ))
}

async fn tool_names(gw: &Arc<Upstream>) -> Vec<String> {
    let live = gw.live().await.unwrap();
    let tools = tokio::time::timeout(WAIT, live.conn.list_all_tools())
        .await
        .expect("tools/list in time")
        .unwrap();
    tools.iter().map(|t| t.name.to_string()).collect()
}

#[tokio::test]
async fn a_slugs_tool_change_reaches_a_gateway_listener_and_its_tool_list() {
    let ctx = RoleContext::new("gateway");
    let source = Arc::new(Changing {
        feed: ChangeFeed::new(),
        tools: Mutex::new(Vec::new()),
    });
    source.add("a");
    let served = SourceServer::new(source.clone(), Limits::default(), ctx.shutdown().clone());
    let up = in_process("s", served, &ctx);
    // Connected first: the catalog the follower starts from lists `a`.
    let live = up.live().await.unwrap();
    assert!(live.tools_list_changed, "the slug says its tools change");
    let gateway = Gateway::with_upstreams(vec![up.clone()], Vec::new(), &ctx);
    assert!(gateway.info().list_changed, "the gateway says so too");
    let gateway = SourceServer::new(Arc::new(gateway), Limits::default(), ctx.shutdown().clone());
    let gw = in_process("gw", gateway, &ctx);
    assert_eq!(tool_names(&gw).await, vec!["s__a".to_owned()]);

    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let gw_live = gw.live().await.unwrap();
    let mut sub = tokio::time::timeout(WAIT, gw_live.conn.listen(filter))
        .await
        .expect("an ack in time")
        .unwrap();
    assert_eq!(sub.acknowledged().tools_list_changed, Some(true));

    source.add("b");
    source.feed.publish(TOOLS_CHANGED);
    // Each notification is followed by a list; the new tool must show after one of them (the
    // follower's own listen may be acknowledged after the change, which it then announces).
    loop {
        let n = tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("notifications/tools/list_changed in time")
            .unwrap()
            .expect("the listen is still open");
        assert!(
            matches!(n, ServerNotification::ToolListChangedNotification(_)),
            "{n:?}"
        );
        if tool_names(&gw).await == ["s__a", "s__b"] {
            break;
        }
    }
    ctx.shutdown().cancel();
}

#[tokio::test]
async fn a_catalog_that_lists_other_tools_or_prompts_is_announced() {
    let feed = ChangeFeed::new();
    let keys = [TOOLS_CHANGED, PROMPTS_CHANGED, "x://mark"].map(str::to_owned);
    let registration = feed.register(&keys);
    let next = || async {
        tokio::time::timeout(WAIT, registration.queue().next_batch())
            .await
            .expect("a batch")
    };
    let tool = |n: &str| Tool::new(n.to_owned(), "t", serde_json::Map::new());
    let one = Arc::new(Catalog {
        tools: vec![tool("a")],
        ..Catalog::default()
    });
    let mut seen = Some(one.clone());
    announce_differences(&mut seen, Some(Arc::new(Catalog::clone(&one))), &feed);
    feed.publish("x://mark");
    assert_eq!(next().await, vec!["x://mark".to_owned()], "the same lists");
    let two = Arc::new(one.with_tools(vec![tool("a"), tool("b")]));
    announce_differences(&mut seen, Some(two.clone()), &feed);
    assert_eq!(next().await, vec![TOOLS_CHANGED.to_owned()]);
    assert!(Arc::ptr_eq(seen.as_ref().unwrap(), &two));
    // A slug's first catalog is a change from nothing.
    let mut none = None;
    announce_differences(&mut none, Some(two), &feed);
    assert_eq!(next().await, vec![TOOLS_CHANGED.to_owned()]);
}
