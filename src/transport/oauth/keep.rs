//! Where OAuth tokens and client registrations are kept: one row per server in the store's
//! `oauth` table, sealed (AES-256-GCM, `oauth ` and the server's URL as associated data), so
//! the store file, or a backup of it, holds no usable token.
//!
//! The sealing key is `HERALD_STORE_KEY` (base64 or hex of 32 bytes; from the environment or
//! `$CREDENTIALS_DIRECTORY`) when set, else a key file beside the store (`<store>.key`, mode
//! 0600, made on the first save, written whole then linked into place; a key file that is a
//! symlink, or that others may read or write, is refused). A store in memory seals under a
//! key of the process's own.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::flow::{Registered, Tokens};
use crate::store::seal::Sealer;
use crate::store::{Location, Store, Table};

/// The variable naming the store's sealing key.
pub const KEY_VAR: &str = "HERALD_STORE_KEY";

/// What is kept for one server.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct Kept {
    #[serde(default)]
    pub tokens: Option<Tokens>,
    /// Registrations, per issuer.
    #[serde(default)]
    pub clients: std::collections::HashMap<String, Registered>,
}

/// Loads and saves what is kept per server.
pub trait Keep: Send + Sync {
    fn load<'a>(&'a self, server: &'a str) -> BoxFuture<'a, Result<Option<Kept>, String>>;
    fn save<'a>(&'a self, server: &'a str, kept: &'a Kept) -> BoxFuture<'a, Result<(), String>>;
    /// Whether the first request already takes what is kept (else only a server's challenge
    /// reads it: a store that is costly to open is opened only for a server that asks).
    fn eager(&self) -> bool {
        true
    }
}

/// The kept rows in an open store.
pub struct StoreKeep {
    store: Store,
    sealer: Sealer,
}

impl StoreKeep {
    /// Kept in `store`, sealed under its key (made beside it when there is none yet).
    pub fn new(store: Store) -> Result<StoreKeep, String> {
        let key = match store.location() {
            Location::File(p) => key_for(p)?,
            Location::Memory => {
                let mut k = [0u8; 32];
                ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k)
                    .map_err(|_| "no random source".to_owned())?;
                k
            }
        };
        Ok(StoreKeep {
            store,
            sealer: Sealer::new(&key),
        })
    }
}

/// The sealing key: `HERALD_STORE_KEY`, else `<store>.key` (made when missing).
fn key_for(store: &Path) -> Result<[u8; 32], String> {
    crate::runtime::secrets::register(KEY_VAR);
    if let Some(text) = std::env::var(KEY_VAR).ok().filter(|v| !v.trim().is_empty()) {
        return crate::store::seal::decode_key(&text).map_err(|e| format!("{KEY_VAR}: {e}"));
    }
    if let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY")
        && let Ok(text) = std::fs::read_to_string(PathBuf::from(dir).join(KEY_VAR))
    {
        return crate::store::seal::decode_key(&text).map_err(|e| format!("{KEY_VAR}: {e}"));
    }
    let mut path = store.as_os_str().to_owned();
    path.push(".key");
    let path = PathBuf::from(path);
    match std::fs::symlink_metadata(&path) {
        Ok(meta) => {
            use std::os::unix::fs::MetadataExt as _;
            // SAFETY: getuid(2) cannot fail and touches no memory.
            let uid = unsafe { libc::getuid() };
            if !meta.file_type().is_file() || meta.mode() & 0o077 != 0 || meta.uid() != uid {
                return Err(format!(
                    "the store's key file {} is not a plain file of this user that only it may \
                     read (chmod 600 it, or remove it and log in again)",
                    path.display()
                ));
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read the store's key file {}: {e}", path.display()))?;
            crate::store::seal::decode_key(&text)
                .map_err(|e| format!("the store's key file {}: {e}", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut k = [0u8; 32];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k)
                .map_err(|_| "no random source".to_owned())?;
            // Written whole under another name, then linked into place: never half a key,
            // and never over a key another process made meanwhile (that one is taken).
            let mut tmp = path.as_os_str().to_owned();
            tmp.push(format!(".{}.tmp", std::process::id()));
            let tmp = PathBuf::from(tmp);
            let written = (|| {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(format!("{}\n", hex::encode(k)).as_bytes())?;
                f.sync_all()?;
                std::fs::hard_link(&tmp, &path)
            })();
            let _ = std::fs::remove_file(&tmp);
            match written {
                Ok(()) => Ok(k),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => key_for(store),
                Err(e) => Err(format!(
                    "cannot make the store's key file {}: {e}",
                    path.display()
                )),
            }
        }
        Err(e) => Err(format!(
            "cannot read the store's key file {}: {e}",
            path.display()
        )),
    }
}

/// The associated data of a server's row: its table and its URL.
fn aad(server: &str) -> String {
    format!("oauth {server}")
}

impl Keep for StoreKeep {
    fn load<'a>(&'a self, server: &'a str) -> BoxFuture<'a, Result<Option<Kept>, String>> {
        Box::pin(async move {
            let Some(row) = self
                .store
                .get(Table::OAuth, server)
                .await
                .map_err(|e| e.to_string())?
            else {
                return Ok(None);
            };
            let plain = self.sealer.open(&aad(server), &row).map_err(|_| {
                format!("the kept OAuth row for {server} does not open with this store's key; log in again")
            })?;
            serde_json::from_slice(&plain).map(Some).map_err(|e| {
                format!("the kept OAuth row for {server} is unreadable ({e}); log in again")
            })
        })
    }

    fn save<'a>(&'a self, server: &'a str, kept: &'a Kept) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let plain = serde_json::to_vec(kept).map_err(|e| e.to_string())?;
            let sealed = self.sealer.seal(&aad(server), &plain);
            self.store
                .put(Table::OAuth, server, sealed)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// A store opened for each load and save, and closed after (a command that may never need
/// it: `herald call` against a server that asks for no authorization never opens it, and a
/// long `herald watch` does not hold it from the herald that owns it). One per process and
/// store: its loads and saves take turns.
pub struct Lazy {
    location: Location,
    turn: tokio::sync::Mutex<()>,
}

impl Lazy {
    pub fn new(location: Location) -> Lazy {
        Lazy {
            location,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    async fn open(&self) -> Result<StoreKeep, String> {
        let location = self.location.clone();
        let store = tokio::task::spawn_blocking(move || Store::open(&location))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot open the store of the kept OAuth tokens: {e}"))?;
        StoreKeep::new(store)
    }
}

impl Keep for Lazy {
    fn load<'a>(&'a self, server: &'a str) -> BoxFuture<'a, Result<Option<Kept>, String>> {
        Box::pin(async move {
            let _turn = self.turn.lock().await;
            let keep = self.open().await?;
            let kept = keep.load(server).await;
            keep.store.close().await;
            kept
        })
    }
    fn save<'a>(&'a self, server: &'a str, kept: &'a Kept) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let _turn = self.turn.lock().await;
            let keep = self.open().await?;
            let saved = keep.save(server, kept).await;
            keep.store.close().await;
            saved
        })
    }
    fn eager(&self) -> bool {
        false
    }
}
