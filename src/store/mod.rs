//! The store: one redb file per process, and the only module that names redb.
//!
//! Every role that keeps state (memo notes, the QUIC identity, saved watch specs, the
//! sealed Slack buffer, the tasks) keeps it here, as byte values under string keys in one of a
//! fixed set of [`Table`]s. Writes go to a single writer thread through a bounded channel; the
//! thread folds whatever is queued into one transaction, so a burst of writes costs one commit.
//! Reads run on tokio's blocking pool. No file I/O blocks a runtime worker.
//!
//! A write's future resolves once the write is durable (in memory: committed). When the writer
//! is behind and the channel is full, the caller waits for room on the blocking pool, never on
//! a runtime worker. Opening checks the schema version and refuses a file a newer herald wrote.
//!
//! An in-memory store (`--store :memory:`) has no I/O to wait for: a small write commits in the
//! caller's task when no other write holds redb's lock, a few microseconds of work where the
//! hop to a thread and back costs ten times more in wake-ups (measured in `cargo bench --bench
//! watch`); a big one, or one meeting another write, joins the writer thread's next batch. They
//! commit without redb's durability bookkeeping ([`redb::Durability::None`]), but for every
//! [`MEMORY_DURABLE_EVERY`]th, which settles what redb keeps in memory about the others (its
//! list of commits not yet durable).
//!
//! redb holds an exclusive file lock, so a second process that opens the same file gets
//! [`StoreError::Locked`], which names the file, the holder's pid (from the [`pid_file`] the
//! holder writes beside it) and the flags that give a process a store of its own. A backup
//! is therefore made by whichever process holds the file ([`Store::backup_to`], from one read
//! transaction; see `backup.rs`).

mod backup;
pub mod seal;

use crate::sync::Recover;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

pub use backup::{KEEP_BACKUPS, Snapshot, backups_dir, is_backup_of, move_file};

/// The schema version this build writes. A file with a newer version is refused.
pub const SCHEMA_VERSION: u64 = 1;

/// Writes queued to the writer thread before `put`/`delete` wait for room.
const WRITE_QUEUE: usize = 1024;
/// Most writes folded into one transaction.
const MAX_BATCH: usize = 512;
/// One in this many commits of an in-memory store is made durable (see the module docs).
const MEMORY_DURABLE_EVERY: u64 = 64;
/// The most rows an in-memory store writes in the caller's task (more go to the writer thread).
const IN_PLACE_ROWS: usize = 64;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NOTES: TableDefinition<&str, &[u8]> = TableDefinition::new("memo_notes");
const IDENTITY: TableDefinition<&str, &[u8]> = TableDefinition::new("identity");
const WATCHES: TableDefinition<&str, &[u8]> = TableDefinition::new("watch_specs");
const SLACK_BUFFER: TableDefinition<&str, &[u8]> = TableDefinition::new("slack_buffer");
const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
const WEBHOOKS: TableDefinition<&str, &[u8]> = TableDefinition::new("webhook_subscriptions");
const OAUTH: TableDefinition<&str, &[u8]> = TableDefinition::new("oauth");

/// The tables herald keeps. Each maps string keys to opaque bytes (JSON by convention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// `herald memo`'s notes: key → JSON value.
    Notes,
    /// TLS identities: `quic.identity` → cert and key DER, hex, in one JSON value.
    Identity,
    /// Saved watch specs (`--watch-state`): name → JSON spec.
    Watches,
    /// `herald slack`'s buffer: `m:<channel>:<ts>` → a sealed event, `state` → its sealed
    /// cursor state. Nothing in it is readable without the role's key.
    SlackBuffer,
    /// The tasks extension's tasks: `<role>/<task id>` → who made it, when, and its state
    /// (kept when made and when it ends).
    Tasks,
    /// Webhook subscriptions to event types (`events/subscribe`): `<role>/<id>` → a sealed
    /// subscription (its callback URL, secrets, subscriber and delivery cursor are
    /// credentials).
    Webhooks,
    /// herald's OAuth client: `<server URL>` → its sealed tokens and registrations
    /// (`transport::oauth::keep`).
    OAuth,
}

