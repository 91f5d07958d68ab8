//! Backups: a consistent copy of the store in a new redb file, made from one read transaction,
//! so it can be taken while herald runs (a reader never waits for the writer thread, nor the
//! writer for it) and holds exactly one committed state.
//!
//! Every write lands beside its destination first (`DEST.tmp-<pid>`, created exclusively, mode
//! 0600 since the store holds the QUIC private key), is synced, and only then takes the
//! destination's name, so a destination is never half-written. Without `overwrite` the name is
//! taken with a hard link, which fails when something (a file, a symlink) already has it.
//!
//! The admin address's `POST /backup` writes only into the store's own backups directory
//! ([`backups_dir`]), under a name made from the time, and keeps the newest
//! [`KEEP_BACKUPS`] there: it has no authentication, so a caller chooses neither the path nor
//! how many files pile up.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use redb::{
    Database, MultimapTableHandle, ReadTransaction, ReadableDatabase, ReadableTable,
    TableDefinition, TableHandle, WriteTransaction,
};

use super::{Location, META, Store, StoreError, io_err};

/// Backups `POST /backup` keeps in the backups directory; older ones are removed.
pub const KEEP_BACKUPS: usize = 3;

/// A snapshot written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// The file written.
    pub path: PathBuf,
    /// Tables copied, the schema table included.
    pub tables: usize,
    /// Entries copied, over all tables.
    pub entries: u64,
    /// The file's size in bytes.
    pub bytes: u64,
}

impl Store {
    /// Writes a consistent snapshot of the whole store to `dest`: every table, read in one
    /// transaction, copied into a new redb file beside `dest`, synced, then given `dest`'s
    /// name. An existing `dest` is replaced only with `overwrite`; otherwise the answer is
    /// [`StoreError::BackupExists`] and nothing is written.
    pub async fn backup_to(&self, dest: &Path, overwrite: bool) -> Result<Snapshot, StoreError> {
        let db = self.db.clone();
        let dest = dest.to_owned();
        tokio::task::spawn_blocking(move || snapshot(&db, &dest, overwrite))
            .await
            .map_err(io_err)?
    }

    /// Writes a snapshot into the store's backups directory ([`backups_dir`]) as
    /// `<stem>-<stamp>.redb` (`-N` added when that name is taken), then removes all but the
    /// newest `keep` backups of this store there. `stamp` is a UTC time, `YYYYmmddTHHMMSSZ`.
    /// The path comes from the store alone, never from a caller. A store in memory has no
    /// directory: [`StoreError::InMemory`].
    pub async fn backup_rotated(&self, stamp: &str, keep: usize) -> Result<Snapshot, StoreError> {
        let Location::File(store) = self.location() else {
            return Err(StoreError::InMemory);
        };
        if !is_stamp(stamp) {
            return Err(StoreError::Io(format!(
                "backup stamp {stamp:?} is not YYYYmmddTHHMMSSZ"
            )));
        }
        let db = self.db.clone();
        let store = store.clone();
        let stamp = stamp.to_owned();
        tokio::task::spawn_blocking(move || snapshot_rotated(&db, &store, &stamp, keep))
            .await
            .map_err(io_err)?
    }
}

/// Where `POST /backup` writes: `backups/` beside the store file.
pub fn backups_dir(store: &Path) -> PathBuf {
    store.parent().unwrap_or(Path::new("")).join("backups")
}

/// The part of the store file's name its backups start with: `herald` for `herald.redb`.
fn stem(store: &Path) -> String {
    store
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "herald".into())
}

/// `YYYYmmddTHHMMSSZ`.
fn is_stamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 16
        && b[8] == b'T'
        && b[15] == b'Z'
        && b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit)
}

/// The name of backup `n` of `stem` at `stamp`.
fn backup_name(stem: &str, stamp: &str, n: u32) -> String {
    match n {
        0 => format!("{stem}-{stamp}.redb"),
        n => format!("{stem}-{stamp}-{n}.redb"),
    }
}

