//! Discovery of one cluster's resource types: [`ApiType`] (a type as discovery describes it,
//! its collection path and its `get_api_resources` row), [`resolve`] (the type kubectl would
//! pick for a name: plural, singular, short name or kind, optionally with `.group` or
//! `.version.group`), and the part of [`ClusterClient`] that discovers (legacy discovery of
//! `/api`, `/apis` and each group's preferred version, kept and run again at most every
//! [`REDISCOVER`] for an unknown name, a failure remembered for
//! [`DISCOVERY_FAILURE_MEMORY`]) and resolves with kubectl's `did you mean`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::{ApiError, ClusterClient, DISCOVERY_FAILURE_MEMORY, REDISCOVER, unavailable};
use crate::mcp::source::SourceError;
use crate::source::k8s::kubectl::did_you_mean;

/// One resource type as discovery describes it.
#[derive(Debug, Clone)]
pub struct ApiType {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    pub verbs: Vec<String>,
    pub categories: Vec<String>,
}

impl ApiType {
    pub(super) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Names `object` as one of this type (`apiVersion`, `kind`): a PartialObjectMetadata
    /// of a metadata watch reads as the object it describes.
    pub fn name(&self, object: &mut Value) {
        if let Some(m) = object.as_object_mut() {
            m.insert("apiVersion".into(), self.api_version().into());
            m.insert("kind".into(), self.kind.clone().into());
        }
    }

    /// The collection's path for `namespace` (`None`: all namespaces, or cluster-scoped).
    pub(super) fn path(&self, namespace: Option<&str>) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match namespace {
            Some(ns) if self.namespaced => format!("{base}/namespaces/{ns}/{}", self.plural),
            _ => format!("{base}/{}", self.plural),
        }
    }

    /// Whether kubectl would take `name` (plural, singular, short name or kind) with the
    /// optional `.group` / `.version.group` qualifier `qual` for this type.
    fn answers_to(&self, name: &str, qual: Option<&str>) -> bool {
        let named = self.plural == name
            || self.singular == name
            || self.short_names.iter().any(|s| s == name)
            || self.kind.eq_ignore_ascii_case(name);
        named
            && match qual {
                None => true,
                Some(q) => {
                    q == self.group
                        || q.split_once('.')
                            .is_some_and(|(v, g)| v == self.version && g == self.group)
                        || (self.group.is_empty() && q == self.version)
                }
            }
    }

    pub(super) fn to_json(&self) -> Value {
        json!({"name": self.plural, "shortNames": self.short_names, "apiVersion": self.api_version(),
               "namespaced": self.namespaced, "kind": self.kind, "verbs": self.verbs,
               "categories": self.categories})
    }
}

/// Finds the type kubectl would pick for `resource` among `types` (discovery order: the
/// core group first).
pub fn resolve<'a>(types: &'a [ApiType], resource: &str) -> Option<&'a ApiType> {
    let lower = resource.to_ascii_lowercase();
    let (name, qual) = match lower.split_once('.') {
        Some((n, q)) => (n, Some(q)),
        None => (lower.as_str(), None),
    };
    // Exact plural names win over singular, short and kind matches (as kubectl's RESTMapper).
    types
        .iter()
        .find(|t| t.plural == name && t.answers_to(name, qual))
        .or_else(|| types.iter().find(|t| t.answers_to(name, qual)))
}

/// What discovery last gave.
pub(super) enum Discovered {
    Types(Instant, Arc<Vec<ApiType>>),
    Failed(Instant, SourceError),
}

