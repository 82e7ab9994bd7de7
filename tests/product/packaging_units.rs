//! Checks of the systemd units the packages ship (`packaging/*.service`) and of the packages'
//! maintainer scripts.
//!
//! Units: the command each runs, from the names in `/etc/default/sticky-cni`. The `ExecStart=`
//! line is undone as systemd does it (`$$` is a literal `$`) and its shell script run with
//! `sh`, the binary replaced by a stub that prints its arguments. The agent's sandbox is
//! checked against what it writes, from the shipped conflists. `scripts/test-packages.sh`
//! checks the installed units with `systemd-analyze verify` and `security`.
//!
//! Maintainer scripts (`packaging/debian/*`, `packaging/rpm/*.sh`): run with `sh` as dpkg and
//! rpm run them, with a `systemctl` stub that records its arguments and the systemd check
//! (`[ -d /run/systemd/system ]`) pointed at a temp dir that exists or not.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const RECONCILE_UNIT: &str = "packaging/sticky-vxlan-reconcile.service";
const AGENT_UNIT: &str = "packaging/sticky-vxlan-agent.service";

/// The binary `unit` runs.
fn binary(unit: &str) -> &'static str {
    match unit {
        RECONCILE_UNIT => "/opt/cni/bin/sticky-vxlan",
        AGENT_UNIT => "/usr/sbin/sticky-vxlan-agent",
        _ => panic!("unknown unit {unit}"),
    }
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The shell script of the unit's `ExecStart=/bin/sh -c '<script>'`, with systemd's `$$`
/// turned into `$`. No `'` inside: systemd and sh then agree on where it ends.
fn exec_script(unit: &str) -> String {
    let text = fs::read_to_string(repo_file(unit)).expect("unit");
    let lines: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .collect();
    assert_eq!(lines.len(), 1, "{unit}: one ExecStart");
    let script = lines[0]
        .strip_prefix("/bin/sh -c '")
        .and_then(|s| s.strip_suffix('\''))
        .unwrap_or_else(|| panic!("{unit}: ExecStart=/bin/sh -c '...': {}", lines[0]));
    assert!(!script.contains('\''), "{unit}: a quote inside the script");
    assert!(
        !script.replace("$$", "").contains('$'),
        "{unit}: a lone $ would be expanded by systemd, not by sh: {script}"
    );
    script.replace("$$", "$")
}

