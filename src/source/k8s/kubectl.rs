//! Running the real `kubectl`: the arguments for a cluster and a selection, one-shot commands
//! with their errors made useful (`did you mean: ...`), the long-running `get -w`, the API
//! resources list, and credentials re-minted by `--token-command` before each connect.
//!
//! Every kubectl herald starts dies with it (`PR_SET_PDEATHSIG`). At most 8 one-shot commands
//! run at once (later ones wait their turn), each bounded in time and in output (64 MiB; past it
//! the command is killed with an error); at most 32 waiting commands (`kubectl_wait`,
//! `rollout_status`) run at once, and one more is refused. `--token-command` credentials go
//! into kubeconfigs of mode 0600 in a private 0700 directory, never on a command line or in a
//! log.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::mcp::source::SourceError;
use crate::runtime::context::RoleContext;
use crate::source::k8s::known::strip;
use crate::source::k8s::uri::{Cluster, Selection};

/// Longest a one-shot kubectl command may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest output a one-shot command may print.
const MAX_OUTPUT_BYTES: usize = 64 << 20;
/// How much of kubectl's stderr an error quotes.
const MAX_ERROR_BYTES: usize = 2048;
/// One-shot kubectl commands running at once; more wait their turn.
const MAX_CONCURRENT_COMMANDS: usize = 8;
/// Waiting kubectl commands (`wait`, `rollout status`) running at once.
pub const MAX_WAITING_COMMANDS: usize = 32;

/// A kubectl child: killed if herald dies (even by SIGKILL), so no `get -w` outlives it.
fn command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.kill_on_drop(true);
    crate::runtime::secrets::scrub(&mut cmd);
    // SAFETY: prctl in the child between fork and exec: async-signal-safe, touches no memory
    // of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd
}

#[derive(Debug, Clone)]
pub struct KubectlConfig {
    pub program: PathBuf,
    /// `(name, path)`; the first is the default (`?kcp=` names another). Empty: kubectl's own
    /// default kubeconfig.
    pub kubeconfigs: Vec<(String, PathBuf)>,
    /// A shell command whose stdout is a bearer token, run before every connect.
    pub token_command: Option<String>,
}

pub struct Kubectl {
    cfg: KubectlConfig,
    /// Private directory for kubeconfigs carrying minted tokens (0700, removed on drop).
    private: Option<PathBuf>,
    /// Each kubeconfig's server URL, for kcp's `/clusters/{workspace}` paths.
    servers: tokio::sync::Mutex<HashMap<String, String>>,
    /// Bounds the one-shot commands running at once.
    commands: tokio::sync::Semaphore,
    /// Bounds the waiting commands (`kubectl wait`, `rollout status`) running at once, apart
    /// from the one-shot ones, which a long wait must not hold up.
    waits: tokio::sync::Semaphore,
    /// Names temporary files uniquely (concurrent writers of one kubeconfig never collide).
    writes: std::sync::atomic::AtomicU64,
    /// Where the helper tasks of kubectl runs and watchers go.
    ctx: RoleContext,
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        if let Some(dir) = &self.private {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn unavailable(msg: String) -> SourceError {
    SourceError::Unavailable(msg)
}

/// The tail of kubectl's stderr, trimmed, for an error message.
fn stderr_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    // klog's lines (`E1205 08:25:26.633515 2182 memcache.go:265] …`) repeat what kubectl's
    // own last line says: that line alone, unless klog is all there is.
    let said: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !is_klog(l))
        .collect();
    let text = if said.is_empty() {
        text.trim().to_owned()
    } else {
        said.join("\n")
    };
    // With no kubeconfig kubectl falls back to localhost:8080; say it as the watches do.
    if text.contains("localhost:8080") && text.contains("refused") {
        return "no kubeconfig found and not running in a cluster (kubectl fell back to localhost:8080, where nothing answers); pass --kubeconfig PATH".to_owned();
    }
    let text = text.trim();
    if text.len() <= MAX_ERROR_BYTES {
        return text.to_owned();
    }
    let mut start = text.len() - MAX_ERROR_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

/// Whether `line` is one of klog's (`E1205 08:25:26.633515    2182 file.go:265] …`): a
/// severity letter, four digits, a time, then `file:line]`.
fn is_klog(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 22
        && matches!(b[0], b'I' | b'W' | b'E' | b'F')
        && b[1..5].iter().all(u8::is_ascii_digit)
        && b[5] == b' '
        && line
            .split_whitespace()
            .nth(3)
            .is_some_and(|f| f.ends_with(']'))
}

impl Kubectl {
    pub fn new(cfg: KubectlConfig, ctx: &RoleContext) -> std::io::Result<Kubectl> {
        let private = match &cfg.token_command {
            None => None,
            Some(_) => {
                use std::os::unix::fs::DirBuilderExt;
                let dir = std::env::temp_dir().join(format!(
                    "herald-k8s-{}-{:x}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos())
                        .unwrap_or(0)
                ));
                std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
                Some(dir)
            }
        };
        Ok(Kubectl {
            cfg,
            private,
            servers: tokio::sync::Mutex::new(HashMap::new()),
            commands: tokio::sync::Semaphore::new(MAX_CONCURRENT_COMMANDS),
            waits: tokio::sync::Semaphore::new(MAX_WAITING_COMMANDS),
            writes: std::sync::atomic::AtomicU64::new(0),
            ctx: ctx.clone(),
        })
    }

