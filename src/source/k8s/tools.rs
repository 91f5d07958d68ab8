//! The k8s source's tools: `kubectl_get` and `get_api_resources` (read-only), `kubectl_wait`
//! and `rollout_status` (read-only; they may run as tasks, and `tasks/cancel` stops kubectl),
//! and with `--read-write` `kubectl_apply` and `kubectl_delete` (destructive). Their schemas, the
//! checks of their arguments (a name never becomes a flag) and their dispatch.

use rmcp::model::{CallToolResult, ContentBlock as Content, JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::K8s;
use super::kubectl;
use super::uri::{self, Cluster, Selection};
use crate::mcp::source::{SourceError, check_args, schema};

const READ_ARGS: [&str; 8] = [
    "resource",
    "name",
    "namespace",
    "labelSelector",
    "fieldSelector",
    "workspace",
    "kcp",
    "context",
];

fn str_arg(args: &JsonObject, key: &str) -> Result<Option<String>, SourceError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(SourceError::InvalidParams(format!(
            "{key} must be a string, got {other}"
        ))),
    }
}

fn required(args: &JsonObject, key: &str, example: &str) -> Result<String, SourceError> {
    str_arg(args, key)?.ok_or_else(|| {
        SourceError::InvalidParams(format!("missing argument {key}; call with {key}={example}"))
    })
}

/// The cluster a tool call names: `workspace` (kcp) and `kcp`, or `context`.
fn cluster_arg(args: &JsonObject) -> Result<Cluster, SourceError> {
    let workspace = match str_arg(args, "workspace")? {
        Some(ws) => Some(uri::workspace(&ws, "the workspace argument")?),
        None => None,
    };
    Ok(Cluster {
        kubeconfig: str_arg(args, "kcp")?,
        workspace,
        context: str_arg(args, "context")?,
    })
}

fn cluster_props() -> Value {
    json!({
        "workspace": {"type": "string", "description": "kcp workspace, e.g. root:app (omit for a plain cluster)"},
        "kcp": {"type": "string", "description": "which kubeconfig (--kubeconfig NAME=PATH); default the first"},
        "context": {"type": "string", "description": "kubeconfig context"}
    })
}

fn with_cluster_props(mut props: Value) -> Value {
    if let (Some(p), Value::Object(c)) = (props.as_object_mut(), cluster_props()) {
        p.extend(c);
    }
    props
}

fn json_result(v: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![Content::text(v.to_string())]);
    r.structured_content = Some(v);
    r
}

/// The tools this source offers: the read-write ones only with `--read-write`. Built once.
pub(super) fn list(read_write: bool) -> &'static [Tool] {
    static READ: std::sync::LazyLock<Vec<Tool>> = std::sync::LazyLock::new(|| build(false));
    static WRITE: std::sync::LazyLock<Vec<Tool>> = std::sync::LazyLock::new(|| build(true));
    if read_write { &WRITE } else { &READ }
}

