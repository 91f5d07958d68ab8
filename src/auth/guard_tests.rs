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
        assert!(!a.read_only(&caller(Some("test"))));
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
