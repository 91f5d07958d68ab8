//! Fuzz (property) tests of `herald up`'s TOML config (and the tables it shares with
//! `herald file` and `herald slack`, and `herald watch`'s config), bounded so they run in
//! every `cargo test` (`cargo test fuzz` runs all of herald's): arbitrary text, mangled and
//! structurally mutated valid configs are `Ok` or `Err`, never a panic; a TOML error never
//! quotes a string of the file; and what checks `Ok` prints (`--print-config`) as a config
//! that checks `Ok` again and prints the same.

use std::path::Path;

use proptest::prelude::*;
use proptest::sample::Index;

use super::{UpToml, is_loopback};
use crate::gateway::config::fuzz::{
    HASH, SECRET, check_toml_error, config, edits, mangle, mangles, mutate, noise,
};

/// Where relative paths start: nothing is there.
const BASE: &str = "/nonexistent-herald-fuzz";

/// Parses and checks `text` as `herald up` does, and checks what an `Ok` promises.
fn check(text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = toml::from_str::<UpToml>(text) {
        check_toml_error(text, &e)?;
    }
    let parsed = match UpToml::parse(text, Path::new(BASE)) {
        Ok(t) => t,
        Err(e) => {
            let m = format!("{e:#}");
            prop_assert!(!m.contains(SECRET), "{}", m);
            return Ok(());
        }
    };
    // The tables `herald up` shares with the single-role commands build their configs
    // without panicking too.
    if let Some(f) = &parsed.file {
        let _ = f.to_config();
    }
    if let Some(s) = &parsed.slack {
        let _ = s.to_config();
    }
    let Ok(c) = parsed.check() else {
        return Ok(());
    };
    let roles = c.file.roles();
    prop_assert!(!roles.is_empty() || !c.slugs.is_empty());
    prop_assert!(c.slugs.iter().all(|s| !roles.contains(&s.name.as_str())));
    if c.tokens.is_empty() {
        for addr in [c.http(), c.quic()].into_iter().flatten() {
            prop_assert!(is_loopback(addr), "{} with no token", addr);
        }
    }
    for (i, w) in c.watches.iter().enumerate() {
        prop_assert!(c.watches[..i].iter().all(|o| o.0 != w.0), "{}", w.0);
    }
    // --print-config prints a config that checks and prints the same.
    let printed = c.to_toml();
    let again = UpToml::parse(&printed, Path::new(BASE)).and_then(UpToml::check);
    prop_assert!(again.is_ok(), "{:?} for\n{}", again.err(), printed);
    prop_assert_eq!(again.unwrap().to_toml(), printed);
    Ok(())
}

/// Valid `herald up` configs to start from.
fn seeds() -> Vec<String> {
    vec![
        include_str!("../../../packaging/etc/herald/up.toml").to_owned(),
        format!(
            "[listen]\nhttp = \"127.0.0.1:0\"\nquic = \"\"\nadmin = \"\"\n\
             allowed_hosts = [\"mcp.example.com\"]\n\
             [memo]\nring_capacity = 64\n\
             [file]\nroots = [\"data\", \"/srv\"]\ndebounce_ms = 10\n\
             [k8s]\nkubeconfigs = {{ prod = \"/etc/kube/prod\", dev = \"dev.conf\" }}\n\
             read_write = true\nlinger_ms = 5\n\
             [slack]\napi_url = \"http://127.0.0.1:1/api\"\nmax_events = 10\n\
             [[slug]]\nname = \"ext\"\nstdio = \"herald memo\"\n\
             [[slug]]\nname = \"far\"\nquic = \"10.0.0.5:8751\"\ntls_pin = \"{HASH}\"\n\
             [[token]]\nname = \"ops\"\nsha256 = \"{HASH}\"\nslugs = [\"memo\", \"ext\"]\n\
             [[token]]\nsha256 = \"{HASH}\"\nslugs = [\"*\"]\n\
             [[watch]]\nname = \"n\"\nuri = \"memo://notes\"\non_event = \"emit(event)\"\n\
             [[watch]]\nname = \"f\"\nuri = \"file-events://watch/srv?recursive=true\"\n\
             [notify]\nwebhook = \"http://127.0.0.1:1/hook\"\n"
        ),
        "[listen]\nhttp = \"[::1]:8750\"\n[[slug]]\nname = \"a\"\nhttp = \"http://x/mcp\"\n\
         [notify]\nexec = \"cat\"\n"
            .to_owned(),
    ]
}

/// `herald watch --config`'s file.
const WATCH_SEED: &str = "[[server]]\nstdio = \"herald memo\"\n\
     [[server]]\nhttp = \"http://127.0.0.1:1/mcp\"\n\
     [[watch]]\nname = \"n\"\nuri = \"memo://notes\"\non_event = \"emit(event)\"\n\
     [limits]\ndebounce_ms = 10\nmax_lines = 5\n";

fn check_watch(text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = toml::from_str::<crate::cli::watch::WatchFile>(text) {
        check_toml_error(text, &e)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn fuzz_up_config_arbitrary_text(text in noise()) {
        check(&text)?;
        check_watch(&text)?;
    }

    #[test]
    fn fuzz_up_config_mangled_text(seed in any::<Index>(), m in mangles()) {
        let seeds = seeds();
        check(&mangle(&seeds[seed.index(seeds.len())], &m))?;
        check_watch(&mangle(WATCH_SEED, &m))?;
    }

    #[test]
    fn fuzz_up_config_mutated_structure(seed in any::<Index>(), e in edits()) {
        let seeds = seeds();
        if let Some(text) = mutate(&seeds[seed.index(seeds.len())], &e) {
            check(&text)?;
        }
        if let Some(text) = mutate(WATCH_SEED, &e) {
            check_watch(&text)?;
        }
    }
}

/// The seeds are valid (else the mutations start from nothing).
#[test]
fn fuzz_up_config_seeds_are_valid() {
    for s in seeds() {
        UpToml::parse(&s, Path::new(BASE))
            .and_then(UpToml::check)
            .unwrap();
    }
    toml::from_str::<crate::cli::watch::WatchFile>(WATCH_SEED).unwrap();
}
