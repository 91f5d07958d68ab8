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