fn build(read_write: bool) -> Vec<Tool> {
    let read_only = |title: &str| {
        ToolAnnotations::with_title(title)
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(true)
    };
    let mut tools = vec![
            Tool::new(
                "kubectl_get",
                "kubectl get: one object (name) or a list of a resource type, as JSON with managedFields stripped.",
                schema(json!({
                    "type": "object",
                    "properties": with_cluster_props(json!({
                        "resource": {"type": "string", "description": "resource type, e.g. configmaps"},
                        "name": {"type": "string"},
                        "namespace": {"type": "string", "description": "a namespace, or * for all"},
                        "labelSelector": {"type": "string"},
                        "fieldSelector": {"type": "string"}
                    })),
                    "required": ["resource"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(read_only("Get Kubernetes objects")),
            Tool::new(
                "get_api_resources",
                "The resource types the cluster or workspace serves (name, shortNames, apiVersion, namespaced, kind, verbs).",
                schema(json!({
                    "type": "object",
                    "properties": cluster_props(),
                    "additionalProperties": false
                })),
            )
            .with_annotations(read_only("List API resource types")),
        ];
    let waiting = |title: &str| {
        ToolAnnotations::with_title(title)
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(true)
    };
    tools.push(crate::mcp::tasks::optional(
            Tool::new(
                "kubectl_wait",
                "kubectl wait: until objects meet a condition (for=condition=Ready, for=delete, for=jsonpath=..., for=create), at most timeout_s (default 300). May run as a task; tasks/cancel stops kubectl.",
                schema(json!({
                    "type": "object",
                    "properties": with_cluster_props(json!({
                        "resource": {"type": "string", "description": "resource type, e.g. pods"},
                        "name": {"type": "string", "description": "one object; or labelSelector, or all of the type"},
                        "namespace": {"type": "string"},
                        "labelSelector": {"type": "string"},
                        "for": {"type": "string", "description": "condition=NAME[=VALUE], delete, create or jsonpath={...}=VALUE"},
                        "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_WAIT_S}
                    })),
                    "required": ["resource", "for"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(waiting("Wait for a condition")),
        ));
    tools.push(crate::mcp::tasks::optional(
            Tool::new(
                "rollout_status",
                "kubectl rollout status: until a deployment, daemonset or statefulset has rolled out, at most timeout_s (default 300). May run as a task; tasks/cancel stops kubectl.",
                schema(json!({
                    "type": "object",
                    "properties": with_cluster_props(json!({
                        "resource": {"type": "string", "description": "deployment, daemonset or statefulset"},
                        "name": {"type": "string"},
                        "namespace": {"type": "string"},
                        "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_WAIT_S}
                    })),
                    "required": ["resource", "name"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(waiting("Wait for a rollout")),
        ));
    if read_write {
        let destructive = |title: &str| {
            ToolAnnotations::with_title(title)
                .read_only(false)
                .destructive(true)
                .idempotent(true)
                .open_world(true)
        };
        tools.push(
                Tool::new(
                    "kubectl_apply",
                    "kubectl apply -f -: create or update objects from a manifest (YAML or JSON text, or a JSON object).",
                    schema(json!({
                        "type": "object",
                        "properties": with_cluster_props(json!({
                            "manifest": {"description": "the manifest: YAML/JSON text or a JSON object"},
                            "namespace": {"type": "string"}
                        })),
                        "required": ["manifest"],
                        "additionalProperties": false
                    })),
                )
                .with_annotations(destructive("Apply a manifest")),
            );
        tools.push(
            Tool::new(
                "kubectl_delete",
                "kubectl delete: delete one object by resource type and name.",
                schema(json!({
                    "type": "object",
                    "properties": with_cluster_props(json!({
                        "resource": {"type": "string"},
                        "name": {"type": "string"},
                        "namespace": {"type": "string"}
                    })),
                    "required": ["resource", "name"],
                    "additionalProperties": false
                })),
            )
            .with_annotations(destructive("Delete an object")),
        );
    }
    tools
}

impl K8s {
    /// Runs the tool `name`; one this source does not offer (a read-write tool without
    /// `--read-write`) is `UnknownTool`.
    pub(super) async fn run_tool(
        &self,
        name: &str,
        args: JsonObject,
    ) -> Result<CallToolResult, SourceError> {
        match name {
            "kubectl_get" => {
                check_args(&args, &READ_ARGS)?;
                let resource = uri::resource_name(
                    &required(&args, "resource", "\"configmaps\"")?,
                    "the resource argument",
                )?;
                let sel = Selection {
                    cluster: cluster_arg(&args)?,
                    resource,
                    namespace: str_arg(&args, "namespace")?,
                    label_selector: str_arg(&args, "labelSelector")?,
                    field_selector: str_arg(&args, "fieldSelector")?,
                    metadata: false,
                };
                let items = match str_arg(&args, "name")? {
                    None => self.kubectl.list(&sel).await?,
                    Some(n) => {
                        let mut one = sel.clone();
                        one.resource = format!("{}/{}", sel.resource, kubectl::object_name(&n)?);
                        self.kubectl.list(&one).await?
                    }
                };
                let v = if args.contains_key("name") {
                    items.into_iter().next().unwrap_or(Value::Null)
                } else {
                    json!({"items": items})
                };
                Ok(json_result(v))
            }
            "get_api_resources" => {
                check_args(&args, &["workspace", "kcp", "context"])?;
                let c = cluster_arg(&args)?;
                Ok(json_result(self.api_resources(&c).await?))
            }
            "kubectl_apply" if self.config.read_write => {
                check_args(
                    &args,
                    &["manifest", "namespace", "workspace", "kcp", "context"],
                )?;
                let manifest = match args.get("manifest") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Object(_)) | Some(v @ Value::Array(_)) => v.to_string(),
                    _ => {
                        return Err(SourceError::InvalidParams(
                            "missing argument manifest; pass the manifest as YAML/JSON text or an object"
                                .into(),
                        ));
                    }
                };
                let mut a = vec!["apply".to_owned(), "-f".into(), "-".into()];
                if let Some(ns) = str_arg(&args, "namespace")? {
                    a.push(format!("--namespace={ns}"));
                }
                a.extend(["-o".into(), "name".into()]);
                let out = self
                    .kubectl
                    .run(&cluster_arg(&args)?, &a, Some(manifest.as_bytes()))
                    .await
                    .map_err(|e| SourceError::InvalidParams(e.to_string()))?;
                let applied: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
                Ok(json_result(json!({"applied": applied})))
            }
            "kubectl_delete" if self.config.read_write => {
                check_args(
                    &args,
                    &[
                        "resource",
                        "name",
                        "namespace",
                        "workspace",
                        "kcp",
                        "context",
                    ],
                )?;
                let resource = uri::resource_name(
                    &required(&args, "resource", "\"configmaps\"")?,
                    "the resource argument",
                )?;
                let name = required(&args, "name", "\"my-object\"")?;
                let target = format!("{resource}/{}", kubectl::object_name(&name)?);
                let mut a = vec!["delete".to_owned(), target, "--wait=false".into()];
                if let Some(ns) = str_arg(&args, "namespace")? {
                    a.push(format!("--namespace={ns}"));
                }
                a.extend(["-o".into(), "name".into()]);
                let out = self
                    .kubectl
                    .run(&cluster_arg(&args)?, &a, None)
                    .await
                    .map_err(|e| SourceError::InvalidParams(e.to_string()))?;
                Ok(json_result(json!({"deleted": out.trim()})))
            }
            "kubectl_wait" => {
                check_args(
                    &args,
                    &[
                        "resource",
                        "name",
                        "namespace",
                        "labelSelector",
                        "for",
                        "timeout_s",
                        "workspace",
                        "kcp",
                        "context",
                    ],
                )?;
                let resource = uri::resource_name(
                    &required(&args, "resource", "\"pods\"")?,
                    "the resource argument",
                )?;
                let condition = required(&args, "for", "\"condition=Ready\"")?;
                let known = ["condition=", "jsonpath=", "delete", "create"];
                if !known.iter().any(|k| condition.starts_with(k)) {
                    return Err(SourceError::InvalidParams(format!(
                        "for={condition:?} is not a kubectl wait condition; use condition=NAME, delete, create or jsonpath={{...}}=VALUE"
                    )));
                }
                let timeout = timeout_arg(&args)?;
                let mut a = vec!["wait".to_owned()];
                match str_arg(&args, "name")? {
                    Some(n) => a.push(format!("{resource}/{}", kubectl::object_name(&n)?)),
                    None => a.push(resource),
                }
                match str_arg(&args, "labelSelector")? {
                    Some(l) => a.push(format!("--selector={l}")),
                    None if !args.contains_key("name") => a.push("--all".into()),
                    None => {}
                }
                if let Some(ns) = str_arg(&args, "namespace")? {
                    a.push(format!("--namespace={ns}"));
                }
                a.push(format!("--for={condition}"));
                a.push(format!("--timeout={timeout}s"));
                self.waited(&args, &a, timeout).await
            }
            "rollout_status" => {
                check_args(
                    &args,
                    &[
                        "resource",
                        "name",
                        "namespace",
                        "timeout_s",
                        "workspace",
                        "kcp",
                        "context",
                    ],
                )?;
                let resource = uri::resource_name(
                    &required(&args, "resource", "\"deployment\"")?,
                    "the resource argument",
                )?;
                let name = required(&args, "name", "\"web\"")?;
                let timeout = timeout_arg(&args)?;
                let mut a = vec![
                    "rollout".to_owned(),
                    "status".into(),
                    format!("{resource}/{}", kubectl::object_name(&name)?),
                    "--watch=true".into(),
                    format!("--timeout={timeout}s"),
                ];
                if let Some(ns) = str_arg(&args, "namespace")? {
                    a.push(format!("--namespace={ns}"));
                }
                self.waited(&args, &a, timeout).await
            }
            other => Err(SourceError::UnknownTool(other.to_owned())),
        }
    }

    /// Runs a waiting kubectl command: its output as the result, or its error as a tool
    /// error (the condition not met in time is an answer, not a failure of the call).
    async fn waited(
        &self,
        args: &JsonObject,
        a: &[String],
        timeout_s: u64,
    ) -> Result<CallToolResult, SourceError> {
        // kubectl's --timeout ends it; the limit here only bounds a kubectl that hangs.
        let limit = std::time::Duration::from_secs(timeout_s + 30);
        let (ok, text) = self
            .kubectl
            .run_waiting(&cluster_arg(args)?, a, limit)
            .await?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if ok {
            let mut r = CallToolResult::success(vec![Content::text(text.trim().to_owned())]);
            r.structured_content = Some(json!({"done": true, "output": lines}));
            Ok(r)
        } else {
            let mut r = CallToolResult::error(vec![Content::text(text.trim().to_owned())]);
            r.structured_content = Some(json!({"done": false, "output": lines}));
            Ok(r)
        }
    }
}

/// Longest `timeout_s` of a waiting tool.
const MAX_WAIT_S: u64 = 3600;

fn timeout_arg(args: &JsonObject) -> Result<u64, SourceError> {
    match args.get("timeout_s") {
        None | Some(Value::Null) => Ok(300),
        Some(v) => v
            .as_u64()
            .filter(|&t| (1..=MAX_WAIT_S).contains(&t))
            .ok_or_else(|| {
                SourceError::InvalidParams(format!(
                    "timeout_s must be a whole number of seconds from 1 to {MAX_WAIT_S}"
                ))
            }),
    }
}
