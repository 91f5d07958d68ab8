//! What a client reads from the k8s source: the resource templates it offers, and
//! `resources/read` of a watch URI (the shared watcher's event log, once seeded) or of an API
//! resources list (one `kubectl api-resources`).

use rmcp::model::ResourceTemplate;

use super::K8s;
use super::uri::{self, K8sUri};
use crate::mcp::ring::EVENT_LOG_MIME;
use crate::mcp::source::{Contents, SourceError};

fn template(uri: &str, name: &str, mime: &str, description: &str) -> ResourceTemplate {
    ResourceTemplate::new(uri, name)
        .with_mime_type(mime)
        .with_description(description)
}

/// The URI templates of the k8s source, each with an example.
pub(super) fn templates() -> Vec<ResourceTemplate> {
    vec![
        template(
            uri::KCP_WATCH_TEMPLATE,
            "kcp objects",
            EVENT_LOG_MIME,
            "Event log of one resource type in a kcp workspace: ADDED / MODIFIED (with old) / DELETED, each \
             with the object (managedFields stripped), numbered by seq; ERROR events report source failures. \
             namespace=* means all namespaces; labelSelector and fieldSelector narrow it.\n\
             Example: await watch_start(name=\"cm\", uri=\"kcp-events://watch/root:app/configmaps?namespace=*\")",
        ),
        template(
            uri::K8S_WATCH_TEMPLATE,
            "Kubernetes objects",
            EVENT_LOG_MIME,
            "Event log of one resource type in a Kubernetes cluster: ADDED / MODIFIED (with old) / DELETED, \
             each with the object, numbered by seq; ERROR events report source failures. namespace=* means \
             all namespaces; context picks a kubeconfig context.\n\
             Example: await watch_start(name=\"pods\", uri=\"k8s-events://watch/pods?namespace=*\")",
        ),
        template(
            uri::KCP_API_TEMPLATE,
            "kcp API resources",
            "application/json",
            "The resource types a kcp workspace serves (name, shortNames, apiVersion, namespaced, kind, \
             verbs); readable, not watchable.\n\
             Example: await read_resource(uri=\"kcp-api://root:app/resources\")",
        ),
        template(
            uri::K8S_API_TEMPLATE,
            "Kubernetes API resources",
            "application/json",
            "The resource types the cluster serves (name, shortNames, apiVersion, namespaced, kind, verbs); \
             readable, not watchable.\n\
             Example: await read_resource(uri=\"k8s-api://resources\")",
        ),
    ]
}

impl K8s {
    /// Reads `uri`: a watch URI's event log (from `after`, the reader's hint) or an API
    /// resources list.
    pub(super) async fn read_uri(
        &self,
        uri: &str,
        after: Option<u64>,
    ) -> Result<Contents, SourceError> {
        match uri::parse(uri)? {
            // The read shares (or starts) the URI's watcher and awaits its seed: a listen's
            // baseline read may even arrive before the listen's own hold.
            K8sUri::Watch(sel) => {
                let lease = self.lease(uri, sel)?;
                let w = lease.watcher.as_ref().expect("held");
                w.read(after).await
            }
            K8sUri::ApiResources(c) => Ok(Contents::json(&self.api_resources(&c).await?)),
        }
    }
}