/// The arguments the unit would run the binary with, given the environment file's values.
fn argv(unit: &str, env: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let stub = dir.path().join("the-binary");
    fs::write(&stub, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").unwrap();
    fs::set_permissions(&stub, fs::Permissions::from_mode(0o755)).unwrap();
    let script = exec_script(unit);
    assert_eq!(script.matches(binary(unit)).count(), 1, "{script}");
    let script = script.replace(binary(unit), stub.to_str().unwrap());
    // A file in the working directory that an unquoted glob would expand to.
    fs::write(dir.path().join("10-a.conflist"), "").unwrap();
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{unit}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

fn net_d(name: &str) -> String {
    format!("/etc/cni/net.d/{name}")
}

/// The settings the example `/etc/default/sticky-cni` gives, by name.
fn default_file() -> BTreeMap<String, String> {
    let text = fs::read_to_string(repo_file("packaging/sticky-cni.default")).unwrap();
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

#[test]
fn the_boot_unit_reconciles_the_main_network_and_every_segment_in_one_run() {
    let unit = RECONCILE_UNIT;
    assert_eq!(
        argv(unit, &[("STICKY_CNI_CONFLIST", "10-sticky-vxlan.conflist")]),
        ["reconcile", "--config", &net_d("10-sticky-vxlan.conflist")]
    );
    assert_eq!(
        argv(
            unit,
            &[
                ("STICKY_CNI_CONFLIST", "10-sticky-vxlan.conflist"),
                (
                    "STICKY_CNI_SEGMENT_CONFLISTS",
                    " 40-seg.conflist  41-*.conflist "
                ),
            ]
        ),
        [
            "reconcile",
            "--config",
            &net_d("10-sticky-vxlan.conflist"),
            "--config",
            &net_d("40-seg.conflist"),
            "--config",
            &net_d("41-*.conflist"),
        ],
        "each name once, no glob expanded"
    );
}

#[test]
fn the_agent_unit_passes_every_segment_and_the_agent_options() {
    let unit = AGENT_UNIT;
    assert_eq!(
        argv(
            unit,
            &[
                ("STICKY_CNI_CONFLIST", "10-sticky-vxlan.conflist"),
                ("STICKY_VXLAN_AGENT_ARGS", "--no-api --resync 30"),
            ]
        ),
        [
            "--config",
            &net_d("10-sticky-vxlan.conflist"),
            "--no-api",
            "--resync",
            "30",
        ]
    );
    assert_eq!(
        argv(
            unit,
            &[
                ("STICKY_CNI_CONFLIST", "10-sticky-vxlan.conflist"),
                (
                    "STICKY_CNI_SEGMENT_CONFLISTS",
                    "40-seg.conflist 41-seg.conflist"
                ),
                ("STICKY_VXLAN_AGENT_ARGS", "--no-api"),
            ]
        ),
        [
            "--config",
            &net_d("10-sticky-vxlan.conflist"),
            "--segment-config",
            &net_d("40-seg.conflist"),
            "--segment-config",
            &net_d("41-seg.conflist"),
            "--no-api",
        ]
    );
}

#[test]
fn the_example_default_file_names_the_main_conflist_and_documents_the_segments() {
    let settings = default_file();
    assert_eq!(
        settings.get("STICKY_CNI_CONFLIST").map(String::as_str),
        Some("10-sticky-vxlan.conflist")
    );
    let text = fs::read_to_string(repo_file("packaging/sticky-cni.default")).unwrap();
    assert!(
        text.contains("STICKY_CNI_SEGMENT_CONFLISTS="),
        "the segments' setting is shown: {text}"
    );
}

// ---- The units' sandbox ------------------------------------------------------------------------

/// The `Key=value` settings of the unit's `[Service]` section, in order (a key may repeat).
fn service_settings(unit: &str) -> Vec<(String, String)> {
    let text = fs::read_to_string(repo_file(unit)).expect("unit");
    let mut section = "";
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[Service]"
            && !line.starts_with('#')
            && let Some((k, v)) = line.split_once('=')
        {
            out.push((k.to_string(), v.to_string()));
        }
    }
    out
}

/// Every value given to `key`, split at whitespace, in order.
fn words(settings: &[(String, String)], key: &str) -> Vec<String> {
    settings
        .iter()
        .filter(|(k, _)| k == key)
        .flat_map(|(_, v)| v.split_whitespace().map(String::from))
        .collect()
}

/// The one value of `key`.
fn one(settings: &[(String, String)], key: &str) -> String {
    let all: Vec<&String> = settings
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(all.len(), 1, "{key}= once: {all:?}");
    all[0].clone()
}

/// The paths of a `*Paths=` setting, without the `-` (ignore if missing) prefix.
fn paths(settings: &[(String, String)], key: &str) -> Vec<PathBuf> {
    words(settings, key)
        .iter()
        .map(|w| PathBuf::from(w.trim_start_matches('-')))
        .collect()
}

/// Where the service may write: `ReadWritePaths=`, and `/run/<RuntimeDirectory=>`.
fn writable(settings: &[(String, String)]) -> Vec<PathBuf> {
    let mut out = paths(settings, "ReadWritePaths");
    out.extend(
        words(settings, "RuntimeDirectory")
            .iter()
            .map(|d| Path::new("/run").join(d)),
    );
    out
}

/// What the shipped sticky-vxlan conflists name, main mode and segment alike:
/// (file, peers file, stateDir).
fn shipped_conflists() -> Vec<(PathBuf, PathBuf, PathBuf)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(repo_file("conf-examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "conflist") {
            continue;
        }
        let conf: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        for plugin in conf["plugins"].as_array().into_iter().flatten() {
            if plugin["type"] != "sticky-vxlan" {
                continue;
            }
            let peers = plugin["peersFile"].as_str().expect("a peersFile");
            let state = plugin["stateDir"]
                .as_str()
                .unwrap_or(sticky_overlay::config::DEFAULT_STATE_DIR);
            out.push((path.clone(), PathBuf::from(peers), PathBuf::from(state)));
        }
    }
    assert!(
        out.len() >= 3,
        "the main, cluster and segment examples: {out:?}"
    );
    out
}

/// What both units share: root with CAP_NET_ADMIN only, the file system read-only but the
/// stateDir and /proc/sys/net (reconcile sets net.ipv4.ip_forward, a segment device's
/// disable_ipv6), the rest of /proc/sys read-only, no new privileges nor namespaces.
fn check_sandbox(unit: &str) -> Vec<(String, String)> {
    let s = service_settings(unit);
    for key in [
        "NoNewPrivileges",
        "PrivateMounts",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
        "MemoryDenyWriteExecute",
    ] {
        assert_eq!(one(&s, key), "yes", "{unit}: {key}");
    }
    assert_eq!(one(&s, "ProtectSystem"), "strict", "{unit}");
    assert_eq!(one(&s, "SystemCallArchitectures"), "native", "{unit}");
    assert_eq!(
        words(&s, "CapabilityBoundingSet"),
        ["CAP_NET_ADMIN"],
        "{unit}"
    );
    assert!(
        words(&s, "AmbientCapabilities")
            .iter()
            .all(|c| c == "CAP_NET_ADMIN"),
        "{unit}"
    );
    // Root: the peers file must be root-owned, and so are /etc/cni and the stateDir.
    assert!(words(&s, "User").is_empty() && words(&s, "DynamicUser").is_empty());
    let w = writable(&s);
    assert!(w.contains(&PathBuf::from("/proc/sys/net")), "{unit}: {w:?}");
    for (conflist, _, state_dir) in shipped_conflists() {
        assert!(
            w.contains(&state_dir),
            "{unit} cannot write the stateDir {} of {}",
            state_dir.display(),
            conflist.display()
        );
    }
    // The state dir is kept when the unit stops: the plugin's lock and last good copy are there.
    assert_eq!(one(&s, "RuntimeDirectoryPreserve"), "yes", "{unit}");
    assert_eq!(one(&s, "RuntimeDirectoryMode"), "0700", "{unit}");
    s
}

#[test]
fn the_agent_unit_may_write_only_what_the_agent_writes() {
    let s = check_sandbox(AGENT_UNIT);
    let w = writable(&s);
    let read_only = paths(&s, "ReadOnlyPaths");
    let conflists = shipped_conflists();
    // The conflists are installed in /etc/cni/net.d: read, never written.
    let net_d = PathBuf::from("/etc/cni/net.d");
    for (conflist, peers_file, _) in &conflists {
        let peers_dir = peers_file.parent().unwrap().to_path_buf();
        assert!(
            w.contains(&peers_dir),
            "the agent replaces {} ({}) by a temp file and a rename in its directory",
            peers_file.display(),
            conflist.display()
        );
        if net_d.starts_with(&peers_dir) {
            assert!(
                read_only.contains(&net_d),
                "{} is writable through {}: {read_only:?}",
                net_d.display(),
                peers_dir.display()
            );
        }
    }
    let mut extra: Vec<&PathBuf> = w
        .iter()
        .filter(|p| {
            !conflists
                .iter()
                .any(|(_, peers, state)| Some(p.as_path()) == peers.parent() || *p == state)
        })
        .collect();
    extra.sort();
    assert_eq!(
        extra,
        [&PathBuf::from("/proc/sys/net")],
        "writable beyond the peers files' dirs and stateDirs"
    );
    let mut families = words(&s, "RestrictAddressFamilies");
    families.sort();
    assert_eq!(
        families,
        ["AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"],
        "netlink, the API and /metrics"
    );
    // The DaemonSet's memory limit for the same program.
    let manifest =
        fs::read_to_string(repo_file("packaging/kubernetes/sticky-cni-daemonset.yaml")).unwrap();
    let limit = manifest
        .split("- name: agent\n")
        .nth(1)
        .and_then(|agent| agent.split("limits:").nth(1))
        .and_then(|l| l.lines().find_map(|l| l.trim().strip_prefix("memory: ")))
        .expect("the agent container's memory limit");
    let mib = |v: &str, suffix: &str| v.strip_suffix(suffix).and_then(|n| n.parse::<u64>().ok());
    assert_eq!(
        mib(&one(&s, "MemoryMax"), "M"),
        mib(limit, "Mi"),
        "MemoryMax= (systemd's M is MiB) and the DaemonSet's limit"
    );
    assert!(one(&s, "TasksMax").parse::<u32>().is_ok_and(|n| n >= 16));
}

#[test]
fn the_boot_unit_may_write_only_the_state_dir_and_net_sysctls() {
    let s = check_sandbox(RECONCILE_UNIT);
    let mut w = writable(&s);
    w.sort();
    assert_eq!(
        w,
        [
            PathBuf::from("/proc/sys/net"),
            PathBuf::from(sticky_overlay::config::DEFAULT_STATE_DIR)
        ]
    );
    let mut families = words(&s, "RestrictAddressFamilies");
    families.sort();
    assert_eq!(
        families,
        ["AF_NETLINK", "AF_UNIX"],
        "no API, no Internet socket"
    );
}

// ---- Maintainer scripts ------------------------------------------------------------------------

/// Runs the maintainer script `rel` with `args` as dpkg (`sh FILE ARGS`) or rpm (the
/// scriptlet's text with `$1`) do, with systemd running or not; the `systemctl` calls it made,
/// one line of arguments each.
fn run_script(rel: &str, args: &[&str], systemd_running: bool) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).unwrap();
    let log = dir.path().join("systemctl.log");
    fs::write(&log, "").unwrap();
    let stub = bin.join("systemctl");
    fs::write(
        &stub,
        "#!/bin/sh\nprintf '%s\\n' \"$*\" >>\"$SYSTEMCTL_LOG\"\n",
    )
    .unwrap();
    fs::set_permissions(&stub, fs::Permissions::from_mode(0o755)).unwrap();
    let booted = dir.path().join("run-systemd-system");
    if systemd_running {
        fs::create_dir(&booted).unwrap();
    }
    let script = fs::read_to_string(repo_file(rel))
        .unwrap()
        .replace("/run/systemd/system", booted.to_str().unwrap());
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .arg("sh")
        .args(args)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("SYSTEMCTL_LOG", &log)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{rel} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