    /// The role's task context (the watchers spawn on it too).
    pub fn ctx(&self) -> &RoleContext {
        &self.ctx
    }

    pub fn program(&self) -> &Path {
        &self.cfg.program
    }

    fn kubeconfig(&self, name: Option<&str>) -> Result<Option<(String, PathBuf)>, SourceError> {
        match name {
            None => Ok(self.cfg.kubeconfigs.first().cloned()),
            Some(n) => match self.cfg.kubeconfigs.iter().find(|(k, _)| k == n) {
                Some(kc) => Ok(Some(kc.clone())),
                None => Err(SourceError::InvalidParams(format!(
                    "no kubeconfig named {n}; this server has {}",
                    if self.cfg.kubeconfigs.is_empty() {
                        "only kubectl's default kubeconfig".to_owned()
                    } else {
                        self.cfg
                            .kubeconfigs
                            .iter()
                            .map(|(k, _)| k.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ))),
            },
        }
    }

    /// `kubectl config view --minify --raw -o json` for a kubeconfig and context.
    async fn view(&self, path: Option<&Path>, context: Option<&str>) -> Result<Value, SourceError> {
        let mut args: Vec<String> = Vec::new();
        if let Some(p) = path {
            args.push(format!("--kubeconfig={}", p.display()));
        }
        if let Some(c) = context {
            args.push(format!("--context={c}"));
        }
        // --flatten inlines certificate files, so relative paths in the kubeconfig still work
        // from the private copy.
        args.extend(
            [
                "config",
                "view",
                "--minify",
                "--flatten",
                "--raw",
                "-o",
                "json",
            ]
            .map(String::from),
        );
        let out = self.exec(&args, None).await?;
        serde_json::from_str(&out)
            .map_err(|e| unavailable(format!("kubectl config view printed no JSON: {e}")))
    }

    /// The kubeconfig's server URL, without any `/clusters/...` suffix.
    async fn server(&self, name: &str, path: &Path) -> Result<String, SourceError> {
        let mut servers = self.servers.lock().await;
        if let Some(s) = servers.get(name) {
            return Ok(s.clone());
        }
        let view = self.view(Some(path), None).await?;
        let url = view["clusters"][0]["cluster"]["server"]
            .as_str()
            .ok_or_else(|| {
                unavailable(format!(
                    "kubeconfig {} names no server; kcp workspaces are reached under its server URL",
                    path.display()
                ))
            })?;
        let base = match url.find("/clusters/") {
            Some(i) => &url[..i],
            None => url.trim_end_matches('/'),
        };
        servers.insert(name.to_owned(), base.to_owned());
        Ok(base.to_owned())
    }

    /// The global flags that reach `cluster`, minting a token first if configured.
    pub async fn cluster_args(&self, cluster: &Cluster) -> Result<Vec<String>, SourceError> {
        let kc = self.kubeconfig(cluster.kubeconfig.as_deref())?;
        let server = match (&cluster.workspace, &kc) {
            (Some(ws), Some((name, path))) => {
                Some(format!("{}/clusters/{ws}", self.server(name, path).await?))
            }
            (Some(_), None) => {
                return Err(SourceError::InvalidParams(
                    "kcp workspaces need a kubeconfig; start the server with --kubeconfig PATH"
                        .into(),
                ));
            }
            (None, _) => None,
        };
        let mut args = Vec::new();
        if let (Some(cmd), Some(dir)) = (&self.cfg.token_command, &self.private) {
            let token = mint(cmd).await?;
            let mut view = self
                .view(
                    kc.as_ref().map(|k| k.1.as_path()),
                    cluster.context.as_deref(),
                )
                .await?;
            if let Some(users) = view["users"].as_array_mut() {
                for u in users {
                    u["user"] = json!({"token": token});
                }
            }
            if let (Some(s), Some(c)) = (&server, view["clusters"][0]["cluster"].as_object_mut()) {
                c.insert("server".into(), s.clone().into());
            }
            let file = dir.join(format!(
                "{}.kubeconfig",
                hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                    format!("{cluster:?}").as_bytes()
                ))
            ));
            let n = self
                .writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            write_private(&file, n, view.to_string().as_bytes())
                .await
                .map_err(|e| unavailable(format!("cannot write a private kubeconfig: {e}")))?;
            args.push(format!("--kubeconfig={}", file.display()));
            return Ok(args);
        }
        if let Some((_, path)) = &kc {
            args.push(format!("--kubeconfig={}", path.display()));
        }
        if let Some(c) = &cluster.context {
            args.push(format!("--context={c}"));
        }
        if let Some(s) = server {
            args.push(format!("--server={s}"));
        }
        Ok(args)
    }

