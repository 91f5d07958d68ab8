//! `herald store backup DEST`: a consistent copy of the store file (`--store`) that
//! `herald --store DEST …` opens. A store no process holds is opened and copied here. One a
//! running herald holds (redb's lock: [`StoreError::Locked`]) is copied by that herald, which
//! `POST /backup` on its admin address asks to write a snapshot into the store's `backups/`
//! directory; the file it wrote is then moved to DEST. Either way DEST appears whole or not at
//! all, mode 0600 (the store holds the QUIC private key).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::anyhow;
use clap::{Args, Subcommand};

use crate::app::admin::{AdminError, BackupReport, DEFAULT_ADMIN};
use crate::app::console;
use crate::cli::status::{base_url, root_cause};
use crate::cli::{Exit, Globals, usage};
use crate::store::{Location, Snapshot, Store, StoreError, backups_dir, is_backup_of, move_file};

/// How long a running herald has to write its snapshot.
const BACKUP_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Args)]
pub struct StoreArgs {
    #[command(subcommand)]
    pub command: StoreCommand,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Copy the store (--store) to DEST as a consistent snapshot, also while a herald runs on
    /// it (that herald writes the snapshot, asked over --admin).
    Backup(BackupArgs),
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The copy to write: a new redb file, mode 0600, which `herald --store DEST` opens.
    #[arg(value_name = "DEST")]
    pub dest: PathBuf,
    /// Replace DEST when it exists.
    #[arg(long)]
    pub force: bool,
    /// When a running herald holds the store: its admin address, http://HOST:PORT or
    /// HOST:PORT, asked to write the snapshot (it must serve one: --admin ADDR).
    #[arg(long, value_name = "URL", default_value = DEFAULT_ADMIN)]
    pub admin: String,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What `herald store backup` prints with `--json`.
#[derive(Debug, serde::Serialize)]
struct Summary<'a> {
    /// The store copied.
    store: &'a Path,
    /// DEST, its tables, entries and size.
    #[serde(flatten)]
    snapshot: &'a Snapshot,
    /// The admin address of the running herald that wrote the snapshot; `null` when the
    /// store was copied here.
    admin: Option<&'a str>,
}

pub async fn run(args: StoreArgs, globals: &Globals) -> Result<(), Exit> {
    match args.command {
        StoreCommand::Backup(a) => backup(a, globals).await,
    }
}

async fn backup(args: BackupArgs, globals: &Globals) -> Result<(), Exit> {
    let location = match &globals.store {
        Some(s) => Location::parse(s),
        None => Location::default_path().map_err(|e| usage(e.into()))?,
    };
    let Location::File(store) = location else {
        return Err(usage(anyhow!(
            "--store :memory: keeps nothing on disk, so there is nothing to back up; pass --store PATH"
        )));
    };
    if !store.is_file() {
        return Err(usage(anyhow!(
            "no store at {}: nothing to back up; pass --store PATH",
            store.display()
        )));
    }
    let store = std::fs::canonicalize(&store)?;
    let dest = std::path::absolute(&args.dest)?;
    if same_file(&store, &dest) {
        return Err(usage(anyhow!(
            "{} is the store itself; pass another DEST",
            args.dest.display()
        )));
    }
    if dest.symlink_metadata().is_ok() && !args.force {
        return Err(usage(exists(&dest)));
    }

    let open = store.clone();
    let opened = tokio::task::spawn_blocking(move || Store::open(&Location::File(open))).await?;
    let (snapshot, admin) = match opened {
        Ok(s) => {
            let written = s.backup_to(&dest, args.force).await;
            s.close().await;
            let snapshot = written.map_err(|e| match e {
                StoreError::BackupExists { path } => usage(exists(&path)),
                e => e.into(),
            })?;
            (snapshot, None)
        }
        Err(StoreError::Locked { holder, .. }) => {
            let base = base_url(&args.admin);
            let snapshot = from_running(&base, &store, holder, &dest, args.force).await?;
            (snapshot, Some(base))
        }
        Err(e) => return Err(e.into()),
    };

    if args.json {
        let summary = Summary {
            store: &store,
            snapshot: &snapshot,
            admin: admin.as_deref(),
        };
        console::println(&serde_json::to_string(&summary)?)?;
    } else {
        let by = admin.map_or(String::new(), |a| {
            format!(" (snapshot by the running herald at {a})")
        });
        console::println(&format!(
            "backed up {} to {}: {} tables, {} entries, {} bytes{by}",
            store.display(),
            snapshot.path.display(),
            snapshot.tables,
            snapshot.entries,
            snapshot.bytes
        ))?;
    }
    Ok(())
}

