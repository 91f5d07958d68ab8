use super::*;
use crate::mcp::source::{Body, Call};
use crate::testing::MemoServer;
use crate::transport::target::Target;
use crate::upstream::local;

fn set(key: &str, value: i64) -> JsonObject {
    json!({"key": key, "value": value})
        .as_object()
        .unwrap()
        .clone()
}

/// `memo` as slug `m`, in this process.
fn in_process_memo(memo: &MemoServer, ctx: &RoleContext) -> Arc<Upstream> {
    Arc::new(local::upstream(
        UpstreamConfig {
            name: "m".into(),
            context: Some(ctx.clone()),
            ..UpstreamConfig::new(
                Target::Stdio("in-process m".into()),
                Default::default(),
                1 << 20,
            )
        },
        memo.server(),
        ctx,
    ))
}

#[tokio::test]
async fn a_role_in_this_process_is_called_and_read_directly() {
    let memo = MemoServer::start().await;
    let ctx = RoleContext::new("gateway");
    let up = in_process_memo(&memo, &ctx);
    let gw = Gateway::with_upstreams(vec![up.clone()], Vec::new(), &ctx);
    let me = Caller::local();
    // Calls need no connection: none is made.
    for i in 0..3 {
        let r = gw
            .call_tool(&me, "m__memo_set", set("k", i), Call::default())
            .await
            .unwrap();
        let rmcp::model::CallToolResponse::Complete(r) = r else {
            panic!("a result")
        };
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
    assert!(up.cached().is_none(), "a call opened a connection");
    // An error reads as it would over a connection: the JSON-RPC error a client gets.
    let e = gw
        .call_tool(&me, "m__nope", JsonObject::new(), Call::default())
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Upstream { .. }), "{e:?}");
    // Reads route by the catalog (one connect fetches it), then go to the server
    // directly: with the connection forgotten, a read makes no new one.
    let live = up.live().await.unwrap();
    up.reset(&live);
    let c = gw
        .read(&me, crate::mcp::source::Read::new("memo://notes"))
        .await
        .unwrap();
    let Body::Text(text) = c.body else {
        panic!("memo://notes is text")
    };
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"k": 2})
    );
    let e = gw
        .read(&me, crate::mcp::source::Read::new("memo://nope"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, SourceError::Upstream { code: -32002, .. }),
        "{e:?}"
    );
    assert!(up.cached().is_none(), "a read opened a connection");
    ctx.shutdown().cancel();
}

#[tokio::test]
async fn a_bare_slug_keeps_its_tool_names_and_the_prefixed_ones_still_route() {
    let memo = MemoServer::start().await;
    let ctx = RoleContext::new("gateway");
    let up = in_process_memo(&memo, &ctx);
    let gw = Gateway::with_upstreams(vec![up.clone()], Vec::new(), &ctx).bare(Some("m"));
    let me = Caller::local();
    // Bare names are known once the catalog is: one connect fetches it.
    up.live().await.unwrap();
    let names: Vec<String> = gw.tools(&me).iter().map(|t| t.name.to_string()).collect();
    assert!(names.contains(&"memo_set".to_owned()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("m__")), "{names:?}");
    for name in ["memo_set", "m__memo_set"] {
        let r = gw
            .call_tool(&me, name, set("k", 1), Call::default())
            .await
            .unwrap();
        assert!(
            matches!(r, rmcp::model::CallToolResponse::Complete(ref r) if r.is_error != Some(true)),
            "{name}: {r:?}"
        );
    }
    // A name the bare slug does not list is not a tool of it.
    let e = gw
        .call_tool(&me, "nope", JsonObject::new(), Call::default())
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::UnknownTool(_)), "{e:?}");
    ctx.shutdown().cancel();
}

/// An upstream's requestState reaches its caller sealed: back from that caller for that slug
/// it opens to the upstream's own; from another caller, for another slug, or changed, it is
/// refused with what to do.
#[test]
fn a_request_state_goes_back_only_from_its_caller_for_its_slug() {
    let ctx = RoleContext::new("gateway");
    let gw = Gateway::with_upstreams(Vec::new(), Vec::new(), &ctx);
    let alice = Caller {
        token: Some("alice".into()),
        ..Caller::default()
    };
    let bob = Caller {
        token: Some("bob".into()),
        ..Caller::default()
    };
    let asked: rmcp::model::InputRequiredResult =
        serde_json::from_value(json!({"resultType": "input_required", "requestState": "round=1"}))
            .unwrap();
    let sealed = gw.access.seal_state(&alice, "fx", asked);
    let state = sealed.request_state.clone().unwrap();
    assert_ne!(state, "round=1", "sent out as the upstream wrote it");
    let input = |s: &str| crate::mcp::source::Input {
        responses: None,
        request_state: Some(s.to_owned()),
    };
    let mut back = input(&state);
    gw.access.open_state(&alice, "fx", &mut back).unwrap();
    assert_eq!(back.request_state.as_deref(), Some("round=1"));
    for (who, slug, s) in [
        (&bob, "fx", state.as_str()),
        (&alice, "other", &state),
        (&alice, "fx", "round=1"),
    ] {
        let e = gw.access.open_state(who, slug, &mut input(s)).unwrap_err();
        assert!(e.to_string().contains("send the request again"), "{e}");
    }
    // No state, nothing to open.
    let mut none = crate::mcp::source::Input::default();
    gw.access.open_state(&bob, "fx", &mut none).unwrap();
    assert_eq!(none, crate::mcp::source::Input::default());
}

/// Before the bare slug has connected, its names are not "unknown" but not known yet.
#[tokio::test]
async fn a_bare_name_before_the_first_connect_is_unavailable_not_unknown() {
    let up = crate::testing::down_upstream(Default::default());
    let name = up.name.clone();
    let ctx = RoleContext::new("gateway");
    let gw = Gateway::with_upstreams(vec![up], Vec::new(), &ctx).bare(Some(&name));
    let r = gw
        .access
        .route_name(&Caller::local(), "memo_set", Names::Tools)
        .unwrap();
    assert!(
        matches!(r, Err(SourceError::Unavailable(ref m)) if m.contains("has not connected yet")),
        "{:?}",
        r.err()
    );
}