impl Table {
    fn def(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        match self {
            Table::Notes => NOTES,
            Table::Identity => IDENTITY,
            Table::Watches => WATCHES,
            Table::SlackBuffer => SLACK_BUFFER,
            Table::Tasks => TASKS,
            Table::Webhooks => WEBHOOKS,
            Table::OAuth => OAUTH,
        }
    }
}

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A file on disk.
    File(PathBuf),
    /// Nothing on disk; gone when the process exits (`--store :memory:`).
    Memory,
}

impl Location {
    /// Parses `--store`: `:memory:` or a path.
    pub fn parse(s: &str) -> Location {
        if s == ":memory:" {
            Location::Memory
        } else {
            Location::File(PathBuf::from(s))
        }
    }

    /// The default path: `$STATE_DIRECTORY/herald.redb` (systemd), else
    /// `$XDG_STATE_HOME/herald/herald.redb`, else `~/.local/state/herald/herald.redb`.
    pub fn default_path() -> Result<Location, StoreError> {
        default_path_from(|k| std::env::var_os(k))
    }
}

fn default_path_from(
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Location, StoreError> {
    let nonempty = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(dirs) = nonempty("STATE_DIRECTORY") {
        // systemd passes a colon-separated list when StateDirectory= names several.
        let first = dirs
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or("")
            .to_owned();
        if !first.is_empty() {
            return Ok(Location::File(Path::new(&first).join("herald.redb")));
        }
    }
    if let Some(xdg) = nonempty("XDG_STATE_HOME") {
        return Ok(Location::File(
            PathBuf::from(xdg).join("herald/herald.redb"),
        ));
    }
    if let Some(home) = nonempty("HOME") {
        return Ok(Location::File(
            PathBuf::from(home).join(".local/state/herald/herald.redb"),
        ));
    }
    Err(StoreError::NoDefaultPath)
}

/// What can go wrong with the store. Messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "store {path} is held by {}; stop it, or give this herald a store of its own with --store PATH (or --store :memory: to keep nothing on disk)",
        holder.map_or("another herald process".to_owned(), |pid| format!("herald process {pid}"))
    )]
    Locked {
        path: PathBuf,
        /// The holder's pid, from its [`pid_file`] (when it wrote one and still runs).
        holder: Option<u32>,
    },
    #[error(
        "store {path} has schema version {found}, newer than this herald understands ({supported}); upgrade herald or use another --store"
    )]
    NewerSchema {
        path: PathBuf,
        found: u64,
        supported: u64,
    },
    #[error("cannot create the store directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "no default store path: none of STATE_DIRECTORY, XDG_STATE_HOME or HOME is set; pass --store PATH or --store :memory:"
    )]
    NoDefaultPath,
    #[error("store {path}: {message}")]
    Open { path: PathBuf, message: String },
    #[error("store I/O failed: {0}")]
    Io(String),
    #[error("the store writer has stopped; herald is shutting down")]
    Closed,
    #[error("{path} exists already")]
    BackupExists { path: PathBuf },
    #[error("cannot write the backup {path}: {message}")]
    Backup { path: PathBuf, message: String },
    #[error("the store is in memory (--store :memory:): there is no file to back up")]
    InMemory,
}

/// `<store>.pid`, beside the store file: the pid of the process holding it, written once the
/// lock is taken, so a process refused the file can say who holds it (redb's lock names no
/// one, and what `/proc/locks` shows of it depends on redb's locking scheme). Only read when
/// the lock is held by someone, so a file left by a process that was killed misleads no one.
pub fn pid_file(store: &Path) -> PathBuf {
    let mut p = store.as_os_str().to_owned();
    p.push(".pid");
    PathBuf::from(p)
}

/// The pid [`pid_file`] names, when that process still runs and is a herald (a file left
/// by a killed holder may name a pid since reused by something else).
fn holder(store: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(pid_file(store)).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    let comm =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("comm")).ok()?;
    comm.trim().starts_with("herald").then_some(pid)
}

/// This process's claim in [`pid_file`], from the open until the last handle is gone.
struct Held {
    pid_file: PathBuf,
}