/// `(stamp, n)` when `name` is a backup of `stem` ([`backup_name`]'s inverse); their order is
/// the backups' order in time.
fn parse_backup_name<'a>(stem: &str, name: &'a str) -> Option<(&'a str, u32)> {
    let rest = name.strip_prefix(stem)?.strip_prefix('-')?;
    let rest = rest.strip_suffix(".redb")?;
    let (stamp, tail) = rest.split_at_checked(16)?;
    if !is_stamp(stamp) {
        return None;
    }
    let n = match tail {
        "" => 0,
        t => {
            let digits = t.strip_prefix('-')?;
            if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            digits.parse().ok()?
        }
    };
    Some((stamp, n))
}

/// Whether `path` is a file `POST /backup` writes for the store at `store`: in its backups
/// directory, named as one of its backups. (`herald store backup` checks what a running
/// herald answers with this before moving the file.)
pub fn is_backup_of(store: &Path, path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    path.parent() == Some(backups_dir(store).as_path())
        && parse_backup_name(&stem(store), name).is_some()
}

fn snapshot_rotated(
    db: &Database,
    store: &Path,
    stamp: &str,
    keep: usize,
) -> Result<Snapshot, StoreError> {
    let dir = backups_dir(store);
    // Absolute, so the path answered means the same to a process in another directory.
    let dir = create_private_dir(&dir)
        .and_then(|()| std::fs::canonicalize(&dir))
        .map_err(|e| StoreError::Backup {
            path: dir.clone(),
            message: format!("cannot create the backups directory: {e}"),
        })?;
    let stem = stem(store);
    // Backups run one at a time, so a temporary file of this store's backups found here was
    // left by a process that died mid-copy: remove it, or each crash would keep one forever.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let prefix = format!("{stem}-");
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix)
                && name.contains(".redb.tmp-")
                && e.file_type().is_ok_and(|t| t.is_file())
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    // After the newest backup of this second, so the names keep their order in time even when
    // rotation removed the first ones. The hard link that takes the name is what excludes a
    // taken one; another writer can only make us move on to the next number.
    let first = newest_n(&dir, &stem, stamp).map_err(|e| StoreError::Backup {
        path: dir.clone(),
        message: e.to_string(),
    })?;
    let start = first.map_or(0, |n| n + 1);
    for n in start..start + 100 {
        let dest = dir.join(backup_name(&stem, stamp, n));
        match snapshot(db, &dest, false) {
            Err(StoreError::BackupExists { .. }) => continue,
            Err(e) => return Err(e),
            Ok(snap) => {
                match rotate(&dir, &stem, keep, &snap.path) {
                    Ok(removed) => {
                        for p in removed {
                            tracing::info!(path = %p.display(), "removed an old store backup");
                        }
                    }
                    Err(e) => tracing::warn!(
                        dir = %dir.display(),
                        error = %e,
                        "cannot remove old store backups"
                    ),
                }
                return Ok(snap);
            }
        }
    }
    Err(StoreError::Backup {
        path: dir,
        message: format!("100 backups named {stem}-{stamp}* exist already; try again in a second"),
    })
}

/// The backups of `stem` in `dir` (regular files named by [`backup_name`]; nothing else),
/// newest first.
fn backups_in(dir: &Path, stem: &str) -> io::Result<Vec<(String, u32, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some((stamp, n)) = parse_backup_name(stem, name) {
            found.push((stamp.to_owned(), n, entry.path()));
        }
    }
    found.sort_by(|a, b| (&b.0, b.1).cmp(&(&a.0, a.1)));
    Ok(found)
}

/// The highest number among the backups of `stem` at `stamp` in `dir`.
fn newest_n(dir: &Path, stem: &str, stamp: &str) -> io::Result<Option<u32>> {
    Ok(backups_in(dir, stem)?
        .into_iter()
        .find(|(s, _, _)| s == stamp)
        .map(|(_, n, _)| n))
}

/// Removes all but the newest `keep` backups of `stem` in `dir`, never `just_made` (which a
/// clock set back could make look oldest), and returns what it removed. Nothing but those
/// backups is touched.
pub(crate) fn rotate(
    dir: &Path,
    stem: &str,
    keep: usize,
    just_made: &Path,
) -> io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let others = backups_in(dir, stem)?
        .into_iter()
        .map(|(_, _, p)| p)
        .filter(|p| p != just_made);
    for path in others.skip(keep.saturating_sub(1)) {
        std::fs::remove_file(&path)?;
        removed.push(path);
    }
    Ok(removed)
}