    /// Runs kubectl with `args` to completion; its stdout, or its stderr as the error. Output
    /// past [`MAX_OUTPUT_BYTES`] kills it.
    async fn exec(&self, args: &[String], stdin: Option<&[u8]>) -> Result<String, SourceError> {
        let _turn = self
            .commands
            .acquire()
            .await
            .map_err(|_| unavailable("the k8s source is shutting down".into()))?;
        let mut cmd = command(&self.cfg.program);
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| self.cannot_run(e))?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            let input = input.to_vec();
            self.ctx.spawn("kubectl stdin", async move {
                let _ = pipe.write_all(&input).await;
            });
        }
        let (mut out, mut err) = (
            child.stdout.take().expect("piped"),
            child.stderr.take().expect("piped"),
        );
        let run = async {
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            let mut out = (&mut out).take(MAX_OUTPUT_BYTES as u64 + 1);
            let mut err = (&mut err).take(1 << 20);
            let (o, e) = tokio::join!(out.read_to_end(&mut stdout), err.read_to_end(&mut stderr));
            o.and(e)?;
            if stdout.len() > MAX_OUTPUT_BYTES {
                return Ok((None, stdout, stderr));
            }
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((Some(status), stdout, stderr))
        };
        let what = args
            .iter()
            .find(|a| !a.starts_with("--"))
            .map_or("", String::as_str);
        let (status, stdout, stderr) = tokio::time::timeout(COMMAND_TIMEOUT, run)
            .await
            .map_err(|_| {
                unavailable(format!(
                    "kubectl {what} took over {} s",
                    COMMAND_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| unavailable(format!("kubectl failed: {e}")))?;
        let Some(status) = status else {
            return Err(unavailable(format!(
                "kubectl printed over {} MiB; narrow the request with a namespace or selector",
                MAX_OUTPUT_BYTES >> 20
            )));
        };
        if !status.success() {
            return Err(unavailable(stderr_text(&stderr)));
        }
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    }

    /// The error of a kubectl that could not be started.
    fn cannot_run(&self, e: std::io::Error) -> SourceError {
        unavailable(format!(
            "cannot run {}: {e}; install kubectl or pass --kubectl PATH",
            self.cfg.program.display()
        ))
    }

    /// Runs a kubectl command that waits for something (`wait`, `rollout status`) for at most
    /// `limit` (kubectl's own `--timeout` should end it first): whether it succeeded, and its
    /// stdout or stderr. Dropping the future kills kubectl.
    pub async fn run_waiting(
        &self,
        cluster: &Cluster,
        args: &[String],
        limit: Duration,
    ) -> Result<(bool, String), SourceError> {
        let mut all = self.cluster_args(cluster).await?;
        all.extend(args.iter().cloned());
        let _turn = self.waits.try_acquire().map_err(|_| {
            unavailable(format!(
                "{MAX_WAITING_COMMANDS} waiting kubectl commands run already; try again when one has ended"
            ))
        })?;
        let mut child = command(&self.cfg.program)
            .args(&all)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.cannot_run(e))?;
        let (mut out, mut err) = (
            child.stdout.take().expect("piped"),
            child.stderr.take().expect("piped"),
        );
        let run = async {
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            let mut out = (&mut out).take(1 << 20);
            let mut err = (&mut err).take(1 << 20);
            let (o, e) = tokio::join!(out.read_to_end(&mut stdout), err.read_to_end(&mut stderr));
            o.and(e)?;
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, stdout, stderr))
        };
        let (status, stdout, stderr) = tokio::time::timeout(limit, run)
            .await
            .map_err(|_| unavailable(format!("kubectl took over {} s", limit.as_secs())))?
            .map_err(|e| unavailable(format!("kubectl failed: {e}")))?;
        if status.success() {
            Ok((true, String::from_utf8_lossy(&stdout).into_owned()))
        } else {
            Ok((false, stderr_text(&stderr)))
        }
    }

    /// Runs `kubectl <cluster flags> ARGS`.
    pub async fn run(
        &self,
        cluster: &Cluster,
        args: &[String],
        stdin: Option<&[u8]>,
    ) -> Result<String, SourceError> {
        let mut all = self.cluster_args(cluster).await?;
        all.extend(args.iter().cloned());
        self.exec(&all, stdin).await
    }

    /// `kubectl get` of a selection: its items, managedFields stripped. A failure says what
    /// kubectl said, plus `did you mean: ...` when the resource type is unknown.
    pub async fn list(&self, sel: &Selection) -> Result<Vec<Value>, SourceError> {
        let mut args = vec!["get".to_owned()];
        args.extend(selection_args(sel));
        args.extend(["-o", "json"].map(String::from));
        let out = match self.run(&sel.cluster, &args, None).await {
            Ok(out) => out,
            Err(e) => return Err(self.explain(sel, e).await),
        };
        let v: Value = serde_json::from_str(&out)
            .map_err(|e| unavailable(format!("kubectl get printed no JSON: {e}")))?;
        let items = match v.get("items") {
            Some(Value::Array(items)) => items.clone(),
            _ => vec![v],
        };
        Ok(items
            .into_iter()
            .map(|mut o| {
                strip(&mut o);
                o
            })
            .collect())
    }

    /// Adds `did you mean` to an unknown-resource error.
    async fn explain(&self, sel: &Selection, e: SourceError) -> SourceError {
        let SourceError::Unavailable(msg) = &e else {
            return e;
        };
        if !msg.contains("doesn't have a resource type") {
            return e;
        }
        let hint = match self.api_resources(&sel.cluster).await {
            Ok(list) => {
                let names = did_you_mean(&sel.resource, &list);
                if names.is_empty() {
                    "; get_api_resources lists the resource types this cluster serves".to_owned()
                } else {
                    format!("; did you mean: {}?", names.join(", "))
                }
            }
            Err(_) => String::new(),
        };
        SourceError::InvalidParams(format!("{msg}{hint}"))
    }

    /// Starts `kubectl get -w --output-watch-events -o json --request-timeout=0`.
    pub async fn watch(&self, sel: &Selection) -> Result<Child, SourceError> {
        let mut args = self.cluster_args(&sel.cluster).await?;
        args.push("get".into());
        args.extend(selection_args(sel));
        args.extend(
            [
                "-w",
                "--output-watch-events",
                "-o",
                "json",
                "--request-timeout=0",
            ]
            .map(String::from),
        );
        command(&self.cfg.program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.cannot_run(e))
    }

    /// The cluster's API resources as JSON: `[{name, shortNames, apiVersion, namespaced,
    /// kind, verbs}]`, from `kubectl api-resources -o wide`.
    pub async fn api_resources(&self, cluster: &Cluster) -> Result<Value, SourceError> {
        let out = self
            .run(
                cluster,
                &["api-resources".into(), "-o".into(), "wide".into()],
                None,
            )
            .await?;
        Ok(parse_api_resources(&out))
    }
}

