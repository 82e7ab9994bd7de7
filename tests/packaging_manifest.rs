//! Checks of `packaging/kubernetes/`: the DaemonSet manifest and its image.
//!
//! YAML is read with `serde_yaml_ng` (the crate the agent reads kubeconfig files with) into
//! `serde_json` values.
//!
//! The install script of the init container is not only inspected but run, with `sh`, against
//! temporary directories standing in for the node's `/opt/cni/bin` and `/etc/cni/net.d`.

use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFEST: &str = "packaging/kubernetes/sticky-cni-daemonset.yaml";
const DOCKERFILE: &str = "packaging/kubernetes/Dockerfile";
const CONFLIST: &str = "conf-examples/11-sticky-vxlan-cluster.conflist";
const CONFLIST_NAME: &str = "11-sticky-vxlan-cluster.conflist";

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Every YAML document of `rel`, as JSON values.
fn yaml_documents(rel: &str) -> Vec<Value> {
    use serde::Deserialize;
    let text = fs::read_to_string(repo_file(rel)).expect("manifest");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{rel} is not valid YAML: {e}")))
        .collect()
}

fn manifest() -> Vec<Value> {
    yaml_documents(MANIFEST)
}

fn doc<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected exactly one {kind} in {MANIFEST}");
    found[0]
}

fn pod_spec(docs: &[Value]) -> &Value {
    &doc(docs, "DaemonSet")["spec"]["template"]["spec"]
}

/// Init containers and containers of the DaemonSet's pod.
fn containers(pod: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|k| pod[*k].as_array())
        .flatten()
        .collect()
}

fn install_container(pod: &Value) -> &Value {
    pod["initContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "install-cni"))
        .expect("an init container named install-cni")
}

fn agent_container(pod: &Value) -> &Value {
    pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "agent"))
        .expect("a container named agent")
}

fn env_value<'a>(container: &'a Value, name: &str) -> &'a str {
    container["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == name))
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("install-cni has no env {name}"))
}

/// The hostPath volume mounted at `mount_path` in `container`: (host path, type).
fn host_path_at<'a>(pod: &'a Value, container: &Value, mount_path: &str) -> (&'a str, &'a str) {
    let volume_name = container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == mount_path))
        .and_then(|m| m["name"].as_str())
        .unwrap_or_else(|| panic!("nothing mounted at {mount_path}"));
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == volume_name))
        .unwrap_or_else(|| panic!("no volume {volume_name}"));
    let path = volume["hostPath"]["path"]
        .as_str()
        .unwrap_or_else(|| panic!("volume {volume_name} is not a hostPath"));
    (path, volume["hostPath"]["type"].as_str().unwrap_or(""))
}

/// `name:tag[@sha256:<64 hex>]` with an exact version as the tag, or an error saying why not.
fn check_pinned(image: &str) -> Result<(), String> {
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{image}: digest must be sha256:<64 hex digits>"));
        }
    }
    // A tag follows the last ':' after the last '/' (a registry may carry a port).
    let last_part = name_tag.rsplit('/').next().unwrap_or(name_tag);
    let Some((_, tag)) = last_part.split_once(':') else {
        return Err(format!("{image}: no tag (means :latest)"));
    };
    let version = tag.strip_prefix('v').unwrap_or(tag);
    let core = version.split(['-', '+']).next().unwrap_or("");
    let numbers: Vec<&str> = core.split('.').collect();
    let exact = (2..=3).contains(&numbers.len())
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !exact {
        return Err(format!(
            "{image}: tag {tag:?} is not an exact version (want e.g. 1.2.3)"
        ));
    }
    Ok(())
}

#[test]
fn image_pin_rule_rejects_floating_tags() {
    for ok in [
        "registry.k8s.io/pause:3.9",
        "registry.example.org/sticky-cni:0.1.0",
        "localhost:5000/sticky-cni:0.1.0@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "rust:1.95.0-bookworm",
    ] {
        assert_eq!(check_pinned(ok), Ok(()), "{ok}");
    }
    for bad in [
        "sticky-cni",
        "sticky-cni:latest",
        "localhost:5000/sticky-cni",
        "rust:1-bookworm",
        "rust:bookworm",
        "sticky-cni:0.1.0@sha256:abc",
    ] {
        assert!(check_pinned(bad).is_err(), "{bad} should be refused");
    }
}