impl Held {
    /// Writes the pid file (whole, by a rename). Failing to is only logged: the store works
    /// without it, and a second process then says "another herald process".
    fn take(store: &Path) -> Held {
        let pid_file = pid_file(store);
        let mut tmp = pid_file.as_os_str().to_owned();
        tmp.push(format!(".tmp-{}", std::process::id()));
        // Created afresh, never through a link someone planted under the (predictable) name:
        // a store in a shared directory must not let another user aim this write elsewhere.
        let _ = std::fs::remove_file(&tmp);
        let written = {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)
                .and_then(|mut f| writeln!(f, "{}", std::process::id()))
                .and_then(|()| std::fs::rename(&tmp, &pid_file))
        };
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!(file = %pid_file.display(), error = %e, "cannot write the store's pid file");
        }
        Held { pid_file }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Only our own: a later holder's file stays.
        let ours = std::fs::read_to_string(&self.pid_file)
            .is_ok_and(|t| t.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.pid_file);
        }
    }
}

fn io_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

enum WriteOp {
    Put {
        table: Table,
        key: String,
        value: Vec<u8>,
    },
    Delete {
        table: Table,
        key: String,
    },
    /// Many puts and deletes in one table, in one transaction.
    Batch {
        table: Table,
        puts: Vec<(String, Vec<u8>)>,
        deletes: Vec<String>,
    },
}

impl WriteOp {
    /// How many rows it writes.
    fn rows(&self) -> usize {
        match self {
            WriteOp::Put { .. } | WriteOp::Delete { .. } => 1,
            WriteOp::Batch { puts, deletes, .. } => puts.len() + deletes.len(),
        }
    }
}

struct Job {
    op: WriteOp,
    reply: oneshot::Sender<Result<bool, StoreError>>,
}

/// How writes reach the database.
#[derive(Clone)]
struct Writer {
    /// The writer thread's queue.
    queue: std_mpsc::SyncSender<Job>,
    /// The writer thread, joined by [`Store::close`].
    thread: Arc<std::sync::Mutex<Option<std::thread::JoinHandle<()>>>>,
    /// In memory only: the commits made so far (for the durable one in
    /// [`MEMORY_DURABLE_EVERY`]), and the leave to commit a small write in the caller's task.
    memory: Option<Arc<AtomicU64>>,
    /// Writes queued and not yet answered. In memory, no write commits in its caller's task
    /// while any is: redb's lock goes to whoever asks first, and a steady run of small writes
    /// could otherwise keep the thread from it (and a write could overtake one queued before
    /// it, whose caller gave up waiting).
    queued: Arc<AtomicUsize>,
}

/// A handle to the open store. Cheap to clone; the writer thread stops when the last clone
/// drops (a handle kept forever keeps its thread).
#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
    writer: Writer,
    location: Arc<Location>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("location", &self.location)
            .finish()
    }
}