/// Runs the token command; its trimmed stdout is the token. Its output never reaches an error.
/// It runs in a process group of its own, killed whole if it overruns.
pub(crate) async fn mint(cmd: &str) -> Result<String, SourceError> {
    let mut child = crate::runtime::secrets::scrub(&mut Command::new("/bin/sh"))
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| unavailable(format!("cannot run the token command: {e}")))?;
    let pid = child.id();
    let mut stdout = child.stdout.take().expect("piped");
    let run = async {
        let mut out = Vec::new();
        (&mut stdout).take(64 * 1024).read_to_end(&mut out).await?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out))
    };
    let (status, out) = match tokio::time::timeout(COMMAND_TIMEOUT, run).await {
        Ok(r) => r.map_err(|e| unavailable(format!("the token command failed: {e}")))?,
        Err(_) => {
            if let Some(pid) = pid {
                // SAFETY: signals the process group the child leads.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            return Err(unavailable(format!(
                "the token command took over {} s",
                COMMAND_TIMEOUT.as_secs()
            )));
        }
    };
    if !status.success() {
        return Err(unavailable(format!(
            "the token command failed ({status}); fix --token-command"
        )));
    }
    let token = String::from_utf8_lossy(&out).trim().to_owned();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(unavailable(
            "the token command printed no single token; it must print the bearer token on stdout"
                .into(),
        ));
    }
    Ok(token)
}

