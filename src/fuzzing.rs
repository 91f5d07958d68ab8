//! What every fuzz (property) harness beside a parser shares (compiled for tests only): the
//! bounded run configuration and the byte mangler.

use proptest::prelude::*;
use proptest::sample::Index;

/// `cases` unless `PROPTEST_CASES` asks for more (or fewer) in a longer run by hand.
pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        // A failure is shrunk for 10 s at most, so a failing run ends in bounded time too.
        max_shrink_time: 10_000,
        ..ProptestConfig::default()
    }
}

/// Up to five edits for [`mangle`].
pub fn mangles() -> impl Strategy<Value = Vec<(Index, u8, u8)>> {
    prop::collection::vec((any::<Index>(), any::<u8>(), any::<u8>()), 1..6)
}

/// `bytes` with bytes replaced, cut out, one of `pieces` put in, or cut short, one edit each.
pub fn mangle(bytes: &[u8], edits: &[(Index, u8, u8)], pieces: &[&[u8]]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    for (at, kind, b) in edits {
        let i = at.index(v.len() + 1);
        match kind % 4 {
            0 if i < v.len() => v[i] = *b,
            1 if i < v.len() => {
                let end = (i + usize::from(*b % 8) + 1).min(v.len());
                v.drain(i..end);
            }
            2 => {
                let piece = pieces[usize::from(*b) % pieces.len()];
                v.splice(i..i, piece.iter().copied());
            }
            _ => v.truncate(i),
        }
    }
    v
}