impl Store {
    /// Opens (creating if needed) the store. Blocking: call it at start-up or in
    /// `spawn_blocking`.
    pub fn open(location: &Location) -> Result<Store, StoreError> {
        let db = match location {
            Location::Memory => redb::Builder::new()
                .create_with_backend(redb::backends::InMemoryBackend::new())
                .map_err(|e| StoreError::Open {
                    path: PathBuf::from(":memory:"),
                    message: e.to_string(),
                })?,
            Location::File(path) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                        path: dir.to_owned(),
                        source,
                    })?;
                }
                let db = Database::create(path).map_err(|e| match e {
                    redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked {
                        path: path.clone(),
                        holder: holder(path),
                    },
                    other => StoreError::Open {
                        path: path.clone(),
                        message: other.to_string(),
                    },
                })?;
                // The store holds the QUIC private key: keep it to its owner.
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
                }
                db
            }
        };
        let display = match location {
            Location::File(p) => p.clone(),
            Location::Memory => PathBuf::from(":memory:"),
        };
        check_schema(&db, &display)?;
        let db = Arc::new(db);
        let held = match location {
            Location::File(p) => Some(Held::take(p)),
            Location::Memory => None,
        };
        let memory = matches!(location, Location::Memory).then(Arc::default);
        let (queue, rx) = std_mpsc::sync_channel::<Job>(WRITE_QUEUE);
        let queued = Arc::new(AtomicUsize::new(0));
        let (wdb, commits, left) = (db.clone(), memory.clone(), queued.clone());
        let thread = std::thread::Builder::new()
            .name("herald-store".into())
            .spawn(move || {
                writer_loop(&wdb, rx, commits.as_deref(), &left);
                // Every handle is gone: the file is let go of (with the last `wdb`) next.
                drop(held);
            })
            .map_err(io_err)?;
        Ok(Store {
            db,
            writer: Writer {
                queue,
                thread: Arc::new(std::sync::Mutex::new(Some(thread))),
                memory,
                queued,
            },
            location: Arc::new(location.clone()),
        })
    }

    /// An in-memory store, for tests and `--store :memory:`.
    pub fn memory() -> Store {
        Store::open(&Location::Memory)
            .expect("an in-memory store opens unless no thread can be started")
    }

    /// Drops this handle; when it is the last one (and no read or backup is in flight), waits
    /// until the writer thread has let go of the file, so it can be opened again at once (a
    /// restart within one process).
    pub async fn close(self) {
        // The writer thread holds the other reference to the database.
        let last = Arc::strong_count(&self.db) <= 2;
        let Store { db, writer, .. } = self;
        let thread = if last {
            writer.thread.locked().take()
        } else {
            None
        };
        drop(writer);
        drop(db);
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Stores `value` under `key`, durably, before returning.
    pub async fn put(&self, table: Table, key: &str, value: Vec<u8>) -> Result<(), StoreError> {
        self.submit(WriteOp::Put {
            table,
            key: key.to_owned(),
            value,
        })
        .await
        .map(|_| ())
    }

    /// Removes `key`; returns whether it existed.
    pub async fn delete(&self, table: Table, key: &str) -> Result<bool, StoreError> {
        self.submit(WriteOp::Delete {
            table,
            key: key.to_owned(),
        })
        .await
    }

    /// Writes `puts` and removes `deletes` in `table`, all in one transaction, durably,
    /// before returning.
    pub async fn write_batch(
        &self,
        table: Table,
        puts: Vec<(String, Vec<u8>)>,
        deletes: Vec<String>,
    ) -> Result<(), StoreError> {
        if puts.is_empty() && deletes.is_empty() {
            return Ok(());
        }
        self.submit(WriteOp::Batch {
            table,
            puts,
            deletes,
        })
        .await
        .map(|_| ())
    }

    async fn submit(&self, op: WriteOp) -> Result<bool, StoreError> {
        // In memory, a small write commits here when the write lock is free: a worker never
        // waits for another write, nor spends long on a big one.
        if let Some(commits) = &self.writer.memory
            && op.rows() <= IN_PLACE_ROWS
            && let Ok(tx) = self.db.try_begin_write()
            && self.writer.queued.load(Ordering::Acquire) == 0
        {
            let done = apply_in(tx, [&op], durable(Some(commits.as_ref())));
            // A write is a point where other tasks run, as it is with the hop: a loop of
            // writes never holds a worker from what each write wakes.
            tokio::task::yield_now().await;
            return done
                .map(|r| r.first().copied().unwrap_or(true))
                .map_err(|msg| StoreError::Io(commit_failed(msg, 1)));
        }
        let (reply, rx) = oneshot::channel();
        let job = Job { op, reply };
        // The channel is bounded; when it is full the writer is behind, and we wait for room
        // on the blocking pool rather than on a runtime worker.
        let queued = self.writer.queued.clone();
        queued.fetch_add(1, Ordering::AcqRel);
        match self.writer.queue.try_send(job) {
            Ok(()) => {}
            Err(std_mpsc::TrySendError::Disconnected(_)) => {
                queued.fetch_sub(1, Ordering::AcqRel);
                return Err(StoreError::Closed);
            }
            Err(std_mpsc::TrySendError::Full(job)) => {
                let queue = self.writer.queue.clone();
                tokio::task::spawn_blocking(move || {
                    let sent = queue.send(job);
                    if sent.is_err() {
                        queued.fetch_sub(1, Ordering::AcqRel);
                    }
                    sent
                })
                .await
                .map_err(io_err)?
                .map_err(|_| StoreError::Closed)?;
            }
        }
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Reads one value.
    pub async fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let db = self.db.clone();
        let key = key.to_owned();
        tokio::task::spawn_blocking(move || {
            let tx = db.begin_read().map_err(io_err)?;
            let t = match tx.open_table(table.def()) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(io_err(e)),
            };
            Ok(t.get(key.as_str())
                .map_err(io_err)?
                .map(|g| g.value().to_vec()))
        })
        .await
        .map_err(io_err)?
    }

    /// Reads a whole table, in key order.
    pub async fn scan(&self, table: Table) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let tx = db.begin_read().map_err(io_err)?;
            let t = match tx.open_table(table.def()) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(io_err(e)),
            };
            let mut out = Vec::new();
            for row in t.iter().map_err(io_err)? {
                let (k, v) = row.map_err(io_err)?;
                out.push((k.value().to_owned(), v.value().to_vec()));
            }
            Ok(out)
        })
        .await
        .map_err(io_err)?
    }
}