impl ClusterClient {
    /// The cluster's resource types: discovered once, again when `fresh` and the last
    /// discovery is older than [`REDISCOVER`]. A failure is remembered for
    /// [`DISCOVERY_FAILURE_MEMORY`]; a failed rediscovery keeps the last good one.
    pub(super) async fn types(&self, fresh: bool) -> Result<Arc<Vec<ApiType>>, SourceError> {
        let mut d = self.discovery.lock().await;
        match &*d {
            Some(Discovered::Types(at, types)) if !fresh || at.elapsed() < REDISCOVER => {
                return Ok(types.clone());
            }
            Some(Discovered::Failed(at, e)) if at.elapsed() < DISCOVERY_FAILURE_MEMORY => {
                return Err(e.clone());
            }
            _ => {}
        }
        match self.discover().await {
            Ok(types) => {
                let types = Arc::new(types);
                *d = Some(Discovered::Types(Instant::now(), types.clone()));
                Ok(types)
            }
            Err(e) => {
                if let Some(Discovered::Types(_, types)) = &*d {
                    tracing::debug!(error = %e, "discovery failed; keeping the last one");
                    return Ok(types.clone());
                }
                *d = Some(Discovered::Failed(Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    async fn get_json(&self, path: &str, token: Option<&str>) -> Result<Value, SourceError> {
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| unavailable(format!("bad discovery path {path}: {e}")))?;
        let lane = self.lane(0);
        let res = self
            .send(&lane, req, token)
            .await
            .map_err(ApiError::into_source)?;
        let body = self.body(res, "discovery").await?;
        serde_json::from_slice(&body).map_err(|e| {
            unavailable(format!(
                "the API server at {} answered {path} with no JSON: {e}",
                self.server
            ))
        })
    }

    /// Legacy discovery: `/api` and its versions, `/apis` and each group's preferred
    /// version (these fetched concurrently).
    async fn discover(&self) -> Result<Vec<ApiType>, SourceError> {
        // One token for the whole discovery (--token-command runs once, not once a group).
        let token = self.token().await?;
        let token = token.as_deref();
        // One request first, alone: until a connection exists the pool cannot know that it
        // will be h2, and concurrent first requests would each open one.
        let core = self.get_json("/api", token).await?;
        let groups = self.get_json("/apis", token).await?;
        let mut versions: Vec<(String, String)> = Vec::new();
        if let Some(v) = core["versions"]
            .as_array()
            .and_then(|v| v.first())
            .and_then(Value::as_str)
        {
            versions.push((String::new(), v.to_owned()));
        }
        for g in groups["groups"].as_array().into_iter().flatten() {
            let name = g["name"].as_str().unwrap_or_default();
            let pref = g["preferredVersion"]["version"]
                .as_str()
                .or_else(|| g["versions"][0]["version"].as_str());
            if let Some(v) = pref
                && !name.is_empty()
            {
                versions.push((name.to_owned(), v.to_owned()));
            }
        }
        use futures::StreamExt;
        let lists: Vec<(String, String, Result<Value, SourceError>)> =
            futures::stream::iter(versions)
                .map(|(group, version)| async move {
                    let path = if group.is_empty() {
                        format!("/api/{version}")
                    } else {
                        format!("/apis/{group}/{version}")
                    };
                    let r = self.get_json(&path, token).await;
                    (group, version, r)
                })
                .buffered(8)
                .collect()
                .await;
        let mut out = Vec::new();
        for (group, version, list) in lists {
            // A group whose discovery fails (an aggregated API that is down) is left out, as
            // kubectl does, unless it is the core group.
            let list = match list {
                Ok(l) => l,
                Err(e) if group.is_empty() => return Err(e),
                Err(e) => {
                    tracing::debug!(%group, error = %e, "discovery of an API group failed");
                    continue;
                }
            };
            for r in list["resources"].as_array().into_iter().flatten() {
                let plural = r["name"].as_str().unwrap_or_default();
                if plural.is_empty() || plural.contains('/') {
                    continue;
                }
                let strings = |k: &str| -> Vec<String> {
                    r[k].as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                };
                let kind = r["kind"].as_str().unwrap_or_default().to_owned();
                out.push(ApiType {
                    group: group.clone(),
                    version: version.clone(),
                    plural: plural.to_owned(),
                    singular: r["singularName"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .unwrap_or_else(|| kind.to_ascii_lowercase()),
                    kind,
                    short_names: strings("shortNames"),
                    namespaced: r["namespaced"].as_bool().unwrap_or(false),
                    verbs: strings("verbs"),
                    categories: strings("categories"),
                });
            }
        }
        Ok(out)
    }

    /// The type `resource` names (with `fresh`, after discovering again if the last one is
    /// old enough: a 404 said it moved), or an error with `did you mean` that reads as
    /// kubectl's.
    pub(super) async fn resolve(
        &self,
        resource: &str,
        fresh: bool,
    ) -> Result<ApiType, SourceError> {
        if !fresh {
            let types = self.types(false).await?;
            if let Some(t) = resolve(&types, resource) {
                return Ok(t.clone());
            }
        }
        // Perhaps installed (or moved) since: look again, at most every REDISCOVER.
        let types = self.types(true).await?;
        if let Some(t) = resolve(&types, resource) {
            return Ok(t.clone());
        }
        let list = Value::Array(types.iter().map(ApiType::to_json).collect());
        let names = did_you_mean(resource, &list);
        let hint = if names.is_empty() {
            "; get_api_resources lists the resource types this cluster serves".to_owned()
        } else {
            format!("; did you mean: {}?", names.join(", "))
        };
        Err(SourceError::InvalidParams(format!(
            "the server doesn't have a resource type \"{resource}\"{hint}"
        )))
    }
}
