//! Tests of a feed's ring, cursors and gaps, and of the receiver's signature check.

use super::receive::verify;
use super::*;

fn feed(webhook: bool) -> Feed {
    let f = Feed {
        id: "f".into(),
        secret: Secret::parse(&format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([7u8; 32])
        ))
        .unwrap(),
        resubscribe: tokio::sync::Notify::new(),
        state: Mutex::default(),
        version: watch::channel(0).0,
        used: Mutex::new(Instant::now()),
    };
    f.state.locked().webhook = webhook;
    f
}

fn ev(c: &str) -> Value {
    json!({"eventId": format!("e{c}"), "name": "n", "data": {}, "cursor": c})
}

fn known(r: Read) -> (Vec<String>, Option<String>, bool) {
    match r {
        Read::Known {
            events,
            cursor,
            truncated,
        } => (
            events
                .iter()
                .map(|e| e["eventId"].as_str().unwrap().to_owned())
                .collect(),
            cursor,
            truncated,
        ),
        Read::Unknown => panic!("unknown"),
    }
}

#[test]
fn a_feed_answers_from_any_cursor_it_holds_and_sends_others_upstream() {
    let f = feed(false);
    f.started(Some("10"), false);
    f.take(vec![ev("11"), ev("12"), ev("13")], false, Some("13"));
    assert_eq!(known(f.read(None, 10)), (vec![], Some("13".into()), false));
    assert_eq!(
        known(f.read(Some("10"), 10)),
        (
            vec!["e11".into(), "e12".into(), "e13".into()],
            Some("13".into()),
            false
        )
    );
    assert_eq!(
        known(f.read(Some("11"), 1)),
        (vec!["e12".into()], Some("12".into()), false)
    );
    assert_eq!(
        known(f.read(Some("13"), 10)),
        (vec![], Some("13".into()), false)
    );
    assert!(matches!(f.read(Some("9"), 10), Read::Unknown));
    // A gap is said once, on the first event after it, and a batch stops before it.
    f.take(vec![ev("20")], true, Some("20"));
    assert_eq!(
        known(f.read(Some("12"), 10)),
        (vec!["e13".into()], Some("13".into()), false)
    );
    assert_eq!(
        known(f.read(Some("13"), 10)),
        (vec!["e20".into()], Some("20".into()), true)
    );
}

#[test]
fn the_oldest_events_go_and_the_base_moves_with_them() {
    let f = feed(false);
    f.started(Some("0"), false);
    let evs: Vec<Value> = (1..=FEED_EVENTS + 5).map(|i| ev(&i.to_string())).collect();
    f.take(evs, false, None);
    assert!(matches!(f.read(Some("0"), 10), Read::Unknown));
    let (got, _, _) = known(f.read(Some("5"), 1));
    assert_eq!(got, ["e6"]);
}

#[test]
fn a_webhook_feed_numbers_its_events_and_answers_an_unknown_cursor_with_a_gap() {
    let f = feed(true);
    f.started(Some(&local_cursor(&f.id, 0)), false);
    f.take(
        vec![
            json!({"eventId": "a", "data": {}}),
            json!({"eventId": "b", "data": {}}),
        ],
        false,
        None,
    );
    let (c1, c2) = (local_cursor(&f.id, 1), local_cursor(&f.id, 2));
    assert_eq!(known(f.read(None, 10)), (vec![], Some(c2.clone()), false));
    assert_eq!(
        known(f.read(Some(&c1), 10)),
        (vec!["b".into()], Some(c2.clone()), false)
    );
    // Another feed's cursor (an older one of the same type, before a restart) is not
    // taken for this one's.
    let other = local_cursor("0123456789abcdef", 1);
    assert_ne!(other, c1);
    assert_eq!(
        known(f.read(Some(&other), 10)),
        (vec!["a".into(), "b".into()], Some(c2), true)
    );
}

#[test]
fn events_without_cursors_get_the_batchs_or_the_gateways_and_nothing_repeats() {
    let f = feed(false);
    f.started(Some("10"), false);
    let bare = |id: &str| json!({"eventId": id, "name": "n", "data": {}});
    // A stream's batch with no cursors at all, then a poll's with only the batch's.
    f.take(vec![bare("a"), bare("b")], false, None);
    f.take(vec![bare("c"), bare("d")], false, Some("20"));
    let mut at = Some("10".to_owned());
    let mut seen = Vec::new();
    for _ in 0..10 {
        let (evs, next, _) = known(f.read(at.as_deref(), 1));
        if evs.is_empty() {
            break;
        }
        seen.extend(evs);
        at = next;
    }
    assert_eq!(seen, ["a", "b", "c", "d"]);
    assert_eq!(at.as_deref(), Some("20"));
    // Each event carries its cursor as herald's polls give it.
    let Read::Known { events, .. } = f.read(Some("10"), 10) else {
        panic!("known");
    };
    assert_eq!(events[3]["_meta"][EVENT_CURSOR_META], "20");
    assert!(events[0]["_meta"][EVENT_CURSOR_META].is_string());
    // An empty batch that reports a gap: the next event says it.
    f.take(Vec::new(), true, None);
    f.take(vec![ev("30")], false, Some("30"));
    assert_eq!(
        known(f.read(Some("20"), 10)),
        (vec!["e30".into()], Some("30".into()), true)
    );
}

#[test]
fn a_signature_is_checked_against_the_feeds_secret_and_the_clock() {
    let f = feed(true);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let body = br#"{"type":"verification","challenge":"c"}"#;
    let sig = f.secret.sign("m1", now, body);
    let headers = |ts: u64, sig: String| {
        move |h: &str| match h {
            "webhook-id" => Some("m1".to_owned()),
            "webhook-timestamp" => Some(ts.to_string()),
            "webhook-signature" => Some(sig.clone()),
            _ => None,
        }
    };
    assert!(verify(&f.secret, &headers(now, format!("v1,x {sig}")), body).is_ok());
    assert!(verify(&f.secret, &headers(now, sig.clone()), b"{}").is_err());
    let old = f.secret.sign("m1", now - 600, body);
    assert!(verify(&f.secret, &headers(now - 600, old), body).is_err());
    assert!(verify(&f.secret, &|_| None, body).is_err());
}

#[test]
fn a_lost_cursor_is_answered_from_the_base_never_handed_back_or_sent_upstream() {
    // A webhook feed with nothing yet: the base, not the caller's unknown cursor.
    let f = feed(true);
    let base = local_cursor(&f.id, 0);
    f.started(Some(&base), false);
    assert_eq!(
        known(f.read(Some("gwolderfeed.7"), 10)),
        (vec![], Some(base), true)
    );
    // A stream feed: a cursor of the gateway's own it no longer holds is not the slug's to
    // answer; one of the slug's it does not hold goes to the slug.
    let f = feed(false);
    f.started(Some("10"), false);
    f.take(vec![ev("11")], false, Some("11"));
    assert_eq!(
        known(f.read(Some("gwolderfeed.7"), 10)),
        (vec!["e11".into()], Some("11".into()), true)
    );
    assert!(matches!(f.read(Some("5"), 10), Read::Unknown));
}

#[test]
fn an_event_sent_again_is_taken_once() {
    let f = feed(false);
    f.started(Some("10"), false);
    f.take(vec![ev("11"), ev("12")], false, Some("12"));
    // A stream that reopened from an older cursor replays them.
    f.take(vec![ev("11"), ev("12"), ev("13")], false, Some("13"));
    let (got, cursor, _) = known(f.read(Some("10"), 10));
    assert_eq!(got, ["e11", "e12", "e13"]);
    assert_eq!(cursor.as_deref(), Some("13"));
}