fn exists(dest: &Path) -> anyhow::Error {
    anyhow!("{} exists; pass --force to replace it", dest.display())
}

/// Whether `a` and `b` are one file (one device and inode: symlinks and hard links too).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Asks the herald at `base`, which holds `store`, for a snapshot (`POST /backup`), checks
/// that the file it names is one of `store`'s backups, and moves it to `dest`.
async fn from_running(
    base: &str,
    store: &Path,
    holder: Option<u32>,
    dest: &Path,
    force: bool,
) -> Result<Snapshot, Exit> {
    let client = crate::transport::web::http_client(|b| b.timeout(BACKUP_TIMEOUT))?;
    let unreachable = |e: reqwest::Error| {
        let why = if e.is_timeout() {
            format!("no answer within {} s", BACKUP_TIMEOUT.as_secs())
        } else {
            root_cause(&e)
        };
        let by = holder.map_or("another process".to_owned(), |pid| format!("process {pid}"));
        anyhow!(
            "store {} is held by {by}, and no herald answered at {base} ({why}); stop it, or pass --admin with the admin address it serves (a herald started without --admin serves none: restart it with one)",
            store.display()
        )
    };
    // First make sure the herald there holds this store, so another herald's admin address
    // (the default one may be another's) is never made to write a backup of its own.
    let status: crate::runtime::status::StatusReport = client
        .get(format!("{base}/status"))
        .send()
        .await
        .map_err(unreachable)?
        .json()
        .await
        .map_err(|e| anyhow!("{base}/status did not answer as a herald ({e}); pass --admin URL"))?;
    if let Some(held) = &status.store.path
        && !same_file(held, store)
    {
        return Err(anyhow!(
            "the herald at {base} holds the store {}, not {}; pass the --admin of the herald holding {}",
            held.display(),
            store.display(),
            store.display()
        )
        .into());
    }
    let url = format!("{base}/backup");
    let response = client.post(&url).send().await.map_err(unreachable)?;
    let status = response.status();
    let body = response.bytes().await?;
    if !status.is_success() {
        return Err(match serde_json::from_slice::<AdminError>(&body) {
            Ok(e) => anyhow!("the herald at {base} could not back up its store: {}", e.error),
            Err(_) => anyhow!(
                "{url} answered {status}; is {base} the admin address of the herald holding {}? pass --admin URL",
                store.display()
            ),
        }
        .into());
    }
    let report: BackupReport = serde_json::from_slice(&body).map_err(|e| {
        anyhow!(
            "{url} did not answer with a herald backup ({e}); is {base} a herald admin address?"
        )
    })?;
    let written = &report.snapshot.path;
    // Moving a file is only done for a file that is this store's backup: whatever answers at
    // the address cannot make this command move another file of the user's.
    if !same_file(&report.store, store) {
        return Err(anyhow!(
            "the herald at {base} holds the store {}, not {}; pass the --admin of the herald holding {}",
            report.store.display(),
            store.display(),
            store.display()
        )
        .into());
    }
    if !is_this_backup(store, written) {
        return Err(anyhow!(
            "the herald at {base} answered with {}, which is not a backup of {}",
            written.display(),
            store.display()
        )
        .into());
    }
    let (from, to) = (written.clone(), dest.to_owned());
    let moved = tokio::task::spawn_blocking(move || move_file(&from, &to, force)).await?;
    match moved {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(usage(anyhow!(
                "{} exists; pass --force to replace it (the snapshot is at {})",
                dest.display(),
                written.display()
            )));
        }
        Err(e) => {
            return Err(anyhow!(
                "cannot move the snapshot {} to {}: {e} (the snapshot stays where it is)",
                written.display(),
                dest.display()
            )
            .into());
        }
    }
    let bytes = std::fs::metadata(dest)?.len();
    Ok(Snapshot {
        path: dest.to_owned(),
        bytes,
        ..report.snapshot
    })
}

/// Whether `path` is a regular file in `store`'s backups directory named as its backup.
fn is_this_backup(store: &Path, path: &Path) -> bool {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return false;
    };
    let ours = backups_dir(store);
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    canon(dir).is_some()
        && canon(dir) == canon(&ours)
        && is_backup_of(store, &ours.join(name))
        && path.symlink_metadata().is_ok_and(|m| m.is_file())
}