const TRY_RESTART_AGENT: &str = "try-restart sticky-vxlan-agent.service";
/// Every running instance of sticky-wg's template (a pattern systemctl matches against loaded
/// units): restarted on an upgrade so it runs the new binary, stopped before its binary goes.
const TRY_RESTART_WG: &str = "try-restart sticky-wg@*.service";
const STOP_WG: &str = "stop sticky-wg@*.service";

#[test]
fn deb_upgrade_restarts_a_running_agent_and_a_first_install_starts_nothing() {
    let postinst = "packaging/debian/postinst";
    for first_install in [&["configure"][..], &["configure", ""]] {
        assert_eq!(run_script(postinst, first_install, true), ["daemon-reload"]);
    }
    assert_eq!(
        run_script(postinst, &["configure", "0.0.9"], true),
        ["daemon-reload", TRY_RESTART_AGENT, TRY_RESTART_WG],
        "an upgrade: the running agent is restarted on the new binary (a stopped one stays stopped)"
    );
    assert!(
        run_script(postinst, &["configure", "0.0.9"], false).is_empty(),
        "no systemd running (container, chroot): nothing"
    );
    assert!(run_script(postinst, &["abort-upgrade", "0.1.0"], true).is_empty());
    // Removal: as before, both units disabled, the agent stopped; an upgrade leaves it running.
    assert_eq!(
        run_script("packaging/debian/prerm", &["remove"], false),
        [
            "--no-reload disable sticky-vxlan-reconcile.service",
            "stop sticky-vxlan-agent.service",
            "--no-reload disable sticky-vxlan-agent.service",
            STOP_WG,
        ]
    );
    assert!(run_script("packaging/debian/prerm", &["upgrade", "0.1.1"], true).is_empty());
    assert_eq!(
        run_script("packaging/debian/postrm", &["purge"], true),
        ["daemon-reload"]
    );
    assert!(run_script("packaging/debian/postrm", &["upgrade", "0.1.1"], true).is_empty());
}

#[test]
fn rpm_upgrade_restarts_a_running_agent_and_a_first_install_starts_nothing() {
    let post = "packaging/rpm/post_install.sh";
    assert_eq!(run_script(post, &["1"], true), ["daemon-reload"]);
    assert_eq!(
        run_script(post, &["2"], true),
        ["daemon-reload", TRY_RESTART_AGENT, TRY_RESTART_WG]
    );
    assert!(run_script(post, &["2"], false).is_empty());
    assert_eq!(
        run_script("packaging/rpm/pre_uninstall.sh", &["0"], false),
        [
            "--no-reload disable sticky-vxlan-reconcile.service",
            "stop sticky-vxlan-agent.service",
            "--no-reload disable sticky-vxlan-agent.service",
            STOP_WG,
        ]
    );
    assert!(run_script("packaging/rpm/pre_uninstall.sh", &["1"], true).is_empty());
    assert_eq!(
        run_script("packaging/rpm/post_uninstall.sh", &["0"], true),
        ["daemon-reload"]
    );
}
