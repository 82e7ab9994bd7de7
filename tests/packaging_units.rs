//! Checks of the systemd units the packages ship (`packaging/*.service`): the command each
//! runs, from the names in `/etc/default/sticky-cni`. The `ExecStart=` line is undone as
//! systemd does it (`$$` is a literal `$`) and its shell script run with `sh`, the binary
//! replaced by a stub that prints its arguments. `scripts/test-packages.sh` checks the
//! installed units with `systemd-analyze verify`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const BINARY: &str = "/opt/cni/bin/sticky-vxlan";

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
    let stub = dir.path().join("sticky-vxlan");
    fs::write(&stub, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").unwrap();
    fs::set_permissions(&stub, fs::Permissions::from_mode(0o755)).unwrap();
    let script = exec_script(unit);
    assert_eq!(script.matches(BINARY).count(), 1, "{script}");
    let script = script.replace(BINARY, stub.to_str().unwrap());
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
    let unit = "packaging/sticky-vxlan-reconcile.service";
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
    let unit = "packaging/sticky-vxlan-agent.service";
    assert_eq!(
        argv(
            unit,
            &[
                ("STICKY_CNI_CONFLIST", "10-sticky-vxlan.conflist"),
                ("STICKY_VXLAN_AGENT_ARGS", "--no-api --resync 30"),
            ]
        ),
        [
            "agent",
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
            "agent",
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
