//! Who holds something on NATS (a Slack socket lease, a publisher name): this process's
//! identity (`host:boot:pidns:pid:random`, written into the key's value) and [`dead_here`],
//! which judges a holder of this very host, boot and pid namespace whose pid is gone, or is
//! this pid in an earlier life (a container restarted: pid 1 again); its hold is taken at
//! once. A holder anywhere else is only ever judged by the stale time.

use super::hostname;

/// Who this process is: `host:boot:pidns:pid:random`. The boot id and pid namespace say
/// whether `pid` can be looked up here (containers may share a host name).
pub fn identity() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut b = [0u8; 4];
    let _ = SystemRandom::new().fill(&mut b);
    format!(
        "{}:{}:{}:{}:{:08x}",
        hostname(),
        boot_id(),
        pid_ns(),
        std::process::id(),
        u32::from_le_bytes(b)
    )
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|b| b.trim().get(..8).unwrap_or("").to_owned())
        .unwrap_or_default()
}

fn pid_ns() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("pid:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// Whether `holder` (not `me`) names this very pid of this host, boot and pid namespace: an
/// earlier life of this process's pid (a container restarted), gone.
pub fn earlier_life(holder: &str, me: &str) -> bool {
    let (h, m): (Vec<&str>, Vec<&str>) = (holder.split(':').collect(), me.split(':').collect());
    holder != me
        && h.len() == 5
        && m.len() == 5
        && !h[1].is_empty()
        && !h[2].is_empty()
        && h[..4] == m[..4]
}

/// Whether `holder` names a process of this host, this boot and this pid namespace that is
/// gone (its hold can be taken at once: it can no longer hold anything).
pub fn dead_here(holder: &str) -> bool {
    let parts: Vec<&str> = holder.split(':').collect();
    let [host, boot, ns, pid, _] = parts[..] else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    !boot.is_empty()
        && !ns.is_empty()
        && host == hostname()
        && boot == boot_id()
        && ns == pid_ns()
        && pid != std::process::id()
        && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_of_this_host_whose_pid_is_gone_is_dead() {
        let me = identity();
        assert!(!dead_here(&me), "this process is alive");
        let (host, boot, ns) = (hostname(), boot_id(), pid_ns());
        assert!(!boot.is_empty() && !ns.is_empty(), "{me}");
        assert!(
            dead_here(&format!("{host}:{boot}:{ns}:4294967295:abc")),
            "no such pid"
        );
        assert!(
            !dead_here(&format!("{host}:{boot}:4026000000:4294967295:abc")),
            "another pid namespace (a container with the same host name) is never judged"
        );
        assert!(
            !dead_here(&format!("{host}:00000000:{ns}:4294967295:abc")),
            "another boot, or another machine with the same name, is never judged"
        );
        assert!(!dead_here("elsewhere.example:1:2:4294967295:abc"));
        assert!(!dead_here("garbage"));
        assert!(
            !dead_here(&format!("{host}:{boot}:{ns}:1:abc")),
            "pid 1 is alive"
        );
    }
}
