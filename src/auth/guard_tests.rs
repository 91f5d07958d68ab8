//! The access file's rules, without a network: static tokens and scopes. Access tokens minted
//! by PyJWT against a real role are in tests/it/role_access.rs.

use super::*;
use sha2::Digest as _;

const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"; // "test"

fn caller(token: Option<&str>) -> Caller {
    Caller {
        token: token.map(str::to_owned),
        loopback: true,
        ..Caller::default()
    }
}

fn grant(scopes: &[&str]) -> Grant {
    Grant {
        issuer: "https://id.example.com".into(),
        principal: Some("p".into()),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        expires: u64::MAX / 2,
    }
}

#[test]
fn a_token_naming_the_role_or_every_role_lets_its_holder_in_and_no_one_else() {
    for slugs in ["[\"memo\"]", "[\"*\"]", "[\"file\", \"memo\"]"] {
        let a = RoleAccess::parse(
            &format!("[[token]]\nname = \"ops\"\nsha256 = \"{HASH}\"\nslugs = {slugs}\n"),
            "memo",
        )
        .unwrap();
        assert_eq!(
            a.authenticates(&caller(Some("test"))),
            Authentication::Known
        );
        assert!(a.may_write(&caller(Some("test"))));
        // A token that is no longer known may not write (fails closed).
        assert!(!a.may_write(&caller(Some("tesT"))));
        assert!(!a.may_write(&caller(None)));
        assert!(a.may_write(&Caller::local()));
        assert_eq!(
            a.authenticates(&caller(Some("tesT"))),
            Authentication::UnknownToken
        );
        // Loopback is no exemption once there is a file; stdio is.
        assert_eq!(
            a.authenticates(&caller(None)),
            Authentication::TokenRequired
        );
        assert_eq!(a.authenticates(&Caller::local()), Authentication::Known);
    }
    assert_eq!(
        hex::encode(sha2::Sha256::digest(b"test")),
        HASH,
        "the fixture's hash"
    );
}

#[test]
fn scopes_entitle_the_role_whole_or_for_reading() {
    let a = RoleAccess::parse(
        "[[issuer]]\nurl = \"https://id.example.com\"\naudience = \"https://h/mcp\"\n",
        "memo",
    )
    .unwrap();
    for (scopes, expect) in [
        (&["herald:memo"][..], Some(false)),
        (&["herald:*"], Some(false)),
        (&["herald:memo:read"], Some(true)),
        (&["herald:*:read"], Some(true)),
        (&["herald:memo:read", "herald:memo"], Some(false)),
        (&["herald:*:read", "herald:memo"], Some(false)),
        (&["herald:file"], None),
        (
            &["herald:memo2", "herald:mem", "memo", "herald:memo:write"],
            None,
        ),
        (&[], None),
    ] {
        assert_eq!(a.entitles(&grant(scopes)), expect, "{scopes:?}");
    }
}

#[test]
fn a_file_that_lets_no_one_in_or_is_not_an_access_file_is_refused() {
    for (text, says) in [
        ("", "no [[token]] and no [[issuer]]"),
        (
            &*format!("[[token]]\nsha256 = \"{HASH}\"\nslugs = [\"file\"]\n"),
            "slugs must name memo",
        ),
        (
            "[[token]]\nsha256 = \"abc\"\nslugs = [\"*\"]\n",
            "64 hex digits",
        ),
        (&*format!("[[token]]\nsha256 = \"{HASH}\"\n"), "slugs"),
        ("http = \"127.0.0.1:1\"\n", "unknown field"),
        ("[[issuer]]\nurl = \"https://id.example.com\"\n", "audience"),
    ] {
        let e = RoleAccess::parse(text, "memo").unwrap_err();
        assert!(e.contains(says), "{text}: {e}");
    }
}

/// Every operation checks its caller again (a webhook subscription polls with the token it
/// was made with, long after), and one that may not write lists and calls only what reads.
#[tokio::test]
async fn every_operation_checks_its_caller_and_writes_fail_closed() {
    let a = RoleAccess::parse(
        &format!("[[token]]\nsha256 = \"{HASH}\"\nslugs = [\"memo\"]\n"),
        "memo",
    )
    .unwrap();
    let memo = crate::source::memo::Memo::open(crate::store::Store::memory(), 16, None)
        .await
        .unwrap();
    let g = Guarded::new(a, Arc::new(memo));
    let (good, gone) = (caller(Some("test")), caller(Some("revoked")));
    let poll = |name: &str| {
        serde_json::json!({"name": name, "cursor": null})
            .as_object()
            .unwrap()
            .clone()
    };
    assert!(g.events_poll(&good, poll("memo.changed")).await.is_ok());
    assert_eq!(
        g.events_poll(&gone, poll("memo.changed"))
            .await
            .unwrap_err(),
        SourceError::Forbidden
    );
    assert_eq!(
        g.read(&gone, Read::after("memo://notes", None))
            .await
            .unwrap_err(),
        SourceError::Forbidden
    );
    assert!(g.events_list(&gone).await.is_err());
    let all: Vec<String> = g.tools(&good).iter().map(|t| t.name.to_string()).collect();
    let reads: Vec<String> = g.tools(&gone).iter().map(|t| t.name.to_string()).collect();
    assert!(all.contains(&"memo_set".into()), "{all:?}");
    assert!(!reads.contains(&"memo_set".into()) && reads.len() < all.len());
    assert!(g.tool(&gone, "memo_set").is_none());
    let args = serde_json::json!({"key": "k", "value": 1})
        .as_object()
        .unwrap()
        .clone();
    let refused = g
        .call_tool(&gone, "memo_set", args.clone(), Call::default())
        .await
        .unwrap_err();
    assert_eq!(refused, SourceError::Forbidden);
    assert!(
        g.call_tool(&good, "memo_set", args, Call::default())
            .await
            .is_ok()
    );
}