/// The snapshot itself: copied into `DEST.tmp-<pid>`, synced, then given `dest`'s name.
fn snapshot(db: &Database, dest: &Path, overwrite: bool) -> Result<Snapshot, StoreError> {
    let failed = |message: String| StoreError::Backup {
        path: dest.to_owned(),
        message,
    };
    if !overwrite && dest.symlink_metadata().is_ok() {
        return Err(StoreError::BackupExists {
            path: dest.to_owned(),
        });
    }
    let tmp = tmp_beside(dest);
    let file = create_private(&tmp)
        .map_err(|e| failed(format!("cannot create {}: {e}", tmp.display())))?;
    let written = copy_all(db, file).map_err(failed).and_then(|counts| {
        // redb syncs its commit; this makes sure of the file as a whole before it is named.
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| failed(e.to_string()))?;
        place(&tmp, dest, overwrite).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => StoreError::BackupExists {
                path: dest.to_owned(),
            },
            _ => failed(e.to_string()),
        })?;
        Ok(counts)
    });
    let (tables, entries) = written.inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    let bytes = std::fs::metadata(dest)
        .map_err(|e| failed(e.to_string()))?
        .len();
    Ok(Snapshot {
        path: dest.to_owned(),
        tables,
        entries,
        bytes,
    })
}

/// Copies every table of `src`, read in one transaction, into a new database in `file`, in
/// one transaction. Returns the tables and entries copied.
fn copy_all(src: &Database, file: File) -> Result<(usize, u64), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let backend = redb::backends::FileBackend::new(file).map_err(|x| e(&x))?;
    let dst = redb::Builder::new()
        .create_with_backend(backend)
        .map_err(|x| e(&x))?;
    let rtx = src.begin_read().map_err(|x| e(&x))?;
    if let Some(t) = rtx.list_multimap_tables().map_err(|x| e(&x))?.next() {
        return Err(format!(
            "the store has a multimap table {}, which this herald cannot copy; use a newer herald",
            t.name()
        ));
    }
    let wtx = dst.begin_write().map_err(|x| e(&x))?;
    let mut tables = 0;
    let mut entries = 0;
    for table in rtx.list_tables().map_err(|x| e(&x))? {
        let name = table.name();
        // Every table maps strings to bytes, except the schema table's version number.
        entries += if name == META.name() {
            copy_table::<u64>(&rtx, &wtx, name)?
        } else {
            copy_table::<&[u8]>(&rtx, &wtx, name)?
        };
        tables += 1;
    }
    wtx.commit().map_err(|x| e(&x))?;
    Ok((tables, entries))
}

fn copy_table<V: redb::Value + 'static>(
    rtx: &ReadTransaction,
    wtx: &WriteTransaction,
    name: &str,
) -> Result<u64, String> {
    let def: TableDefinition<&str, V> = TableDefinition::new(name);
    let e = |x: &dyn std::fmt::Display| format!("table {name}: {x}");
    let from = rtx.open_table(def).map_err(|x| e(&x))?;
    let mut to = wtx.open_table(def).map_err(|x| e(&x))?;
    let mut n = 0;
    for row in from.iter().map_err(|x| e(&x))? {
        let (k, v) = row.map_err(|x| e(&x))?;
        to.insert(k.value(), v.value()).map_err(|x| e(&x))?;
        n += 1;
    }
    Ok(n)
}

/// `DEST.tmp-<pid>`, beside `dest` so that naming it `dest` is a rename within a directory.
fn tmp_beside(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_owned();
    name.push(format!(".tmp-{}", std::process::id()));
    dest.with_file_name(name)
}

/// A new file only its owner can read, failing when the name is taken (O_EXCL).
fn create_private(path: &Path) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o.open(path)
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir)
}

