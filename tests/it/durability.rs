//! `kill -9` in the middle of concurrent writes loses no acknowledged write (issue 17): rounds
//! of `herald memo --http` on one store file, each killed with SIGKILL right after a random
//! number of acknowledged `memo_set` calls while other calls are in flight, then restarted on
//! the same store, which must hold every acknowledged write (the value acknowledged or a
//! newer one it was sent).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::support::*;

const ROUNDS: u64 = 5;
/// Concurrent clients, each on its own connection, each writing its own keys.
const WRITERS: usize = 8;
/// Keys each writer cycles through, so a key is overwritten with ever newer values.
const KEYS_PER_WRITER: u64 = 4;
/// The kill comes right after this many acknowledgments, drawn anew each round.
const KILL_AFTER: std::ops::RangeInclusive<u64> = 20..=600;

/// xorshift64*: enough to draw kill points; the seed is printed to repeat a run.
struct Rng(u64);

impl Rng {
    fn seeded() -> (Rng, u64) {
        let seed = std::env::var("HERALD_IT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
            });
        (Rng(seed.max(1)), seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn in_range(&mut self, r: std::ops::RangeInclusive<u64>) -> u64 {
        r.start() + self.next() % (r.end() - r.start() + 1)
    }
}

/// What the clients know of the store: per key, the newest value acknowledged and the
/// newest value sent (acknowledged or not).
#[derive(Default)]
struct Known {
    acked: BTreeMap<String, u64>,
    sent: BTreeMap<String, u64>,
    /// Every acknowledged write, in no particular order.
    acks: Vec<(String, u64)>,
}

/// One round's writers share this.
struct Round {
    url: String,
    pid: u32,
    kill_after: usize,
    acks: AtomicUsize,
    killed: AtomicBool,
    known: Mutex<Known>,
}

async fn memo_set(http: &reqwest::Client, url: &str, key: &str, value: u64) -> Result<(), String> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"_meta": meta(), "name": "memo_set",
            "arguments": {"key": key, "value": value}}});
    let send = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "memo_set")
        .body(body.to_string())
        .send();
    let answer = tokio::time::timeout(WAIT, async {
        let r = send.await.map_err(|e| format!("sending: {e}"))?;
        let status = r.status();
        let text = r.text().await.map_err(|e| format!("reading: {e}"))?;
        Ok::<_, String>((status, text))
    })
    .await
    .map_err(|_| format!("no answer in {WAIT:?}"))??;
    let (status, text) = answer;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{status}: {text}: {e}"))?;
    if status == 200 && v.get("result").is_some() && v["result"]["isError"] != true {
        Ok(())
    } else {
        Err(format!("{status}: {text}"))
    }
}

/// Writer `w`: sets its keys to increasing values, one call at a time, recording each
/// acknowledgment; the one that brings the count to `kill_after` sends SIGKILL. Returns when
/// a call fails, which must be after the kill.
async fn writer(round: Arc<Round>, n: u64, w: usize) {
    let http = reqwest::Client::new();
    for i in 0u64.. {
        let key = format!("w{w}-k{}", i % KEYS_PER_WRITER);
        // Values grow across rounds too, so a key's value is always newer than the last.
        let value = n * 1_000_000 + i;
        round.known.lock().unwrap().sent.insert(key.clone(), value);
        if let Err(e) = memo_set(&http, &round.url, &key, value).await {
            assert!(
                round.killed.load(Ordering::SeqCst),
                "round {n}, writer {w}: a write failed before the kill: {e}"
            );
            return;
        }
        {
            let mut known = round.known.lock().unwrap();
            known.acked.insert(key.clone(), value);
            known.acks.push((key, value));
        }
        if round.acks.fetch_add(1, Ordering::SeqCst) + 1 == round.kill_after {
            round.killed.store(true, Ordering::SeqCst);
            // SAFETY: kill(2) with a pid this test spawned and has not reaped (the round
            // waits on it only after this), and a valid signal number; no memory is touched.
            let r = unsafe { libc::kill(round.pid as libc::pid_t, libc::SIGKILL) };
            assert_eq!(r, 0, "kill -9 {}", round.pid);
        }
    }
}

/// `herald memo --http` on `store`.
async fn start(store: &str) -> Server {
    Server::spawn(&["--store", store, "memo", "--http", "127.0.0.1:0"]).await
}

/// Reads the notes `server` holds and checks every acknowledged write is there, with its
/// value or a newer one sent after it, and nothing that was never sent.
async fn check(server: &Server, known: &Known, after: &str) {
    let conn = Memo {
        server: None,
        target: herald::transport::target::Target::Http(server.http_url()),
        trust: Default::default(),
    }
    .client()
    .await;
    let (notes, _) = read_json(&conn, "memo://notes").await;
    for (key, value) in &known.acks {
        let stored = notes[key].as_u64();
        assert!(
            stored.is_some_and(|s| s >= *value),
            "{after}: {key} was acknowledged as {value}, the store holds {stored:?}"
        );
    }
    let notes = notes.as_object().expect("notes are an object");
    let newer = notes
        .iter()
        .filter(|(k, v)| v.as_u64() > known.acked.get(*k).copied())
        .count();
    eprintln!("durability: {after}: {newer} notes hold a write sent but never acknowledged");
    for (key, stored) in notes {
        let sent = known.sent.get(key).copied();
        assert!(
            stored
                .as_u64()
                .is_some_and(|s| sent.is_some_and(|m| s <= m)),
            "{after}: {key} holds {stored}, never sent (newest sent: {sent:?})"
        );
    }
    conn.close().await;
}

#[tokio::test]
async fn kill_9_during_concurrent_writes_loses_no_acknowledged_write() {
    let (mut rng, seed) = Rng::seeded();
    eprintln!("durability: HERALD_IT_SEED={seed} repeats this run's kill points");
    let dir = TempDir::new("durability");
    let store = dir.path().join("herald.redb");
    let store = store.to_str().unwrap();
    let mut known = Known::default();
    for n in 0..ROUNDS {
        let mut server = start(store).await;
        check(
            &server,
            &known,
            &format!("restart before round {n} (seed {seed})"),
        )
        .await;
        let kill_after = rng.in_range(KILL_AFTER) as usize;
        let round = Arc::new(Round {
            url: server.http_url(),
            pid: server.pid(),
            kill_after,
            acks: AtomicUsize::new(0),
            killed: AtomicBool::new(false),
            known: Mutex::new(Known::default()),
        });
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| tokio::spawn(writer(round.clone(), n, w)))
            .collect();
        for w in writers {
            // A writer ends at the kill (its next call fails), or panics if a call fails before.
            tokio::time::timeout(WAIT * 4, w)
                .await
                .unwrap_or_else(|_| {
                    panic!("round {n}: the writers end after the kill (seed {seed})")
                })
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        }
        let status = tokio::time::timeout(WAIT, server.child.wait())
            .await
            .expect("herald dies of SIGKILL in time")
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "round {n}: {status}");
        let round = Arc::into_inner(round).expect("the writers are done");
        let got = round.known.into_inner().unwrap();
        assert!(
            got.acks.len() >= kill_after,
            "round {n}: {} acknowledged, the kill came after {kill_after}",
            got.acks.len()
        );
        eprintln!(
            "durability: round {n}: killed after ack {kill_after}, {} acknowledged in all",
            got.acks.len()
        );
        known.acks.extend(got.acks);
        known.acked.extend(got.acked);
        known.sent.extend(got.sent);
    }
    let server = start(store).await;
    check(
        &server,
        &known,
        &format!("restart after the last round (seed {seed})"),
    )
    .await;
    assert!(server.terminate().await.success());
}
