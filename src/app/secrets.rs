//! The environment variables that hold this process's own secrets, kept from every child it
//! starts (stdio upstreams, kubectl and its token command, `--exec` and `[notify] exec`): a
//! third-party MCP server started as a `[[slug]]` must not receive the Slack bot token or
//! another slug's upstream token.
//!
//! `HERALD_TOKEN` (a client's own credential) is always kept back. The others are entered
//! when this process uses them: the Slack variables when it runs the Slack role itself, a
//! slug's `token_env` when its config is read. A child started to *be* a role (a `[[slug]]
//! stdio = "herald slack"` of a gateway that runs no Slack itself) still gets what it needs.

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