async fn write_private(path: &Path, n: u64, bytes: &[u8]) -> std::io::Result<()> {
    use tokio::fs::OpenOptions;
    let tmp = path.with_extension(format!("{n}.tmp"));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .await?;
    f.write_all(bytes).await?;
    f.flush().await?;
    drop(f);
    tokio::fs::rename(&tmp, path).await
}

/// An object name as Kubernetes allows it (a DNS-1123 subdomain): never a flag.
pub fn object_name(name: &str) -> Result<&str, SourceError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.' || b == b':'
        })
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(name)
    } else {
        Err(SourceError::InvalidParams(format!(
            "bad object name {name:?}; names are lowercase letters, digits, '-' and '.', starting with a letter or digit"
        )))
    }
}

/// `RESOURCE [-A | -n NS] [-l SEL] [--field-selector SEL]`.
pub fn selection_args(sel: &Selection) -> Vec<String> {
    let mut args = vec![sel.resource.clone()];
    match sel.namespace.as_deref() {
        Some("*") => args.push("--all-namespaces".into()),
        Some(ns) => args.push(format!("--namespace={ns}")),
        None => {}
    }
    if let Some(l) = &sel.label_selector {
        args.push(format!("--selector={l}"));
    }
    if let Some(f) = &sel.field_selector {
        args.push(format!("--field-selector={f}"));
    }
    args
}

/// Parses `kubectl api-resources -o wide`: columns are found from the header's offsets (the
/// SHORTNAMES column is often blank, so splitting on whitespace would misalign).
pub fn parse_api_resources(text: &str) -> Value {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return json!([]);
    };
    let names = [
        "NAME",
        "SHORTNAMES",
        "APIVERSION",
        "NAMESPACED",
        "KIND",
        "VERBS",
        "CATEGORIES",
    ];
    let mut cols: Vec<(&str, usize)> = names
        .iter()
        .filter_map(|n| {
            header
                .match_indices(n)
                .find(|(i, _)| *i == 0 || header.as_bytes()[i - 1] == b' ')
                .map(|(i, _)| (*n, i))
        })
        .collect();
    cols.sort_by_key(|c| c.1);
    let field = |line: &str, i: usize| -> String {
        let start = cols[i].1;
        let end = cols.get(i + 1).map_or(line.len(), |c| c.1);
        line.get(start.min(line.len())..end.min(line.len()))
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    let list: Vec<Value> = lines
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut o = serde_json::Map::new();
            for (i, (name, _)) in cols.iter().enumerate() {
                let v = field(line, i);
                let (key, value) = match *name {
                    "NAME" => ("name", json!(v)),
                    "SHORTNAMES" => ("shortNames", list_field(&v, [','])),
                    "APIVERSION" => ("apiVersion", json!(v)),
                    "NAMESPACED" => ("namespaced", json!(v == "true")),
                    "KIND" => ("kind", json!(v)),
                    // kubectl prints `create,delete,get` (1.2x and later) or, in older
                    // releases, `[create delete get]`: either way one verb per element.
                    "VERBS" => ("verbs", list_field(v.trim_matches(['[', ']']), [',', ' '])),
                    _ => ("categories", list_field(&v, [','])),
                };
                o.insert(key.into(), value);
            }
            Value::Object(o)
        })
        .collect();
    Value::Array(list)
}

fn list_field<const N: usize>(v: &str, sep: [char; N]) -> Value {
    Value::Array(
        v.split(sep)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| Value::from(s.to_owned()))
            .collect(),
    )
}

