//! The URIs of the Kubernetes / kcp source:
//!
//! - `kcp-events://watch/{workspace}/{resource}{?namespace,labelSelector,fieldSelector,kcp,metadata}`
//! - `k8s-events://watch/{resource}{?namespace,labelSelector,fieldSelector,context,metadata}`
//! - `kcp-api://{workspace}/resources{?kcp}` and `k8s-api://resources{?context}`
//!
//! `namespace=*` means all namespaces; no namespace means the kubeconfig's default. `kcp`
//! names one of the server's kubeconfigs (`--kubeconfig NAME=PATH`); `context` picks a context
//! of the kubeconfig.

use crate::mcp::source::SourceError;

/// Where a kubectl command goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Cluster {
    /// The kubeconfig's name (`?kcp=`); `None` is the default one.
    pub kubeconfig: Option<String>,
    /// A kcp workspace, reached under the server's `/clusters/{workspace}` path.
    pub workspace: Option<String>,
    /// A kubeconfig context (`?context=`).
    pub context: Option<String>,
}

/// What one watch URI selects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selection {
    pub cluster: Cluster,
    pub resource: String,
    /// `None`: the kubeconfig's default namespace; `Some("*")`: all namespaces.
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// `?metadata=true`: each object's metadata alone (apiVersion, kind, metadata), asked of the
    /// API as PartialObjectMetadata, so neither herald nor the wire carries specs and status.
    pub metadata: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum K8sUri {
    Watch(Selection),
    ApiResources(Cluster),
}

pub const KCP_WATCH_TEMPLATE: &str = "kcp-events://watch/{workspace}/{resource}{?namespace,labelSelector,fieldSelector,kcp,metadata}";
pub const K8S_WATCH_TEMPLATE: &str =
    "k8s-events://watch/{resource}{?namespace,labelSelector,fieldSelector,context,metadata}";
pub const KCP_API_TEMPLATE: &str = "kcp-api://{workspace}/resources{?kcp}";
pub const K8S_API_TEMPLATE: &str = "k8s-api://resources{?context}";

fn invalid(msg: String) -> SourceError {
    SourceError::InvalidParams(msg)
}

/// Whether `uri` is one of this source's schemes at all (the rest are `NotFound`).
pub fn is_ours(uri: &str) -> bool {
    ["kcp-events://", "k8s-events://", "kcp-api://", "k8s-api://"]
        .iter()
        .any(|p| uri.starts_with(p))
}

pub fn parse(uri: &str) -> Result<K8sUri, SourceError> {
    let (head, query) = match uri.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (uri, None),
    };
    let params = parse_query(query.unwrap_or(""))?;
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let allow = |names: &[&str]| -> Result<(), SourceError> {
        for (n, _) in &params {
            if !names.contains(&n.as_str()) {
                return Err(invalid(format!(
                    "unknown query parameter {n} in {uri}; this URI takes {}",
                    names.join(", ")
                )));
            }
        }
        Ok(())
    };
    if let Some(rest) = head.strip_prefix("kcp-events://watch/") {
        allow(&[
            "namespace",
            "labelSelector",
            "fieldSelector",
            "kcp",
            "metadata",
        ])?;
        let (ws, resource) = rest.split_once('/').ok_or_else(|| {
            invalid(format!(
                "{uri} has no resource; the form is kcp-events://watch/{{workspace}}/{{resource}}, e.g. kcp-events://watch/root:app/configmaps?namespace=*"
            ))
        })?;
        return Ok(K8sUri::Watch(Selection {
            cluster: Cluster {
                kubeconfig: get("kcp"),
                workspace: Some(workspace(ws, uri)?),
                context: None,
            },
            resource: resource_name(resource, uri)?,
            namespace: namespace(get("namespace"), uri)?,
            label_selector: get("labelSelector"),
            field_selector: get("fieldSelector"),
            metadata: metadata(get("metadata"), uri)?,
        }));
    }
    if let Some(resource) = head.strip_prefix("k8s-events://watch/") {
        allow(&[
            "namespace",
            "labelSelector",
            "fieldSelector",
            "context",
            "metadata",
        ])?;
        return Ok(K8sUri::Watch(Selection {
            cluster: Cluster {
                kubeconfig: None,
                workspace: None,
                context: get("context"),
            },
            resource: resource_name(resource, uri)?,
            namespace: namespace(get("namespace"), uri)?,
            label_selector: get("labelSelector"),
            field_selector: get("fieldSelector"),
            metadata: metadata(get("metadata"), uri)?,
        }));
    }
    if let Some(rest) = head.strip_prefix("kcp-api://") {
        allow(&["kcp"])?;
        let ws = rest.strip_suffix("/resources").ok_or_else(|| {
            invalid(format!(
                "{uri} is not an API resources URI; the form is kcp-api://{{workspace}}/resources"
            ))
        })?;
        return Ok(K8sUri::ApiResources(Cluster {
            kubeconfig: get("kcp"),
            workspace: Some(workspace(ws, uri)?),
            context: None,
        }));
    }
    if head == "k8s-api://resources" {
        allow(&["context"])?;
        return Ok(K8sUri::ApiResources(Cluster {
            kubeconfig: None,
            workspace: None,
            context: get("context"),
        }));
    }
    Err(SourceError::NotFound { uri: uri.into() })
}

