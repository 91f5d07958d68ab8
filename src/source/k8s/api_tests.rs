//! Unit tests of `api.rs` and its submodules (name resolution, collection paths, error
//! words that never quote a secret), kept beside it so the module itself stays readable.
use super::build::redacted;
use super::*;

fn t(group: &str, version: &str, plural: &str, kind: &str, short: &[&str]) -> ApiType {
    ApiType {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        kind: kind.into(),
        short_names: short.iter().map(|s| s.to_string()).collect(),
        namespaced: true,
        verbs: vec!["list".into(), "watch".into()],
        categories: Vec::new(),
    }
}

#[test]
fn resources_resolve_as_kubectl_names_them() {
    let types = vec![
        t("", "v1", "pods", "Pod", &["po"]),
        t("", "v1", "events", "Event", &["ev"]),
        t("apps", "v1", "deployments", "Deployment", &["deploy"]),
        t("events.k8s.io", "v1", "events", "Event", &["ev"]),
    ];
    let g = |r: &str| resolve(&types, r).map(|t| format!("{}/{}", t.group, t.plural));
    assert_eq!(g("pods").as_deref(), Some("/pods"));
    assert_eq!(g("pod").as_deref(), Some("/pods"));
    assert_eq!(g("po").as_deref(), Some("/pods"));
    assert_eq!(g("Pod").as_deref(), Some("/pods"));
    assert_eq!(g("deploy").as_deref(), Some("apps/deployments"));
    assert_eq!(g("deployments.apps").as_deref(), Some("apps/deployments"));
    assert_eq!(
        g("deployments.v1.apps").as_deref(),
        Some("apps/deployments")
    );
    assert_eq!(g("deployments.extensions"), None);
    // The core group first, as kubectl picks it; the group qualifier picks the other.
    assert_eq!(g("events").as_deref(), Some("/events"));
    assert_eq!(
        g("events.events.k8s.io").as_deref(),
        Some("events.k8s.io/events")
    );
    assert_eq!(g("nothing"), None);
}

#[test]
fn paths_follow_group_and_scope() {
    let pods = t("", "v1", "pods", "Pod", &[]);
    assert_eq!(pods.path(Some("ns1")), "/api/v1/namespaces/ns1/pods");
    assert_eq!(pods.path(None), "/api/v1/pods");
    let mut nodes = t("", "v1", "nodes", "Node", &[]);
    nodes.namespaced = false;
    assert_eq!(
        nodes.path(Some("ns1")),
        "/api/v1/nodes",
        "cluster-scoped ignores -n"
    );
    let d = t("apps", "v1", "deployments", "Deployment", &[]);
    assert_eq!(d.path(Some("a")), "/apis/apps/v1/namespaces/a/deployments");
    assert_eq!(d.to_json()["apiVersion"], "apps/v1");
}

#[test]
fn server_urls_are_quoted_without_secrets() {
    let u: http::Uri = "https://user:pw@10.0.0.1:6443/clusters/x?token=y"
        .parse()
        .unwrap();
    assert_eq!(redacted(&u), "https://10.0.0.1:6443/clusters/x");
    let u: http::Uri = "https://10.0.0.1/k8s/".parse().unwrap();
    assert_eq!(redacted(&u), "https://10.0.0.1");
}

#[test]
fn exec_failures_never_quote_the_plugin() {
    use std::os::unix::process::ExitStatusExt;
    let e = kube::client::AuthError::AuthExecRun {
        cmd: "kubelogin --client-secret=s3cret".into(),
        out: Box::new(std::process::Output {
            status: std::process::ExitStatus::from_raw(256),
            stdout: b"token: s3cret".to_vec(),
            stderr: b"VAULT_TOKEN=s3cret".to_vec(),
        }),
    };
    let words = kube_words(&kube::Error::Auth(e));
    assert!(!words.contains("s3cret"), "{words}");
    assert!(words.contains("exec credential plugin failed"), "{words}");
}