#[test]
fn manifest_runs_the_agent_with_a_service_account_that_only_reads_nodes() {
    let docs = manifest();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet"
        ]
    );
    for d in &docs {
        if !d["kind"].as_str().unwrap_or("").starts_with("ClusterRole") {
            assert_eq!(d["metadata"]["namespace"], "kube-system", "{}", d["kind"]);
        }
    }
    let pod = pod_spec(&docs);
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    let sa = doc(&docs, "ServiceAccount")["metadata"]["name"].clone();
    assert_eq!(pod["serviceAccountName"], sa);
    assert_ne!(
        pod["automountServiceAccountToken"], false,
        "the agent needs its token"
    );
    let binding = doc(&docs, "ClusterRoleBinding");
    assert_eq!(
        binding["roleRef"]["name"],
        doc(&docs, "ClusterRole")["metadata"]["name"]
    );
    assert_eq!(binding["subjects"][0]["name"], sa);
    assert_eq!(binding["subjects"][0]["namespace"], "kube-system");

    let agent = agent_container(pod);
    let command: Vec<&str> = agent["command"]
        .as_array()
        .expect("agent command")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(&command[..2], ["/sticky-cni/bin/sticky-vxlan", "agent"]);
    let config = command
        .iter()
        .position(|a| *a == "--config")
        .and_then(|i| command.get(i + 1))
        .expect("--config");
    assert_eq!(*config, format!("/etc/cni/net.d/{CONFLIST_NAME}"));
    // RBAC: get/list/watch on nodes; patch exactly when the agent publishes.
    let rules = doc(&docs, "ClusterRole")["rules"]
        .as_array()
        .expect("rules")
        .clone();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0]["resources"], serde_json::json!(["nodes"]));
    let verbs: Vec<&str> = rules[0]["verbs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let publishes = command.contains(&"--publish-flannel-annotations");
    let mut want = vec!["get", "list", "watch"];
    if publishes {
        want.push("patch");
    }
    assert_eq!(verbs, want);
    // Host network namespace, NET_ADMIN and nothing else, the node's /etc/cni (conflist in,
    // peers file out) and the plugin's lock dir at the same paths.
    assert_eq!(
        agent["securityContext"]["capabilities"]["add"],
        serde_json::json!(["NET_ADMIN"])
    );
    assert_eq!(
        agent["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    assert_ne!(agent["securityContext"]["privileged"], true);
    for dir in ["/etc/cni", "/run/sticky-vxlan"] {
        let (host, _) = host_path_at(pod, agent, dir);
        assert_eq!(host, dir);
    }
    let conf: Value =
        serde_json::from_str(&fs::read_to_string(repo_file(CONFLIST)).unwrap()).unwrap();
    let peers_file = conf["plugins"][0]["peersFile"].as_str().unwrap();
    assert!(
        peers_file.starts_with("/etc/cni/"),
        "the agent writes {peers_file} through /etc/cni"
    );
    // Liveness on /healthz where --metrics-addr serves it.
    let probe = &agent["livenessProbe"]["httpGet"];
    assert_eq!(probe["path"], "/healthz");
    let addr = command
        .iter()
        .position(|a| *a == "--metrics-addr")
        .and_then(|i| command.get(i + 1))
        .expect("--metrics-addr");
    assert_eq!(
        *addr,
        format!("{}:{}", probe["host"].as_str().unwrap(), probe["port"])
    );
    assert_eq!(
        agent["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName",
        "NODE_NAME from the downward API"
    );
    let tolerates_all = pod["tolerations"].as_array().is_some_and(|t| {
        t.iter().any(|t| {
            t["operator"] == "Exists" && t.get("key").is_none() && t.get("effect").is_none()
        })
    });
    assert!(
        tolerates_all,
        "needs a toleration {{operator: Exists}} for every taint"
    );
}

#[test]
fn every_image_is_pinned_to_an_exact_version() {
    let docs = manifest();
    let pod = pod_spec(&docs);
    let all = containers(pod);
    assert!(all.len() >= 2, "install-cni and the agent at least");
    for c in &all {
        let image = c["image"].as_str().expect("every container names an image");
        if let Err(e) = check_pinned(image) {
            panic!("container {}: {e}", c["name"]);
        }
    }
    // The plugin image carries the crate's version, so a release bumps both together.
    let own = install_container(pod)["image"].as_str().unwrap_or("");
    let tag = own
        .split('@')
        .next()
        .and_then(|n| n.rsplit_once(':'))
        .map(|(_, t)| t);
    assert_eq!(
        tag,
        Some(env!("CARGO_PKG_VERSION")),
        "install-cni image {own}"
    );
    assert_eq!(
        agent_container(pod)["image"],
        own,
        "the agent runs from the same image"
    );

    let dockerfile = fs::read_to_string(repo_file(DOCKERFILE)).expect("Dockerfile");
    let bases: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("FROM "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert!(bases.len() >= 2, "a multi-stage build: {bases:?}");
    for base in bases {
        if let Err(e) = check_pinned(base) {
            panic!("{DOCKERFILE}: {e}");
        }
    }
}

#[test]
fn configmap_carries_the_conf_example_verbatim() {
    let docs = manifest();
    let example = fs::read_to_string(repo_file(CONFLIST)).expect("the conf example");
    let embedded = doc(&docs, "ConfigMap")["data"][CONFLIST_NAME]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap has no key {CONFLIST_NAME}"));
    assert_eq!(embedded, example, "ConfigMap and {CONFLIST} differ");

    let conf: Value = serde_json::from_str(embedded).expect("the conflist is JSON");
    let types: Vec<&str> = conf["plugins"]
        .as_array()
        .map(|p| p.iter().filter_map(|p| p["type"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(types, ["sticky-vxlan", "portmap"]);
    assert_eq!(conf["plugins"][0]["ipam"]["type"], "sticky-ipam");
    // One conflist for every node: no range here, each node's come from the peers file.
    assert!(
        sticky_cni::vxlan::config::Config::from_json("n", &conf["plugins"][0])
            .is_ok_and(|c| c.ranges_from_peers),
        "the DaemonSet's conflist must not pin one node's subnet"
    );

    // The DaemonSet installs that ConfigMap key, under that name.
    let pod = pod_spec(&docs);
    let install = install_container(pod);
    assert_eq!(env_value(install, "CONFLIST_NAME"), CONFLIST_NAME);
    let conf_dir = env_value(install, "CONFLIST_DIR");
    let volume_name = install["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == conf_dir))
        .and_then(|m| m["name"].as_str())
        .expect("the ConfigMap is mounted at CONFLIST_DIR");
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == volume_name))
        .expect("the conflist volume");
    assert_eq!(
        volume["configMap"]["name"],
        doc(&docs, "ConfigMap")["metadata"]["name"]
    );
}

#[test]
fn host_paths_are_the_cni_dirs_and_the_persistent_data_dir() {
    let docs = manifest();
    let pod = pod_spec(&docs);
    let install = install_container(pod);
    for (env, host) in [
        ("HOST_CNI_BIN_DIR", "/opt/cni/bin"),
        ("HOST_CNI_NET_DIR", "/etc/cni/net.d"),
        ("HOST_CNI_DATA_DIR", "/var/lib/cni/networks"),
    ] {
        let (path, kind) = host_path_at(pod, install, env_value(install, env));
        assert_eq!(path, host, "{env}");
        assert_eq!(kind, "DirectoryOrCreate", "{host}");
    }
}

/// Runs the init container's script with the node's directories replaced by temp dirs.
#[test]
fn install_script_replaces_files_by_temp_file_and_rename() {
    let docs = manifest();
    let install = install_container(pod_spec(&docs));
    assert_eq!(install["command"], serde_json::json!(["/bin/sh", "-c"]));
    let script = install["args"][0].as_str().expect("the script is args[0]");

    let root = tempfile::tempdir().expect("tempdir");
    let dir = |name: &str| {
        let d = root.path().join(name);
        fs::create_dir_all(&d).expect("mkdir");
        d
    };
    let (image_bin, host_bin, host_net, data, conf) = (
        dir("image-bin"),
        dir("host-bin"),
        dir("host-net"),
        dir("data"),
        dir("config"),
    );
    for plugin in ["sticky-ipam", "sticky-vxlan"] {
        fs::write(image_bin.join(plugin), format!("new {plugin}\n")).expect("write");
        // An old binary on the node, with a second name: an in-place rewrite would change
        // what that second name reads, a rename leaves it alone.
        fs::write(host_bin.join(plugin), "old\n").expect("write");
        fs::hard_link(
            host_bin.join(plugin),
            root.path().join(format!("{plugin}.old")),
        )
        .expect("link");
    }
    fs::copy(repo_file(CONFLIST), conf.join(CONFLIST_NAME)).expect("copy conflist");

    let out = Command::new("sh")
        .args(["-c", script])
        .env("IMAGE_BIN_DIR", &image_bin)
        .env("HOST_CNI_BIN_DIR", &host_bin)
        .env("HOST_CNI_NET_DIR", &host_net)
        .env("HOST_CNI_DATA_DIR", &data)
        .env("CONFLIST_DIR", &conf)
        .env("CONFLIST_NAME", CONFLIST_NAME)
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "install script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    for plugin in ["sticky-ipam", "sticky-vxlan"] {
        let installed = host_bin.join(plugin);
        assert_eq!(
            fs::read_to_string(&installed).unwrap(),
            format!("new {plugin}\n")
        );
        let mode = fs::metadata(&installed).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "{plugin} mode");
        let old = root.path().join(format!("{plugin}.old"));
        assert_eq!(
            fs::read_to_string(old).unwrap(),
            "old\n",
            "{plugin} was rewritten in place instead of renamed over"
        );
    }
    let conflist = host_net.join(CONFLIST_NAME);
    assert_eq!(
        fs::read_to_string(&conflist).unwrap(),
        fs::read_to_string(repo_file(CONFLIST)).unwrap()
    );
    assert_eq!(
        fs::metadata(&conflist).unwrap().permissions().mode() & 0o777,
        0o644
    );
    for d in [&host_bin, &host_net] {
        let names: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with('.')),
            "temp files left in {}: {names:?}",
            d.display()
        );
    }

    // And the script says so: every copy goes to a temp name, then `mv` renames it.
    assert!(
        script.contains("mv -f \"$tmp\""),
        "install ends with a rename"
    );
    for line in script
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("cp "))
    {
        assert!(
            line.ends_with("\"$tmp\""),
            "copy straight to a final name: {line}"
        );
    }
}

#[test]
fn install_script_fails_without_leaving_temp_files_when_a_plugin_is_missing() {
    let docs = manifest();
    let script = install_container(pod_spec(&docs))["args"][0]
        .as_str()
        .expect("script")
        .to_owned();
    let root = tempfile::tempdir().expect("tempdir");
    let host_bin = root.path().join("host-bin");
    let host_net = root.path().join("host-net");
    fs::create_dir_all(&host_bin).unwrap();
    fs::create_dir_all(&host_net).unwrap();
    let out = Command::new("sh")
        .args(["-c", &script])
        .env("IMAGE_BIN_DIR", root.path().join("empty-image"))
        .env("HOST_CNI_BIN_DIR", &host_bin)
        .env("HOST_CNI_NET_DIR", &host_net)
        .env("HOST_CNI_DATA_DIR", root.path())
        .env("CONFLIST_DIR", root.path())
        .env("CONFLIST_NAME", CONFLIST_NAME)
        .output()
        .expect("run sh");
    assert!(
        !out.status.success(),
        "a missing plugin must fail the init container"
    );
    assert_eq!(
        fs::read_dir(&host_bin).unwrap().count(),
        0,
        "nothing left in bin"
    );
    assert_eq!(
        fs::read_dir(&host_net).unwrap().count(),
        0,
        "no conflist without its plugins"
    );
}