fn check_schema(db: &Database, path: &Path) -> Result<(), StoreError> {
    let tx = db.begin_write().map_err(io_err)?;
    {
        let mut meta = tx.open_table(META).map_err(io_err)?;
        let found = meta
            .get("schema_version")
            .map_err(io_err)?
            .map(|g| g.value());
        match found {
            Some(v) if v > SCHEMA_VERSION => {
                return Err(StoreError::NewerSchema {
                    path: path.to_owned(),
                    found: v,
                    supported: SCHEMA_VERSION,
                });
            }
            Some(v) if v == SCHEMA_VERSION => {}
            _ => {
                meta.insert("schema_version", SCHEMA_VERSION)
                    .map_err(io_err)?;
            }
        }
    }
    tx.commit().map_err(io_err)
}

/// The writer thread: each commit takes whatever is queued. `memory` is an in-memory store's
/// commit count (its commits are durable only now and then), `None` for a file; `queued`
/// counts the writes sent and not yet answered.
fn writer_loop(
    db: &Database,
    rx: std_mpsc::Receiver<Job>,
    memory: Option<&AtomicU64>,
    queued: &AtomicUsize,
) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let done = apply(db, batch.iter().map(|j| &j.op), durable(memory));
        queued.fetch_sub(batch.len(), Ordering::AcqRel);
        match done {
            Ok(results) => {
                for (job, r) in batch.into_iter().zip(results) {
                    let _ = job.reply.send(Ok(r));
                }
            }
            Err(msg) => {
                let msg = commit_failed(msg, batch.len());
                for job in batch {
                    let _ = job.reply.send(Err(StoreError::Io(msg.clone())));
                }
            }
        }
    }
}

/// Whether the next commit is made durable: a file's always; in memory (`commits` counts
/// them) one in [`MEMORY_DURABLE_EVERY`].
fn durable(commits: Option<&AtomicU64>) -> bool {
    commits.is_none_or(|c| {
        c.fetch_add(1, Ordering::Relaxed) % MEMORY_DURABLE_EVERY == MEMORY_DURABLE_EVERY - 1
    })
}

/// Logs a failed commit of `writes` writes; returns its message, for each write's error.
fn commit_failed(msg: String, writes: usize) -> String {
    tracing::error!(error = %msg, writes, "store commit failed");
    msg
}

/// Writes `ops` in one transaction, made durable (else see the module docs on memory).
fn apply<'a>(
    db: &Database,
    ops: impl IntoIterator<Item = &'a WriteOp>,
    durable: bool,
) -> Result<Vec<bool>, String> {
    apply_in(db.begin_write().map_err(|e| e.to_string())?, ops, durable)
}