/// Gives `from` the name `to` (both in one directory or at least on one filesystem) and
/// syncs the directory. Without `overwrite` an existing `to` is `AlreadyExists` and stays.
/// Across filesystems the error is `CrossesDevices`; see [`move_file`].
pub fn place(from: &Path, to: &Path, overwrite: bool) -> io::Result<()> {
    if overwrite {
        std::fs::rename(from, to)?;
    } else {
        match std::fs::hard_link(from, to) {
            Ok(()) => std::fs::remove_file(from)?,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::AlreadyExists | io::ErrorKind::CrossesDevices
                ) =>
            {
                return Err(e);
            }
            // A filesystem without hard links (or a link refused by protected_hardlinks):
            // look, then rename. Only here can a writer racing for `to` lose its file.
            Err(_) => {
                if to.symlink_metadata().is_ok() {
                    return Err(io::ErrorKind::AlreadyExists.into());
                }
                std::fs::rename(from, to)?;
            }
        }
    }
    sync_parent(to)
}

/// [`place`], or across filesystems a copy (beside `to`, 0600, synced) placed the same way,
/// after which `from` is removed.
pub fn move_file(from: &Path, to: &Path, overwrite: bool) -> io::Result<()> {
    match place(from, to, overwrite) {
        Err(e) if e.kind() == io::ErrorKind::CrossesDevices => {
            let tmp = tmp_beside(to);
            let copied = (|| {
                let mut src = File::open(from)?;
                let mut dst = create_private(&tmp)?;
                io::copy(&mut src, &mut dst)?;
                dst.sync_all()?;
                place(&tmp, to, overwrite)
            })();
            if copied.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            copied?;
            std::fs::remove_file(from)
        }
        other => other,
    }
}

fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{SCHEMA_VERSION, Table};

    struct Dir(PathBuf);
    impl Dir {
        fn new(tag: &str) -> Dir {
            let p =
                std::env::temp_dir().join(format!("herald-backup-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[tokio::test]
    async fn a_backup_holds_every_table_and_opens_as_a_store() {
        let dir = Dir::new("copy");
        let s = Store::memory();
        s.put(Table::Notes, "a", b"1".to_vec()).await.unwrap();
        s.put(Table::Notes, "b", b"2".to_vec()).await.unwrap();
        s.put(Table::Identity, "quic.identity", b"secret".to_vec())
            .await
            .unwrap();
        let dest = dir.0.join("b.redb");
        let snap = s.backup_to(&dest, false).await.unwrap();
        // meta, memo_notes, identity
        assert_eq!((snap.tables, snap.entries), (3, 4), "{snap:?}");
        assert_eq!(snap.bytes, std::fs::metadata(&dest).unwrap().len());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&dest).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Nothing left beside it.
        let names: Vec<_> = std::fs::read_dir(&dir.0).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");

        let copy = Store::open(&Location::File(dest.clone())).unwrap();
        assert_eq!(
            copy.scan(Table::Notes).await.unwrap(),
            vec![("a".into(), b"1".to_vec()), ("b".into(), b"2".to_vec())]
        );
        assert_eq!(
            copy.get(Table::Identity, "quic.identity").await.unwrap(),
            Some(b"secret".to_vec())
        );
        let rtx = copy.db.begin_read().unwrap();
        let meta = rtx.open_table(META).unwrap();
        assert_eq!(
            meta.get("schema_version").unwrap().unwrap().value(),
            SCHEMA_VERSION
        );
    }

    #[tokio::test]
    async fn an_existing_destination_is_kept_unless_overwrite() {
        let dir = Dir::new("exists");
        let s = Store::memory();
        let dest = dir.0.join("b.redb");
        std::fs::write(&dest, b"precious").unwrap();
        let err = s.backup_to(&dest, false).await.unwrap_err();
        assert!(matches!(err, StoreError::BackupExists { .. }), "{err}");
        assert_eq!(std::fs::read(&dest).unwrap(), b"precious");
        s.backup_to(&dest, true).await.unwrap();
        assert_ne!(std::fs::read(&dest).unwrap(), b"precious");
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1);
    }

    #[test]
    fn backup_names_parse_back_in_time_order() {
        assert!(is_stamp("20260102T030405Z"));
        assert!(!is_stamp("2026-01-02T03:04"));
        assert!(!is_stamp("../../etc/passwdZ"));
        let n0 = backup_name("herald", "20260102T030405Z", 0);
        let n2 = backup_name("herald", "20260102T030405Z", 2);
        assert_eq!(n0, "herald-20260102T030405Z.redb");
        assert_eq!(
            parse_backup_name("herald", &n0),
            Some(("20260102T030405Z", 0))
        );
        assert_eq!(
            parse_backup_name("herald", &n2),
            Some(("20260102T030405Z", 2))
        );
        for other in [
            "memo-20260102T030405Z.redb",
            "herald-20260102T030405Z.redb.tmp-12",
            "herald-20260102T030405Z-.redb",
            "herald-20260102T030405Z-x.redb",
            "herald.redb",
        ] {
            assert_eq!(parse_backup_name("herald", other), None, "{other}");
        }
        let store = Path::new("/var/lib/herald/herald.redb");
        assert!(is_backup_of(
            store,
            Path::new("/var/lib/herald/backups/herald-20260102T030405Z.redb")
        ));
        assert!(!is_backup_of(
            store,
            Path::new("/var/lib/herald/herald-20260102T030405Z.redb")
        ));
        assert!(!is_backup_of(store, Path::new("/home/u/.ssh/id_ed25519")));
    }

    #[test]
    fn rotation_keeps_the_newest_and_nothing_else_is_touched() {
        let dir = Dir::new("rotate");
        let names = [
            "herald-20260101T000000Z.redb",
            "herald-20260101T000000Z-1.redb",
            "herald-20260101T000000Z-2.redb",
            "herald-20250101T000000Z.redb",
            "herald-20260102T000000Z.redb",
            // Not herald's backups (another store's, a stray file): kept.
            "memo-20200101T000000Z.redb",
            "notes.txt",
            "herald-20260101T000000Z.redb.tmp-7",
        ];
        for n in names {
            std::fs::write(dir.0.join(n), b"x").unwrap();
        }
        let just_made = dir.0.join("herald-20250101T000000Z.redb");
        let mut removed: Vec<String> = rotate(&dir.0, "herald", 3, &just_made)
            .unwrap()
            .into_iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        removed.sort();
        // The two newest besides the one just made (oldest by its name: a clock set back).
        assert_eq!(
            removed,
            [
                "herald-20260101T000000Z-1.redb",
                "herald-20260101T000000Z.redb"
            ]
        );
        let mut left: Vec<String> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "herald-20250101T000000Z.redb",
                "herald-20260101T000000Z-2.redb",
                "herald-20260101T000000Z.redb.tmp-7",
                "herald-20260102T000000Z.redb",
                "memo-20200101T000000Z.redb",
                "notes.txt",
            ]
        );
    }

    #[tokio::test]
    async fn backups_into_the_store_directory_rotate_to_the_newest_three() {
        let dir = Dir::new("rotated");
        let path = std::fs::canonicalize(&dir.0).unwrap().join("herald.redb");
        let s = Store::open(&Location::File(path.clone())).unwrap();
        s.put(Table::Notes, "k", b"v".to_vec()).await.unwrap();
        let mut made = Vec::new();
        // Five backups in the same second: named -1, -2, …; the first two go.
        for _ in 0..5 {
            let snap = s
                .backup_rotated("20260102T030405Z", KEEP_BACKUPS)
                .await
                .unwrap();
            assert!(is_backup_of(&path, &snap.path), "{snap:?}");
            made.push(snap.path);
        }
        let names: Vec<_> = made
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names[0], "herald-20260102T030405Z.redb");
        assert_eq!(names[4], "herald-20260102T030405Z-4.redb");
        let mut left: Vec<_> = std::fs::read_dir(backups_dir(&path))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        left.sort();
        let mut newest = made[2..].to_vec();
        newest.sort();
        assert_eq!(left, newest);

        let err = Store::memory()
            .backup_rotated("20260102T030405Z", KEEP_BACKUPS)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::InMemory), "{err}");
        let err = s.backup_rotated("../x", KEEP_BACKUPS).await.unwrap_err();
        assert!(err.to_string().contains("YYYYmmddTHHMMSSZ"), "{err}");
    }

    #[test]
    fn a_move_keeps_an_existing_destination_unless_overwrite() {
        let dir = Dir::new("move");
        let (a, b) = (dir.0.join("a"), dir.0.join("b"));
        std::fs::write(&a, b"new").unwrap();
        std::fs::write(&b, b"old").unwrap();
        let err = move_file(&a, &b, false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&b).unwrap(), b"old");
        move_file(&a, &b, true).unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), b"new");
        assert!(!a.exists());
    }
}
