//! Where OAuth tokens and client registrations are kept: one row per server in the store's
//! `oauth` table, sealed (AES-256-GCM, the server's URL as associated data), so the store
//! file, or a backup of it, holds no usable token.
//!
//! The sealing key is `HERALD_STORE_KEY` (base64 or hex of 32 bytes; from the environment or
//! `$CREDENTIALS_DIRECTORY`) when set, else a key file beside the store (`<store>.key`, mode
//! 0600, made on the first save). A store in memory seals under a key of the process's own.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::flow::{Registered, Tokens};
use crate::store::seal::Sealer;
use crate::store::{Location, Store, Table};

/// The variable naming the store's sealing key.
pub const KEY_VAR: &str = "HERALD_STORE_KEY";

/// What is kept for one server.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
    match std::fs::read_to_string(&path) {
        Ok(text) => crate::store::seal::decode_key(&text)
            .map_err(|e| format!("the store's key file {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut k = [0u8; 32];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k)
                .map_err(|_| "no random source".to_owned())?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("cannot make the store's key file {}: {e}", path.display()))?;
            f.write_all(format!("{}\n", hex::encode(k)).as_bytes())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(k)
        }
        Err(e) => Err(format!(
            "cannot read the store's key file {}: {e}",
            path.display()
        )),
    }
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
            let plain = self.sealer.open(server, &row).map_err(|_| {
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
            let sealed = self.sealer.seal(server, &plain);
            self.store
                .put(Table::OAuth, server, sealed)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// A store opened on first use (a command that may never need it: `herald call` against a
/// server that asks for no authorization never opens the store).
pub struct Lazy {
    location: Location,
    open: tokio::sync::OnceCell<Result<Arc<StoreKeep>, String>>,
}

impl Lazy {
    pub fn new(location: Location) -> Lazy {
        Lazy {
            location,
            open: tokio::sync::OnceCell::new(),
        }
    }

    async fn get(&self) -> Result<Arc<StoreKeep>, String> {
        self.open
            .get_or_init(|| async {
                let location = self.location.clone();
                let store = tokio::task::spawn_blocking(move || Store::open(&location))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("cannot open the store for the kept OAuth tokens: {e}"))?;
                StoreKeep::new(store).map(Arc::new)
            })
            .await
            .clone()
    }
}

impl Keep for Lazy {
    fn load<'a>(&'a self, server: &'a str) -> BoxFuture<'a, Result<Option<Kept>, String>> {
        Box::pin(async move { self.get().await?.load(server).await })
    }
    fn save<'a>(&'a self, server: &'a str, kept: &'a Kept) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { self.get().await?.save(server, kept).await })
    }
}