/// [`apply`] in the write transaction `tx`.
fn apply_in<'a>(
    mut tx: redb::WriteTransaction,
    ops: impl IntoIterator<Item = &'a WriteOp>,
    durable: bool,
) -> Result<Vec<bool>, String> {
    if !durable {
        tx.set_durability(redb::Durability::None)
            .map_err(|e| e.to_string())?;
    }
    let mut results = Vec::new();
    for op in ops {
        match op {
            WriteOp::Put { table, key, value } => {
                let mut t = tx.open_table(table.def()).map_err(|e| e.to_string())?;
                t.insert(key.as_str(), value.as_slice())
                    .map_err(|e| e.to_string())?;
                results.push(true);
            }
            WriteOp::Delete { table, key } => {
                let mut t = tx.open_table(table.def()).map_err(|e| e.to_string())?;
                let existed = t.remove(key.as_str()).map_err(|e| e.to_string())?.is_some();
                results.push(existed);
            }
            WriteOp::Batch {
                table,
                puts,
                deletes,
            } => {
                let mut t = tx.open_table(table.def()).map_err(|e| e.to_string())?;
                for (key, value) in puts {
                    t.insert(key.as_str(), value.as_slice())
                        .map_err(|e| e.to_string())?;
                }
                for key in deletes {
                    t.remove(key.as_str()).map_err(|e| e.to_string())?;
                }
                results.push(true);
            }
        }
    }
    tx.commit().map_err(|e| e.to_string())?;
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory store's commits, all but one in [`MEMORY_DURABLE_EVERY`] without redb's
    /// durability bookkeeping, leave it free to reuse pages: 20,000 writes of eight notes
    /// take no more room than the first 2,000, and the last value of each is read back.
    #[test]
    fn in_memory_commits_reuse_their_pages() {
        #[derive(Debug)]
        struct Measured(redb::backends::InMemoryBackend, Arc<AtomicU64>);
        impl redb::StorageBackend for Measured {
            fn len(&self) -> Result<u64, std::io::Error> {
                self.0.len()
            }
            fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
                self.0.read(offset, out)
            }
            fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
                self.1.fetch_max(len, Ordering::Relaxed);
                self.0.set_len(len)
            }
            fn sync_data(&self) -> Result<(), std::io::Error> {
                self.0.sync_data()
            }
            fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
                self.0.write(offset, data)
            }
        }
        let most = Arc::new(AtomicU64::new(0));
        let db = redb::Builder::new()
            .create_with_backend(Measured(
                redb::backends::InMemoryBackend::new(),
                most.clone(),
            ))
            .unwrap();
        let write = |i: u64| {
            let op = WriteOp::Put {
                table: Table::Notes,
                key: format!("k{}", i % 8),
                value: vec![i as u8; 3_000],
            };
            let durable = i % MEMORY_DURABLE_EVERY == MEMORY_DURABLE_EVERY - 1;
            apply(&db, [&op], durable).unwrap();
        };
        (0..2_000).for_each(write);
        let early = most.load(Ordering::Relaxed);
        (2_000..20_000).for_each(write);
        let late = most.load(Ordering::Relaxed);
        assert!(late <= early, "grew from {early} to {late} bytes");
        let tx = db.begin_read().unwrap();
        let t = tx.open_table(Table::Notes.def()).unwrap();
        let kept = t.get("k7").unwrap().unwrap().value().to_vec();
        assert_eq!(kept, vec![19_999u64 as u8; 3_000]);
    }

    #[tokio::test]
    async fn put_get_delete_scan() {
        let s = Store::memory();
        s.put(Table::Notes, "b", b"2".to_vec()).await.unwrap();
        s.put(Table::Notes, "a", b"1".to_vec()).await.unwrap();
        assert_eq!(s.get(Table::Notes, "a").await.unwrap(), Some(b"1".to_vec()));
        assert_eq!(s.get(Table::Identity, "a").await.unwrap(), None);
        let all = s.scan(Table::Notes).await.unwrap();
        assert_eq!(
            all,
            vec![("a".into(), b"1".to_vec()), ("b".into(), b"2".to_vec())]
        );
        assert!(s.delete(Table::Notes, "a").await.unwrap());
        assert!(!s.delete(Table::Notes, "a").await.unwrap());
    }

    #[tokio::test]
    async fn a_write_batch_puts_and_deletes_together() {
        let s = Store::memory();
        s.put(Table::SlackBuffer, "gone", vec![0]).await.unwrap();
        s.write_batch(
            Table::SlackBuffer,
            vec![("a".into(), vec![1]), ("b".into(), vec![2])],
            vec!["gone".into()],
        )
        .await
        .unwrap();
        let rows = s.scan(Table::SlackBuffer).await.unwrap();
        assert_eq!(rows, vec![("a".into(), vec![1]), ("b".into(), vec![2])]);
    }

    /// 2,000 writes at once all land: a file's batched by its writer thread; in memory, each
    /// in its task or, meeting another, in the writer thread's batch; a big batch there too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_all_land_in_a_file_and_in_memory() {
        let dir = std::env::temp_dir().join(format!("herald-store-burst-{}", std::process::id()));
        let file = Store::open(&Location::File(dir.join("h.redb"))).unwrap();
        for s in [file, Store::memory()] {
            let mut tasks = Vec::new();
            for i in 0..2000 {
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    s.put(Table::Notes, &format!("k{i:05}"), vec![1]).await
                }));
            }
            for t in tasks {
                t.await.unwrap().unwrap();
            }
            let big = (0..1000).map(|i| (format!("b{i:04}"), vec![2])).collect();
            s.write_batch(Table::Notes, big, vec!["k00000".into()])
                .await
                .unwrap();
            assert_eq!(s.scan(Table::Notes).await.unwrap().len(), 2999, "{s:?}");
            s.close().await;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// In memory, a write queued to the thread (its lock was taken) is not overtaken by a
    /// later one that finds the lock free, even when the first one's caller gave up: the
    /// later value is the one kept.
    #[tokio::test]
    async fn a_write_never_overtakes_one_queued_before_it_in_memory() {
        let s = Store::memory();
        let held = s.db.begin_write().unwrap();
        let early = tokio::spawn({
            let s = s.clone();
            async move { s.put(Table::Notes, "k", b"old".to_vec()).await }
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while s.writer.queued.load(Ordering::Acquire) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the write is queued");
        early.abort();
        drop(held);
        s.put(Table::Notes, "k", b"new".to_vec()).await.unwrap();
        assert_eq!(
            s.get(Table::Notes, "k").await.unwrap(),
            Some(b"new".to_vec())
        );
    }

    #[test]
    fn second_open_of_a_file_is_refused_with_the_path() {
        let dir = std::env::temp_dir().join(format!("herald-store-lock-{}", std::process::id()));
        let path = dir.join("h.redb");
        let _first = Store::open(&Location::File(path.clone())).unwrap();
        let err = Store::open(&Location::File(path.clone())).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Locked { .. }), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        let me = format!("herald process {}", std::process::id());
        assert!(msg.contains(&me), "the holder's pid: {msg}");
        assert!(
            msg.contains("--store PATH") && msg.contains("--store :memory:"),
            "{msg}"
        );
        // Without a pid file (a holder that could not write one), still the flags.
        std::fs::remove_file(pid_file(&path)).unwrap();
        let msg = Store::open(&Location::File(path.clone()))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("another herald process"), "{msg}");
        drop(_first);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = std::env::temp_dir().join(format!("herald-store-schema-{}", std::process::id()));
        let path = dir.join("h.redb");
        std::fs::create_dir_all(&dir).unwrap();
        {
            let db = Database::create(&path).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(META)
                .unwrap()
                .insert("schema_version", SCHEMA_VERSION + 1)
                .unwrap();
            tx.commit().unwrap();
        }
        let err = Store::open(&Location::File(path)).unwrap_err();
        assert!(matches!(err, StoreError::NewerSchema { .. }), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn default_path_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert_eq!(
            default_path_from(env(&[("STATE_DIRECTORY", "/var/lib/h:/x"), ("HOME", "/h")]))
                .unwrap(),
            Location::File("/var/lib/h/herald.redb".into())
        );
        assert_eq!(
            default_path_from(env(&[("XDG_STATE_HOME", "/s"), ("HOME", "/h")])).unwrap(),
            Location::File("/s/herald/herald.redb".into())
        );
        assert_eq!(
            default_path_from(env(&[("HOME", "/h")])).unwrap(),
            Location::File("/h/.local/state/herald/herald.redb".into())
        );
        assert!(default_path_from(env(&[])).is_err());
    }
}