/// A kcp workspace path: `root`, `root:org:app`.
pub fn workspace(ws: &str, uri: &str) -> Result<String, SourceError> {
    let ok = !ws.is_empty()
        && ws.split(':').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    if !ok {
        return Err(invalid(format!(
            "bad workspace {ws:?} in {uri}; a workspace is a path like root:org:app (lowercase letters, digits, '-', separated by ':')"
        )));
    }
    Ok(ws.to_owned())
}

/// A resource type as kubectl takes it: `configmaps`, `cm`, `deployments.apps`.
pub fn resource_name(r: &str, uri: &str) -> Result<String, SourceError> {
    let ok = !r.is_empty()
        && r.len() <= 253
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !r.starts_with(['-', '.']);
    if !ok {
        return Err(invalid(format!(
            "bad resource {r:?} in {uri}; name a resource type like configmaps or deployments.apps"
        )));
    }
    Ok(r.to_ascii_lowercase())
}

/// `metadata=true` / `metadata=false` (absent: false).
fn metadata(v: Option<String>, uri: &str) -> Result<bool, SourceError> {
    match v.as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(v) => Err(invalid(format!(
            "bad metadata={v} in {uri}; metadata=true watches each object's metadata alone, metadata=false (the default) whole objects"
        ))),
    }
}

fn namespace(ns: Option<String>, uri: &str) -> Result<Option<String>, SourceError> {
    match ns {
        None => Ok(None),
        Some(ns) if ns == "*" => Ok(Some(ns)),
        Some(ns)
            if !ns.is_empty()
                && ns.len() <= 63
                && ns
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') =>
        {
            Ok(Some(ns))
        }
        Some(ns) => Err(invalid(format!(
            "bad namespace {ns:?} in {uri}; use a namespace name, or * for all namespaces"
        ))),
    }
}

fn parse_query(q: &str) -> Result<Vec<(String, String)>, SourceError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (percent_decode(k)?, percent_decode(v)?);
        if out.iter().any(|(n, _)| *n == k) {
            return Err(invalid(format!("query parameter {k} is given twice")));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// `%XX` and `+` decoding of one query component.
pub fn percent_decode(s: &str) -> Result<String, SourceError> {
    use crate::runtime::percent::{Undecodable, decode};
    decode(&s.replace('+', " ")).map_err(|e| match e {
        Undecodable::Escape => invalid(format!("bad percent-escape in {s:?}")),
        Undecodable::Utf8 => invalid(format!("{s:?} does not decode to UTF-8")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kcp_watch_uris() {
        let K8sUri::Watch(s) = parse(
            "kcp-events://watch/root:app/configmaps?namespace=*&labelSelector=app%3Dweb&kcp=prod",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(s.cluster.workspace.as_deref(), Some("root:app"));
        assert_eq!(s.cluster.kubeconfig.as_deref(), Some("prod"));
        assert_eq!(s.resource, "configmaps");
        assert_eq!(s.namespace.as_deref(), Some("*"));
        assert_eq!(s.label_selector.as_deref(), Some("app=web"));
        assert_eq!(s.field_selector, None);
        let K8sUri::Watch(s) = parse("kcp-events://watch/root/deployments.apps").unwrap() else {
            panic!()
        };
        assert_eq!(s.namespace, None);
        assert_eq!(s.resource, "deployments.apps");
    }

    #[test]
    fn plain_cluster_and_api_uris() {
        let K8sUri::Watch(s) =
            parse("k8s-events://watch/pods?namespace=kube-system&context=kind-a").unwrap()
        else {
            panic!()
        };
        assert_eq!(s.cluster.context.as_deref(), Some("kind-a"));
        assert_eq!(s.cluster.workspace, None);
        assert_eq!(
            parse("kcp-api://root:app/resources").unwrap(),
            K8sUri::ApiResources(Cluster {
                kubeconfig: None,
                workspace: Some("root:app".into()),
                context: None
            })
        );
        assert!(matches!(
            parse("k8s-api://resources").unwrap(),
            K8sUri::ApiResources(_)
        ));
    }

    #[test]
    fn bad_uris_say_what_is_wrong() {
        for (uri, needle) in [
            ("kcp-events://watch/root:app", "has no resource"),
            ("kcp-events://watch/Root/configmaps", "bad workspace"),
            ("kcp-events://watch/root::a/configmaps", "bad workspace"),
            ("kcp-events://watch/root/config maps", "bad resource"),
            ("kcp-events://watch/root/cm?namespace=A_B", "bad namespace"),
            (
                "kcp-events://watch/root/cm?context=x",
                "unknown query parameter context",
            ),
            ("k8s-events://watch/cm?kcp=x", "unknown query parameter kcp"),
            (
                "k8s-events://watch/cm?namespace=a&namespace=b",
                "given twice",
            ),
            ("k8s-events://watch/cm?labelSelector=%zz", "percent-escape"),
            ("kcp-api://root/other", "not an API resources URI"),
        ] {
            let e = parse(uri).unwrap_err().to_string();
            assert!(e.contains(needle), "{uri}: {e}");
        }
        assert!(matches!(
            parse("k8s-api://nothing"),
            Err(SourceError::NotFound { .. })
        ));
    }
}
