//! The environment variables that hold this process's own secrets, kept from every child it
//! starts (stdio upstreams, helper commands, `--exec` and `[notify] exec`): a third-party MCP
//! server started as an upstream must not receive another role's token.
//!
//! `HERALD_TOKEN` (a client's own credential) is always kept back. The others are entered by
//! the role that uses them, when it uses them (a role's API token variables when it runs, an
//! upstream's `token_env` when its config is read). A child started to *be* a role, by a
//! process that does not run that role itself, still gets what it needs.
//!
//! Why a process-wide set and not a value in the context: what it guards is the process's
//! environment, which is process-wide itself. Every child inherits it from wherever it is
//! started (a client role with no context, a helper several layers down), so every spawn
//! must scrub the same set; the set holds variable names, never request data or values.

use crate::sync::Recover;
use std::collections::BTreeSet;
use std::sync::Mutex;

static SECRETS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Marks `var` as one of this process's secrets.
pub fn register(var: &str) {
    SECRETS.locked().insert(var.to_owned());
}

/// Removes this process's secrets from `cmd`'s environment.
pub fn scrub(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    cmd.env_remove("HERALD_TOKEN");
    // The agent's model key, whether or not this process runs the agent.
    cmd.env_remove("HERALD_MODEL_KEY");
    for var in SECRETS.locked().iter() {
        cmd.env_remove(var);
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_registered_secret_never_reaches_a_child() {
        register("HERALD_TEST_SECRET_VAR");
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args([
            "-c",
            "printf %s \"${HERALD_TEST_SECRET_VAR-unset}${HERALD_TOKEN-unset}\"",
        ])
        .env("HERALD_TEST_SECRET_VAR", "s3cret")
        .env("HERALD_TOKEN", "t0ken");
        let out = scrub(&mut cmd).output().await.unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "unsetunset");
    }
}
