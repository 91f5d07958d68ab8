//! A listening socket handed to a child process as its descriptor 3: systemd's socket
//! activation, HAProxy's `bind fd@3`. Shared by the integration tests and the benches.

use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;

/// Makes `fd` the child's descriptor 3, open across exec (connections made before the child
/// accepts wait in the backlog).
pub fn pass_as_fd_3(cmd: &mut std::process::Command, fd: RawFd) {
    // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl) on descriptors
    // the child owns; no allocation, no locks.
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == 3 {
                // Already in place: only clear close-on-exec (dup2 onto itself would keep it).
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// `haproxy -db -f CFG` (`HERALD_HAPROXY`, else `/usr/sbin/haproxy`, else `haproxy` on the
/// PATH) with `listener` as its `fd@3` and no output, and the binary's name for messages.
pub fn haproxy(cfg: &std::path::Path, listener: RawFd) -> (String, std::process::Command) {
    let bin = std::env::var("HERALD_HAPROXY").unwrap_or_else(|_| {
        if std::path::Path::new("/usr/sbin/haproxy").exists() {
            "/usr/sbin/haproxy".into()
        } else {
            "haproxy".into()
        }
    });
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["-db", "-f"])
        .arg(cfg)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    pass_as_fd_3(&mut cmd, listener);
    (bin, cmd)
}

/// HAProxy in HTTP mode started on `listener` (killed when dropped), its config written in
/// `dir`: the global and default settings every test shares (`maxconn`, the timeouts), then
/// `rest` (more defaults, the frontend on `fd@3`, the backends). Or why it cannot run, saying
/// how to install it.
pub fn start_haproxy(
    dir: &std::path::Path,
    maxconn: u32,
    rest: &str,
    listener: RawFd,
) -> Result<tokio::process::Child, String> {
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n    maxconn {maxconn}\n\
             defaults\n    mode http\n    timeout connect 1s\n    timeout client 1h\n    \
             timeout server 1h\n{rest}"
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", cfg.display()))?;
    let (bin, cmd) = haproxy(&cfg, listener);
    tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!("cannot run {bin} ({e}): install it with `apt-get install haproxy` (what .ci/run does) or point HERALD_HAPROXY at it")
        })
}
