//! What a watcher knows: the objects it has seen (uid → object), and the rules that turn
//! kubectl's output into the event log: ADDED for a known uid + resourceVersion is suppressed
//! (kubectl re-lists everything as ADDED whenever it restarts), MODIFIED carries `old`, and a
//! re-list after a gap yields synthetic ADDED / MODIFIED / DELETED for what changed meanwhile.

use std::collections::HashMap;

use serde_json::Value;

/// One event for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub kind: &'static str,
    pub object: Value,
    pub old: Option<Value>,
    /// Found by a re-list rather than seen on the watch stream.
    pub synthetic: bool,
}

#[derive(Debug, Default)]
pub struct Known {
    objects: HashMap<String, Value>,
}

/// Drops `metadata.managedFields`: large, and noise to every reader.
pub fn strip(object: &mut Value) {
    if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
}

/// Keeps of an object only what a metadata watch carries: `apiVersion`, `kind`, `metadata`.
pub fn metadata_only(object: &mut Value) {
    if let Some(m) = object.as_object_mut() {
        m.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
    }
}

/// An object's identity: its uid, or namespace/name when a (fake or odd) server gives none.
fn key(object: &Value) -> String {
    let m = &object["metadata"];
    match m["uid"].as_str() {
        Some(uid) if !uid.is_empty() => uid.to_owned(),
        _ => format!(
            "{}/{}",
            m["namespace"].as_str().unwrap_or(""),
            m["name"].as_str().unwrap_or("")
        ),
    }
}

fn version(object: &Value) -> Option<&str> {
    object["metadata"]["resourceVersion"].as_str()
}

fn sort_key(object: &Value) -> (String, String) {
    let m = &object["metadata"];
    (
        m["namespace"].as_str().unwrap_or("").to_owned(),
        m["name"].as_str().unwrap_or("").to_owned(),
    )
}

impl Known {
    /// What a list (`kubectl get -o json`'s `items`) says exists.
    pub fn seed(items: Vec<Value>) -> Known {
        let mut k = Known::default();
        for mut o in items {
            strip(&mut o);
            k.objects.insert(key(&o), o);
        }
        k
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// One event from the watch stream. `None`: nothing new (a duplicate, or a BOOKMARK).
    pub fn apply(&mut self, kind: &str, mut object: Value) -> Option<Change> {
        strip(&mut object);
        let k = key(&object);
        match kind {
            "ADDED" | "MODIFIED" => {
                let old = self.objects.get(&k);
                if let Some(old) = old
                    && version(old).is_some()
                    && version(old) == version(&object)
                {
                    return None;
                }
                let old = self.objects.insert(k, object.clone());
                let kind = match (&old, kind) {
                    // ADDED for an object already known at another version: it changed while
                    // kubectl restarted.
                    (Some(_), _) => "MODIFIED",
                    (None, "ADDED") => "ADDED",
                    (None, _) => "MODIFIED",
                };
                Some(Change {
                    kind,
                    object,
                    old,
                    synthetic: false,
                })
            }
            "DELETED" => {
                let old = self.objects.remove(&k);
                Some(Change {
                    kind: "DELETED",
                    object: old.unwrap_or(object),
                    old: None,
                    synthetic: false,
                })
            }
            _ => None,
        }
    }

    /// A fresh list after a gap: the synthetic events that bring a reader up to date, in
    /// namespace/name order.
    pub fn reconcile(&mut self, items: Vec<Value>) -> Vec<Change> {
        let mut fresh = Known::seed(items);
        let mut out = Vec::new();
        for (k, o) in &fresh.objects {
            match self.objects.remove(k) {
                None => out.push(Change {
                    kind: "ADDED",
                    object: o.clone(),
                    old: None,
                    synthetic: true,
                }),
                Some(old) if version(&old) != version(o) || version(o).is_none() && old != *o => {
                    out.push(Change {
                        kind: "MODIFIED",
                        object: o.clone(),
                        old: Some(old),
                        synthetic: true,
                    })
                }
                Some(_) => {}
            }
        }
        for (_, old) in self.objects.drain() {
            out.push(Change {
                kind: "DELETED",
                object: old,
                old: None,
                synthetic: true,
            });
        }
        std::mem::swap(&mut self.objects, &mut fresh.objects);
        out.sort_by_key(|c| sort_key(&c.object));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str, uid: &str, rv: &str, data: Value) -> Value {
        json!({"kind": "ConfigMap", "metadata": {"name": name, "namespace": "default", "uid": uid,
               "resourceVersion": rv, "managedFields": [{"manager": "kubectl"}]}, "data": data})
    }

    #[test]
    fn added_for_a_known_version_is_suppressed() {
        let mut k = Known::seed(vec![cm("a", "u1", "1", json!({}))]);
        assert_eq!(k.apply("ADDED", cm("a", "u1", "1", json!({}))), None);
        let c = k.apply("ADDED", cm("b", "u2", "2", json!({}))).unwrap();
        assert_eq!(c.kind, "ADDED");
        assert_eq!(k.apply("ADDED", cm("b", "u2", "2", json!({}))), None);
        assert_eq!(k.apply("BOOKMARK", json!({"metadata": {}})), None);
    }

    #[test]
    fn modified_carries_old_and_managed_fields_are_stripped() {
        let mut k = Known::seed(vec![cm("a", "u1", "1", json!({"x": "1"}))]);
        let c = k
            .apply("MODIFIED", cm("a", "u1", "2", json!({"x": "2"})))
            .unwrap();
        assert_eq!(c.kind, "MODIFIED");
        assert_eq!(c.old.as_ref().unwrap()["data"], json!({"x": "1"}));
        assert!(c.object["metadata"].get("managedFields").is_none());
        assert!(c.old.unwrap()["metadata"].get("managedFields").is_none());
        // A re-listed ADDED at a newer version is a change, reported as MODIFIED.
        let c = k
            .apply("ADDED", cm("a", "u1", "3", json!({"x": "3"})))
            .unwrap();
        assert_eq!(c.kind, "MODIFIED");
        let c = k.apply("DELETED", cm("a", "u1", "4", json!({}))).unwrap();
        assert_eq!(
            (c.kind, c.object["data"].clone()),
            ("DELETED", json!({"x": "3"}))
        );
        assert!(k.is_empty());
    }

    #[test]
    fn reconcile_reports_what_changed_in_the_gap() {
        let mut k = Known::seed(vec![
            cm("keep", "u1", "1", json!({})),
            cm("change", "u2", "1", json!({"v": "a"})),
            cm("gone", "u3", "1", json!({})),
        ]);
        let out = k.reconcile(vec![
            cm("keep", "u1", "1", json!({})),
            cm("change", "u2", "5", json!({"v": "b"})),
            cm("new", "u4", "6", json!({})),
        ]);
        let got: Vec<(&str, &str)> = out
            .iter()
            .map(|c| (c.kind, c.object["metadata"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("MODIFIED", "change"),
                ("DELETED", "gone"),
                ("ADDED", "new")
            ]
        );
        assert!(out.iter().all(|c| c.synthetic));
        assert_eq!(out[0].old.as_ref().unwrap()["data"], json!({"v": "a"}));
        assert_eq!(k.len(), 3);
        // After the reconcile, kubectl's re-listed ADDEDs are all duplicates.
        for (n, u, rv) in [
            ("keep", "u1", "1"),
            ("change", "u2", "5"),
            ("new", "u4", "6"),
        ] {
            assert_eq!(k.apply("ADDED", cm(n, u, rv, json!({}))), None);
        }
        assert!(k.reconcile(vec![]).iter().all(|c| c.kind == "DELETED"));
    }
}
