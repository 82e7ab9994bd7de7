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
const CONFLIST: &str = "conf-examples/11-sticky-vxlan-cluster.conflist";
const CONFLIST_NAME: &str = "11-sticky-vxlan-cluster.conflist";
/// The plugins the init container copies to the node.
const PLUGINS: [&str; 2] = ["sticky-ipam", "sticky-vxlan"];
/// The node agent: in the image, run by the DaemonSet's main container, never copied.
const AGENT: &str = "sticky-vxlan-agent";
/// The sites gateway's WireGuard data path: in the image, run by the DaemonSet's second
/// container, never copied.
const WG: &str = "sticky-wg";
/// Every binary the image carries.
const BINARIES: [&str; 4] = ["sticky-ipam", "sticky-vxlan", AGENT, WG];

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

fn wg_container(pod: &Value) -> &Value {
    pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == WG))
        .expect("a container named sticky-wg")
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

/// The volume mount of `container` that `path` is under: the one with the longest mount path
/// that is `path` or one of its ancestors (the runtime mounts deeper paths over shallower ones).
fn mount_of<'a>(container: &'a Value, path: &Path) -> &'a Value {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["mountPath"].as_str().is_some_and(|p| path.starts_with(p)))
        .max_by_key(|m| {
            m["mountPath"]
                .as_str()
                .map_or(0, |p| Path::new(p).components().count())
        })
        .unwrap_or_else(|| panic!("nothing mounted where {} is", path.display()))
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
    assert_eq!(
        command[0],
        format!("/sticky-cni/bin/{AGENT}"),
        "the agent's own binary, not the deprecated `sticky-vxlan agent`"
    );
    assert!(!command.contains(&"agent"), "{command:?}");
    let config = command
        .iter()
        .position(|a| *a == "--config")
        .and_then(|i| command.get(i + 1))
        .expect("--config");
    assert_eq!(*config, format!("/etc/cni/net.d/{CONFLIST_NAME}"));
    // RBAC: get/list/watch on nodes, nothing more on nodes ever; patch on nodes/status (where
    // the agent publishes flannel's annotations, as flannel does) exactly when it publishes.
    let rules = doc(&docs, "ClusterRole")["rules"]
        .as_array()
        .expect("rules")
        .clone();
    let read_nodes = serde_json::json!({
        "apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]
    });
    let patch_status = serde_json::json!({
        "apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]
    });
    let publishes = command.contains(&"--publish-flannel-annotations");
    if publishes {
        assert_eq!(rules, [read_nodes, patch_status.clone()]);
    } else {
        assert_eq!(rules, [read_nodes]);
    }
    // The rule the manifest tells an operator to uncomment for publishing is that one.
    assert_eq!(commented_rules(), [patch_status]);
    // Host network namespace, NET_ADMIN and nothing else.
    assert_eq!(
        agent["securityContext"]["capabilities"]["add"],
        serde_json::json!(["NET_ADMIN"])
    );
    assert_eq!(
        agent["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    assert_ne!(agent["securityContext"]["privileged"], true);
    agent_mounts_only_what_it_writes_read_write(pod, agent, Path::new(config));
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

/// The rules of the ClusterRole's commented-out block (`  # - apiGroups: ...`), uncommented.
fn commented_rules() -> Vec<Value> {
    use serde::Deserialize;
    let text = fs::read_to_string(repo_file(MANIFEST)).unwrap();
    let role = text
        .split("\n---\n")
        .find(|d| d.contains("\nkind: ClusterRole\n"))
        .expect("the ClusterRole document");
    let yaml: String = role
        .lines()
        .filter_map(|l| l.strip_prefix("  # "))
        .filter(|l| l.starts_with("- ") || l.starts_with("  "))
        .map(|l| format!("{l}\n"))
        .collect();
    Vec::<Value>::deserialize(serde_yaml_ng::Deserializer::from_str(&yaml))
        .unwrap_or_else(|e| panic!("the commented rule is not YAML: {e}\n{yaml}"))
}

/// Sites: where the agent keeps a gateway's WireGuard private key (its `--key-dir` default is
/// `wireguard/` under it) and where sticky-wg's configuration socket is.
const KEY_ROOT: &str = "/var/lib/sticky-cni";
const WG_SOCKET_DIR: &str = "/var/run/wireguard";

/// The agent's mounts, from what the DaemonSet's conflist (`config`, at the path the agent is
/// given) names: read-write exactly where it writes (the peers file's directory, for its temp
/// file and rename, the stateDir, and for sites the key directory and sticky-wg's socket
/// directory), read-only where the conflists are, each a hostPath of the same path.
fn agent_mounts_only_what_it_writes_read_write(pod: &Value, agent: &Value, config: &Path) {
    let conf: Value =
        serde_json::from_str(&fs::read_to_string(repo_file(CONFLIST)).unwrap()).unwrap();
    let cfg = sticky_overlay::config::Config::from_json("n", &conf["plugins"][0])
        .expect("the DaemonSet's conflist");
    let peers_dir = cfg
        .peers_file
        .as_deref()
        .and_then(Path::parent)
        .expect("the conflist names a peers file");
    let mounts = agent["volumeMounts"].as_array().expect("volumeMounts");
    let read_write: Vec<&str> = mounts
        .iter()
        .filter(|m| m["readOnly"] != true)
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    let writes = [
        peers_dir,
        cfg.state_dir.as_path(),
        Path::new(KEY_ROOT),
        Path::new(WG_SOCKET_DIR),
    ];
    assert_eq!(
        read_write,
        writes.map(|p| p.to_str().unwrap()),
        "read-write: the peers file's directory, the stateDir, the key and socket dirs, \
         nothing else"
    );
    for dir in writes {
        let dir = dir.to_str().unwrap();
        assert_eq!(host_path_at(pod, agent, dir).0, dir);
    }
    // The peers file itself is under a read-write mount, the conflist under a read-only one.
    let peers_file = cfg.peers_file.as_deref().unwrap();
    assert_ne!(mount_of(agent, peers_file)["readOnly"], true);
    let conf_mount = mount_of(agent, config);
    assert_eq!(
        conf_mount["readOnly"],
        true,
        "{} must be read-only for the agent",
        config.display()
    );
    let conf_dir = conf_mount["mountPath"].as_str().unwrap();
    assert_eq!(host_path_at(pod, agent, conf_dir).0, conf_dir);
    // And the init container installs the conflist into the same host directory.
    let install = install_container(pod);
    let (host_net, _) = host_path_at(pod, install, env_value(install, "HOST_CNI_NET_DIR"));
    assert_eq!(Path::new(host_net), config.parent().unwrap());
}

/// The sites data path: `sticky-wg stickywg0` from the same image, NET_ADMIN only, the host's
/// /dev/net/tun and the socket directory the agent mounts too, nothing else.
#[test]
fn manifest_runs_sticky_wg_with_net_admin_the_tun_and_the_agents_socket_dir() {
    let docs = manifest();
    let pod = pod_spec(&docs);
    let wg = wg_container(pod);
    assert_eq!(
        wg["command"],
        serde_json::json!([format!("/sticky-cni/bin/{WG}"), "stickywg0"])
    );
    assert_eq!(
        wg["image"],
        install_container(pod)["image"],
        "the same image"
    );
    let caps = &wg["securityContext"]["capabilities"];
    assert_eq!(caps["add"], serde_json::json!(["NET_ADMIN"]));
    assert_eq!(caps["drop"], serde_json::json!(["ALL"]));
    assert_ne!(wg["securityContext"]["privileged"], true);
    assert_eq!(wg["securityContext"]["allowPrivilegeEscalation"], false);
    let mounts: Vec<&str> = wg["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    assert_eq!(mounts, ["/dev/net/tun", WG_SOCKET_DIR]);
    assert_eq!(
        host_path_at(pod, wg, "/dev/net/tun"),
        ("/dev/net/tun", "CharDevice")
    );
    assert_eq!(
        host_path_at(pod, wg, WG_SOCKET_DIR),
        (WG_SOCKET_DIR, "DirectoryOrCreate")
    );
    let agent = agent_container(pod);
    assert_eq!(
        mount_of(agent, Path::new(WG_SOCKET_DIR))["name"],
        mount_of(wg, Path::new(WG_SOCKET_DIR))["name"],
        "the agent reaches sticky-wg's socket through the same volume"
    );
    assert_eq!(
        host_path_at(pod, agent, KEY_ROOT),
        (KEY_ROOT, "DirectoryOrCreate")
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

    // A release pins the digest of the image scripts/build-image.sh built (docs/install.md).
    let digest = own.split_once('@').map(|(_, d)| d);
    assert!(
        digest.is_some_and(|d| d.starts_with("sha256:")),
        "install-cni image {own} must be pinned by digest"
    );
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
    // containerd 1.6/1.7 load 1.0.0; runtimes on libcni ≥ 1.2 negotiate 1.1.0 (STATUS, GC).
    assert_eq!(conf["cniVersion"], "1.0.0");
    assert_eq!(conf["cniVersions"], serde_json::json!(["1.0.0", "1.1.0"]));
    let types: Vec<&str> = conf["plugins"]
        .as_array()
        .map(|p| p.iter().filter_map(|p| p["type"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(types, ["sticky-vxlan", "portmap"]);
    assert_eq!(conf["plugins"][0]["ipam"]["type"], "sticky-ipam");
    // One conflist for every node: no range here, each node's come from the peers file.
    assert!(
        sticky_overlay::config::Config::from_json("n", &conf["plugins"][0])
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

/// No dot-named (temp) file left in any of `dirs`.
fn assert_no_temp_files(dirs: &[&Path]) {
    for d in dirs {
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
    // The agent is in the image too, and must stay there.
    fs::write(image_bin.join(AGENT), "the agent\n").expect("write");
    for plugin in PLUGINS {
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

    assert!(
        !host_bin.join(AGENT).exists(),
        "the agent is not a plugin: it is not copied to the node"
    );
    for plugin in PLUGINS {
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
    assert_no_temp_files(&[&host_bin, &host_net]);

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

// ---- The image: scripts/build-image.sh, loaded and run by podman ----------------------------

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The binaries this test run built (target/debug): the image tests package them.
fn built_bin_dir() -> PathBuf {
    let dir = Path::new(sticky_testkit::support::bins::built("sticky-vxlan"))
        .parent()
        .expect("the binaries' directory");
    assert_eq!(
        Path::new(sticky_testkit::support::bins::built("sticky-vxlan-agent")).parent(),
        Some(dir),
        "the agent is built beside the plugins"
    );
    dir.to_path_buf()
}

/// Runs `scripts/build-image.sh --bin-dir BIN_DIR --out OUT EXTRA...`; the digest it printed,
/// checked against the `OUT.digest` file it wrote.
fn build_image(bin_dir: &Path, out: &Path, extra: &[&Path]) -> String {
    let o = Command::new(repo_file("scripts/build-image.sh"))
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out)
        .args(extra)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .expect("run scripts/build-image.sh");
    assert!(
        o.status.success(),
        "build-image.sh failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let digest = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let file = fs::read_to_string(format!("{}.digest", out.display())).expect("OUT.digest");
    assert_eq!(file.trim(), digest, "printed digest and digest file differ");
    digest
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `tar -xf ARCHIVE -C DIR`.
fn untar(archive: &Path, dir: &Path) {
    fs::create_dir_all(dir).expect("mkdir");
    let ok = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(dir)
        .status()
        .expect("run tar");
    assert!(ok.success(), "tar -xf {}", archive.display());
}

/// The paths `ldd` resolves for `binary`, the loader included.
fn ldd_paths(binary: &Path) -> Vec<String> {
    let o = Command::new("ldd").arg(binary).output().expect("run ldd");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                [_, "=>", path, ..] if path.starts_with('/') => Some(path.to_string()),
                [path, ..] if path.starts_with('/') => Some(path.to_string()),
                _ => None,
            }
        })
        .collect()
}

/// Asserts that the static busybox build-image.sh puts in the image is installed.
fn assert_busybox_static() {
    let dynamic = Command::new("ldd")
        .arg("/bin/busybox")
        .output()
        .map_or(true, |o| o.status.success());
    assert!(
        Path::new("/bin/busybox").exists() && !dynamic,
        "no static /bin/busybox: apt-get install busybox-static (.ci/run installs it)"
    );
}

#[test]
fn image_build_is_reproducible_and_carries_exactly_what_the_binaries_need() {
    assert_busybox_static();
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    // The same binaries, copied at different times, with different modes and mtimes.
    for (dir, mode, mtime) in [(&a, 0o755, 1_000_000_000), (&b, 0o775, 1_600_000_000)] {
        fs::create_dir_all(dir).expect("mkdir");
        for plugin in BINARIES {
            let dest = dir.join(plugin);
            fs::copy(built_bin_dir().join(plugin), &dest).expect("copy binary");
            fs::set_permissions(&dest, fs::Permissions::from_mode(mode)).expect("chmod");
            let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
            fs::File::options()
                .write(true)
                .open(&dest)
                .and_then(|f| f.set_modified(when))
                .expect("set mtime");
        }
    }
    let (archive_a, archive_b) = (root.path().join("a.tar"), root.path().join("b.tar"));
    let digest = build_image(&a, &archive_a, &[]);
    assert_eq!(
        build_image(&b, &archive_b, &[]),
        digest,
        "same binaries, other digest"
    );
    assert!(
        fs::read(&archive_a).unwrap() == fs::read(&archive_b).unwrap(),
        "same digest but the archives differ"
    );

    // The digest is the manifest's, and every blob is stored under its own hash.
    let layout = root.path().join("layout");
    untar(&archive_a, &layout);
    let index: Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"][0]["digest"], digest.as_str());
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("sticky-cni:{VERSION}")
    );
    let blob = |digest: &str| {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        let data = fs::read(layout.join("blobs/sha256").join(hex)).expect("blob");
        assert_eq!(sha256_hex(&data), hex, "blob {digest} has another hash");
        data
    };
    let manifest: Value = serde_json::from_slice(&blob(&digest)).unwrap();
    let config: Value =
        serde_json::from_slice(&blob(manifest["config"]["digest"].as_str().unwrap())).unwrap();
    assert!(
        config.get("created").is_none() && config.get("history").is_none(),
        "no build time in the config: {config}"
    );
    let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
    assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
    blob(layer_digest);

    // The layer: root-owned, one mtime, sorted; the binaries, every library ldd names for
    // them and the loader, busybox for the install script, its licence note.
    let rootfs = root.path().join("rootfs");
    let layer_path = layout
        .join("blobs/sha256")
        .join(layer_digest.trim_start_matches("sha256:"));
    let listing = Command::new("tar")
        .env("TZ", "UTC")
        .args(["--numeric-owner", "--full-time", "-tvf"])
        .arg(&layer_path)
        .output()
        .expect("tar -tvf");
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let names: Vec<&str> = listing
        .lines()
        .map(|l| l.split_whitespace().nth(5).unwrap_or(""))
        .collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "tar entries not sorted");
    for line in listing.lines() {
        assert!(
            line.contains(" 0/0 ") && line.contains("2023-11-14 22:13:20"),
            "entry not root-owned at SOURCE_DATE_EPOCH: {line}"
        );
    }
    untar(&layer_path, &rootfs);
    let mut wanted = vec![
        "sticky-cni/bin/sticky-ipam".to_owned(),
        "sticky-cni/bin/sticky-vxlan".to_owned(),
        format!("sticky-cni/bin/{AGENT}"),
        format!("sticky-cni/bin/{WG}"),
        "bin/busybox".to_owned(),
        "bin/sh".to_owned(),
        format!("sticky-cni/conf-examples/{CONFLIST_NAME}"),
    ];
    for plugin in BINARIES {
        assert_eq!(
            fs::read(rootfs.join("sticky-cni/bin").join(plugin)).unwrap(),
            fs::read(a.join(plugin)).unwrap(),
            "{plugin} in the image is not the binary given"
        );
        let libs = ldd_paths(&a.join(plugin));
        assert!(
            libs.iter().any(|l| l.contains("ld-linux")),
            "ldd names no loader: {libs:?}"
        );
        wanted.extend(libs.iter().map(|l| l.trim_start_matches('/').to_owned()));
    }
    for path in &wanted {
        assert!(rootfs.join(path).exists(), "{path} missing from the image");
    }
    if Path::new("/usr/share/doc/busybox-static/copyright").exists() {
        assert!(
            rootfs
                .join("usr/share/doc/busybox-static/copyright")
                .exists()
        );
    }

    // Another binary, another image.
    fs::OpenOptions::new()
        .append(true)
        .open(b.join("sticky-ipam"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"\0"))
        .expect("append");
    assert_ne!(
        build_image(&b, &archive_b, &[]),
        digest,
        "the digest ignores the binaries"
    );
}

#[test]
fn update_manifest_pins_both_containers_to_the_built_digest_and_changes_nothing_else() {
    assert_busybox_static();
    let root = tempfile::tempdir().expect("tempdir");
    let copy = root.path().join("daemonset.yaml");
    fs::copy(repo_file(MANIFEST), &copy).expect("copy manifest");
    let digest = build_image(
        &built_bin_dir(),
        &root.path().join("img.tar"),
        &[Path::new("--update-manifest"), &copy],
    );
    let want = format!("registry.example.org/sticky-cni:{VERSION}@{digest}");
    let (before, after) = (
        fs::read_to_string(repo_file(MANIFEST)).unwrap(),
        fs::read_to_string(&copy).unwrap(),
    );
    assert_eq!(before.lines().count(), after.lines().count());
    for (old, new) in before.lines().zip(after.lines()) {
        if old != new {
            assert_eq!(new.trim(), format!("image: {want}"), "changed: {old}");
        }
    }
    let text = fs::read_to_string(&copy).unwrap();
    let docs: Vec<Value> = {
        use serde::Deserialize;
        serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| Value::deserialize(d).expect("YAML"))
            .collect()
    };
    for c in containers(pod_spec(&docs)) {
        assert_eq!(c["image"], want.as_str(), "container {}", c["name"]);
    }
}

/// podman with all its state in a temp dir (vfs storage, no daemon, no network), under a
/// cgroup parent of its own; `Drop` removes the containers, images and cgroups it made.
struct Podman {
    dir: tempfile::TempDir,
    cgroup_parent: String,
    /// Of [`PODMAN_SYSTEM_DIRS`], those this test created: removed afterwards.
    created: Vec<PathBuf>,
}

/// Made by podman whatever `--root` says: the blob cache (containers/image) and netavark's run
/// dir (even with `--network none`).
const PODMAN_SYSTEM_DIRS: [&str; 2] = ["/var/lib/containers", "/run/containers"];

impl Podman {
    /// Panics when we are not root (the tests that use podman are ignored without root) or
    /// podman or runc is missing, saying what to install (`.ci/run` installs both).
    fn new() -> Podman {
        assert!(
            nix::unistd::geteuid().is_root(),
            "podman tests need root: run the suite as root (scripts/test.sh), or leave out \
             --run-ignored / --include-ignored to have them reported as skipped"
        );
        for tool in ["podman", "runc"] {
            assert!(
                Command::new(tool).arg("--version").output().is_ok(),
                "{tool} is not installed: apt-get install {tool} (.ci/run installs it)"
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("tmp")).expect("mkdir");
        Podman {
            dir,
            cgroup_parent: format!("/sticky-image-test-{}", std::process::id()),
            created: PODMAN_SYSTEM_DIRS
                .iter()
                .map(PathBuf::from)
                .filter(|d| !d.exists())
                .collect(),
        }
    }

    fn cmd(&self) -> Command {
        let d = self.dir.path();
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .arg("--network-config-dir")
            .arg(d.join("networks"))
            .env("TMPDIR", d.join("tmp"))
            // runc, not crun: crun refuses hybrid cgroup v1/v2 hosts; cgroupfs: no systemd.
            .args(["--storage-driver", "vfs", "--runtime", "runc"])
            .args(["--cgroup-manager", "cgroupfs", "--events-backend", "file"]);
        c
    }

    /// `podman run` with the pod's restrictions: no network, read-only root, root user
    /// without capabilities but `caps`; limits lowered (raising them may be refused).
    fn run(&self, caps: &[&str], extra: &[String]) -> std::process::Output {
        let mut c = self.cmd();
        c.args([
            "run",
            "--rm",
            "--network",
            "none",
            "--read-only",
            "--user",
            "0:0",
        ])
        .args(["--cap-drop", "ALL", "--security-opt", "no-new-privileges"])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ])
        .args(["--cgroup-parent", &self.cgroup_parent]);
        for cap in caps {
            c.args(["--cap-add", cap]);
        }
        c.args(extra).output().expect("run podman")
    }
}

/// Removes the empty cgroup directories under `dir`, deepest first.
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

impl Drop for Podman {
    fn drop(&mut self) {
        for args in [&["rm", "-af"][..], &["rmi", "-af"]] {
            let _ = self.cmd().args(args).output();
        }
        for dir in &self.created {
            let _ = fs::remove_dir_all(dir);
        }
        let name = self.cgroup_parent.trim_start_matches('/');
        let base = Path::new("/sys/fs/cgroup");
        remove_cgroup_tree(&base.join(name));
        if let Ok(controllers) = fs::read_dir(base) {
            for c in controllers.flatten() {
                remove_cgroup_tree(&c.path().join(name));
            }
        }
    }
}

fn output_text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Loads the built image into podman, runs the DaemonSet's install step from it against temp
/// dirs mounted where the manifest mounts the node's, then the agent's `--help` (directly and
/// through the deprecated `sticky-vxlan agent`) and the image's default command (`--version`).
#[test]
#[ignore = "needs root: podman containers"]
fn image_in_podman_installs_the_plugins_by_rename_and_runs_the_agent() {
    assert_busybox_static();
    let podman = Podman::new();
    let root = tempfile::tempdir().expect("tempdir");
    let archive = root.path().join("sticky-cni.oci.tar");
    let digest = build_image(&built_bin_dir(), &archive, &[]);
    let load = podman
        .cmd()
        .arg("load")
        .arg("-i")
        .arg(&archive)
        .output()
        .expect("podman load");
    assert!(load.status.success(), "podman load: {}", output_text(&load));
    let image = format!("localhost/sticky-cni:{VERSION}");
    let inspect = podman
        .cmd()
        .args(["image", "inspect", "--format", "{{.Digest}}", &image])
        .output()
        .expect("podman image inspect");
    assert_eq!(
        String::from_utf8_lossy(&inspect.stdout).trim(),
        digest,
        "podman sees another digest: {}",
        output_text(&inspect)
    );

    // The install step, as the manifest runs it: its command, env and mounts.
    let docs = manifest();
    let pod = pod_spec(&docs);
    let install = install_container(pod);
    let host = |volume: &str| root.path().join("host").join(volume);
    let mut args = Vec::new();
    for m in install["volumeMounts"].as_array().expect("volumeMounts") {
        let name = m["name"].as_str().expect("mount name");
        fs::create_dir_all(host(name)).expect("mkdir");
        let ro = if m["readOnly"] == true { ":ro" } else { "" };
        args.push("-v".to_owned());
        args.push(format!(
            "{}:{}{ro}",
            host(name).display(),
            m["mountPath"].as_str().expect("mountPath")
        ));
    }
    for e in install["env"].as_array().expect("env") {
        args.push("-e".to_owned());
        args.push(format!(
            "{}={}",
            e["name"].as_str().unwrap(),
            e["value"].as_str().unwrap()
        ));
    }
    args.push(format!("--entrypoint={}", install["command"]));
    args.push(image.clone());
    args.extend(
        install["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("arg").to_owned()),
    );
    // The temp dir standing in for the node's dir mounted at `env`'s path.
    let volume_at = |env: &str| {
        let mount = env_value(install, env);
        install["volumeMounts"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["mountPath"] == mount))
            .and_then(|m| m["name"].as_str())
            .map(host)
            .unwrap_or_else(|| panic!("nothing mounted at {env}"))
    };
    let bin_volume = volume_at("HOST_CNI_BIN_DIR");
    let conflist_src = volume_at("CONFLIST_DIR").join(CONFLIST_NAME);
    fs::copy(repo_file(CONFLIST), &conflist_src).expect("conflist");
    for plugin in PLUGINS {
        // An old binary with a second name: only a rename leaves the second name alone.
        fs::write(bin_volume.join(plugin), "old\n").expect("write");
        fs::hard_link(
            bin_volume.join(plugin),
            root.path().join(format!("{plugin}.old")),
        )
        .expect("link");
    }
    let out = podman.run(&[], &args);
    assert!(out.status.success(), "install step: {}", output_text(&out));

    assert!(
        !bin_volume.join(AGENT).exists(),
        "the install step copied the agent to the node"
    );
    for plugin in PLUGINS {
        let installed = bin_volume.join(plugin);
        assert!(
            fs::read(&installed).unwrap() == fs::read(built_bin_dir().join(plugin)).unwrap(),
            "{plugin} on the host is not the image's binary"
        );
        assert_eq!(
            fs::read_to_string(root.path().join(format!("{plugin}.old"))).unwrap(),
            "old\n",
            "{plugin} was rewritten in place instead of renamed over"
        );
        assert_eq!(
            fs::metadata(&installed).unwrap().permissions().mode() & 0o777,
            0o755
        );
        // It runs on the host, as a runtime calls it.
        let mut child = Command::new(&installed)
            .env("CNI_COMMAND", "VERSION")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run the installed plugin");
        // VERSION may answer without reading stdin: a closed pipe is not an error here.
        let _ = std::io::Write::write_all(
            &mut child.stdin.take().unwrap(),
            br#"{"cniVersion":"1.0.0"}"#,
        );
        let reply = child.wait_with_output().unwrap();
        let reply: Value = serde_json::from_slice(&reply.stdout).expect("VERSION reply JSON");
        assert!(
            reply["supportedVersions"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v == "1.0.0")),
            "{plugin} VERSION: {reply}"
        );
    }
    let net_volume = volume_at("HOST_CNI_NET_DIR");
    assert_eq!(
        fs::read_to_string(net_volume.join(CONFLIST_NAME)).unwrap(),
        fs::read_to_string(repo_file(CONFLIST)).unwrap()
    );
    assert_no_temp_files(&[&bin_volume, &net_volume]);

    // The agent container's binary, with its capabilities.
    let agent = agent_container(pod);
    let agent_bin = agent["command"][0].as_str().expect("agent command");
    assert_eq!(agent_bin, format!("/sticky-cni/bin/{AGENT}"));
    let help = podman.run(
        &["NET_ADMIN"],
        &[
            format!("--entrypoint={agent_bin}"),
            image.clone(),
            "--help".into(),
        ],
    );
    assert!(
        help.status.success(),
        "{AGENT} --help: {}",
        output_text(&help)
    );
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("--metrics-addr"),
        "{AGENT} --help: {}",
        output_text(&help)
    );
    // The sites data path's container runs from the image too (its libraries are there).
    let wg = wg_container(pod);
    let wg_bin = wg["command"][0].as_str().expect("sticky-wg command");
    let wg_help = podman.run(
        &["NET_ADMIN"],
        &[
            format!("--entrypoint={wg_bin}"),
            image.clone(),
            "--help".into(),
        ],
    );
    assert!(
        wg_help.status.success()
            && String::from_utf8_lossy(&wg_help.stdout).contains("--socket-dir"),
        "{WG} --help: {}",
        output_text(&wg_help)
    );
    // The deprecated `sticky-vxlan agent` still runs it, from beside itself, and says so.
    let alias = podman.run(
        &["NET_ADMIN"],
        &[
            "--entrypoint=/sticky-cni/bin/sticky-vxlan".into(),
            image.clone(),
            "agent".into(),
            "--help".into(),
        ],
    );
    assert!(
        alias.status.success()
            && String::from_utf8_lossy(&alias.stdout).contains("--metrics-addr")
            && String::from_utf8_lossy(&alias.stderr).contains("deprecated"),
        "sticky-vxlan agent --help: {}",
        output_text(&alias)
    );
    // The image's default command.
    let version = podman.run(&[], &[image]);
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("sticky-vxlan {VERSION}"),
        "{}",
        output_text(&version)
    );
}