/// Resource names close to `wanted` (by edit distance, or a shared prefix), best first.
pub fn did_you_mean(wanted: &str, resources: &Value) -> Vec<String> {
    let wanted = wanted.to_ascii_lowercase();
    let mut scored: Vec<(usize, String)> = Vec::new();
    for r in resources.as_array().into_iter().flatten() {
        let Some(name) = r["name"].as_str() else {
            continue;
        };
        let group = r["apiVersion"]
            .as_str()
            .and_then(|v| v.split_once('/'))
            .map(|(g, _)| g);
        let full = match group {
            Some(g) => format!("{name}.{g}"),
            None => name.to_owned(),
        };
        let mut candidates = vec![name.to_owned(), full.clone()];
        if let Some(kind) = r["kind"].as_str() {
            candidates.push(kind.to_ascii_lowercase());
        }
        for s in r["shortNames"].as_array().into_iter().flatten() {
            if let Some(s) = s.as_str() {
                candidates.push(s.to_owned());
            }
        }
        let best = candidates
            .iter()
            .map(|c| {
                let d = distance(&wanted, c);
                if c.starts_with(&wanted) || wanted.starts_with(c.as_str()) {
                    d.min(1)
                } else {
                    d
                }
            })
            .min()
            .unwrap_or(usize::MAX);
        if best <= 2.max(wanted.len() / 4) {
            scored.push((
                best,
                if group.is_some() {
                    full
                } else {
                    name.to_owned()
                },
            ));
        }
    }
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(3).map(|(_, n)| n).collect()
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_noise_is_dropped_and_a_missing_kubeconfig_said_in_one_line() {
        let noise = "E1205 08:25:26.633515    2182 memcache.go:265] \"Unhandled Error\" err=\"couldn't get current server API group list: Get \\\"http://localhost:8080/api?timeout=32s\\\": dial tcp 127.0.0.1:8080: connect: connection refused\"\n";
        let last = "The connection to the server localhost:8080 was refused - did you specify the right host or port?\n";
        let said = stderr_text(format!("{noise}{noise}{last}").as_bytes());
        assert!(said.starts_with("no kubeconfig found"), "{said}");
        assert!(said.contains("--kubeconfig"), "{said}");
        assert!(!said.contains("memcache"), "{said}");
        // Another failure keeps kubectl's own words, without klog's lines.
        let other = "W1205 08:25:26.633515    2182 warnings.go:70] deprecated\nError from server (NotFound): configmaps \"x\" not found\n";
        assert_eq!(
            stderr_text(other.as_bytes()),
            "Error from server (NotFound): configmaps \"x\" not found"
        );
        // Only klog: kept as it is.
        let only = "E1205 08:25:26.633515    2182 round_trippers.go:1] something odd\n";
        assert!(stderr_text(only.as_bytes()).contains("round_trippers"));
        assert!(!is_klog("Error from server (NotFound): x"));
    }

    const WIDE: &str = "\
NAME          SHORTNAMES   APIVERSION   NAMESPACED   KIND        VERBS                                         CATEGORIES
configmaps    cm           v1           true         ConfigMap   [create delete get list patch update watch]
namespaces    ns           v1           false        Namespace   get,list,watch
pods                       v1           true         Pod         [get list watch]                              all
deployments   deploy       apps/v1      true         Deployment  [get list watch]                              all
";

    #[test]
    fn api_resources_columns_come_from_the_header() {
        let v = parse_api_resources(WIDE);
        assert_eq!(v.as_array().unwrap().len(), 4);
        assert_eq!(
            v[0],
            json!({"name": "configmaps", "shortNames": ["cm"], "apiVersion": "v1", "namespaced": true,
                   "kind": "ConfigMap", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                   "categories": []})
        );
        assert_eq!(v[2]["shortNames"], json!([]));
        assert_eq!(v[2]["categories"], json!(["all"]));
        assert_eq!(v[1]["namespaced"], json!(false));
        assert_eq!(v[1]["verbs"], json!(["get", "list", "watch"]));
    }

    #[test]
    fn did_you_mean_finds_near_names() {
        let v = parse_api_resources(WIDE);
        assert_eq!(did_you_mean("confgmaps", &v), ["configmaps"]);
        assert_eq!(did_you_mean("configmap", &v), ["configmaps"]);
        assert_eq!(did_you_mean("deployment", &v), ["deployments.apps"]);
        assert!(did_you_mean("zzzzzzzz", &v).is_empty());
    }

    #[test]
    fn selection_flags() {
        let sel = Selection {
            cluster: Cluster {
                kubeconfig: None,
                workspace: None,
                context: None,
            },
            resource: "configmaps".into(),
            namespace: Some("*".into()),
            label_selector: Some("app=web".into()),
            field_selector: None,
            metadata: false,
        };
        assert_eq!(
            selection_args(&sel),
            ["configmaps", "--all-namespaces", "--selector=app=web"]
        );
    }
}
