//! The k8s source's tools: `kubectl_get` and `get_api_resources` (read-only), and with
//! `--read-write` `kubectl_apply` and `kubectl_delete` (destructive). Their schemas, the
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

impl K8s {
    /// The tools this source offers: the read-write ones only with `--read-write`.
    pub(super) fn tool_list(&self) -> Vec<Tool> {
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
        if self.config.read_write {
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
                Ok(json_result(self.kubectl.api_resources(&c).await?))
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
            other => Err(SourceError::UnknownTool(other.to_owned())),
        }
    }
}
