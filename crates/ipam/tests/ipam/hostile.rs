//! A hostile or careless operator against sticky-ipam (issue 8, rules 5 to 9): links planted
//! in the data dir and beside the metrics file, a full data dir filesystem, DELs and CHECKs
//! without ranges, unreadable records. Each test drives the binary as a runtime does.

use sticky_testkit::support;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde_json::json;
use support::*;

const NET: &str = "hostile";
const PRECIOUS: &[u8] = b"precious, not sticky-ipam's\n";

/// A temp dir with a data dir, a victim file outside it, and a config.
struct Scene {
    tmp: tempfile::TempDir,
    data: PathBuf,
    conf: Conf,
}

impl Scene {
    /// A data dir where `pod` was added and deleted (container `c0`): its released lease, the
    /// hints and the index all exist.
    fn with_released(pod: &Pod) -> Scene {
        let s = Scene::new();
        Plugin::sticky()
            .run(&Call::add("c0", &s.conf).pod(pod))
            .ok();
        Plugin::sticky()
            .run(&Call::del("c0", &s.conf).pod(pod))
            .ok_empty();
        s
    }

    fn new() -> Scene {
        let tmp = temp_dir();
        let data = tmp.path().join("data");
        let conf = Conf::v4(NET, &data, "10.40.0.0/24");
        Scene { tmp, data, conf }
    }

    fn dir(&self) -> PathBuf {
        self.data.join(NET)
    }

    fn victim(&self) -> PathBuf {
        let v = self.tmp.path().join("victim");
        if !v.exists() {
            fs::write(&v, PRECIOUS).unwrap();
        }
        v
    }

    fn assert_victim_untouched(&self, what: &str) {
        assert_eq!(
            fs::read(self.victim()).unwrap(),
            PRECIOUS,
            "{what}: the file a planted link points to was written"
        );
    }
}

/// Runs a call that may succeed or fail; a failure must be a CNI error object.
fn run_any(call: &Call) -> Outcome {
    let out = Plugin::sticky().run(call);
    if !out.status.success() {
        out.err_code();
    }
    out
}

#[test]
fn no_bookkeeping_file_is_written_through_a_planted_link() {
    for hint in [
        "last_reserved_ip.0",
        "release_seq",
        "lease_clock",
        "sticky_counters",
        "boot_id",
    ] {
        let s = Scene::new();
        let conf = s
            .conf
            .clone()
            .ipam("leaseHold", json!("1h"))
            .ipam("metricsFile", json!(s.tmp.path().join("m.prom")));
        let pod = Pod::new("ns", "a", "uid-a");
        // One ADD/DEL so that the directory exists, then the link replaces the real file.
        Plugin::sticky().run(&Call::add("c0", &conf).pod(&pod)).ok();
        Plugin::sticky()
            .run(&Call::del("c0", &conf).pod(&pod))
            .ok_empty();
        let _ = fs::remove_file(s.dir().join(hint));
        symlink(s.victim(), s.dir().join(hint)).unwrap();
        let b = Pod::new("ns", "b", "uid-b");
        run_any(&Call::add("c1", &conf).pod(&b));
        run_any(&Call::del("c1", &conf).pod(&b));
        run_any(&Call::add("c2", &conf));
        run_any(&Call::del("c2", &conf));
        s.assert_victim_untouched(hint);
        assert!(
            fs::symlink_metadata(s.dir().join(hint))
                .unwrap()
                .file_type()
                .is_symlink(),
            "{hint}: the planted link was replaced: sticky-ipam touched a file it did not make"
        );
    }
}

#[test]
fn a_dangling_lock_link_is_refused_and_creates_nothing() {
    let s = Scene::new();
    fs::create_dir_all(s.dir()).unwrap();
    let target = s.tmp.path().join("created-through-lock");
    symlink(&target, s.dir().join("lock")).unwrap();
    let before = snapshot(s.tmp.path());
    for call in [
        Call::add("c1", &s.conf),
        Call::del("c1", &s.conf),
        Call::new("STATUS", "c1", &s.conf.clone().version("1.1.0").bytes()),
    ] {
        let out = Plugin::sticky().run(&call);
        let code = out.err_code();
        assert!(code == 5 || code == 50, "{}: code {code}", out.what);
        let msg = out.json.as_ref().unwrap()["msg"].to_string()
            + &out.json.as_ref().unwrap()["details"].to_string();
        assert!(
            msg.contains("lock"),
            "{}: the error names the file: {msg}",
            out.what
        );
    }
    assert!(!target.exists(), "a dangling lock link created its target");
    assert_same_strict(&before, &snapshot(s.tmp.path()), "refused calls");
}

#[test]
fn a_link_or_fifo_at_a_record_name_is_never_followed() {
    let s = Scene::new();
    let pod = Pod::new("ns", "a", "uid-a");
    let first = result_ip(
        &Plugin::sticky()
            .run(&Call::add("c0", &s.conf).pod(&pod))
            .ok(),
    );
    Plugin::sticky()
        .run(&Call::del("c0", &s.conf).pod(&pod))
        .ok_empty();
    let lease = s.dir().join(sticky_name(first, "ns", "a"));
    fs::remove_file(&lease).unwrap();
    symlink(s.victim(), &lease).unwrap();
    // The next free address, planted as a link to the victim and as a FIFO.
    symlink(s.victim(), s.dir().join("10.40.0.3")).unwrap();
    nix::unistd::mkfifo(&s.dir().join("10.40.0.4"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let conf = s.conf.clone();
    std::thread::spawn(move || {
        let out = run_any(&Call::add("c1", &conf).pod(&pod));
        let del = run_any(&Call::del("c1", &conf).pod(&pod));
        let other = run_any(&Call::add("c2", &conf));
        tx.send((out, del, other)).ok();
    });
    let Ok((add, _, other)) = rx.recv_timeout(std::time::Duration::from_secs(20)) else {
        // Unblock the plugin stuck on the FIFO, so no process outlives the test.
        let _ = fs::OpenOptions::new()
            .write(true)
            .open(s.dir().join("10.40.0.4"));
        panic!("a FIFO at a record name blocked the plugin");
    };
    for out in [&add, &other] {
        if out.status.success() {
            let got = result_ip(out.json.as_ref().unwrap());
            assert!(
                ![first, ip("10.40.0.3"), ip("10.40.0.4")].contains(&got),
                "{}: handed out {got}, whose record is not a regular file",
                out.what
            );
        }
    }
    s.assert_victim_untouched("record links");
}

/// Starts `sticky-ipam` through `sh`, which plants a link at `name` with `$$` (the pid the
/// plugin keeps after `exec`) replaced, as an attacker guessing the pid would.
fn with_planted_link(victim: &Path, dir: &Path, name: &str) -> Plugin {
    let mut p = Plugin::sticky();
    p.wrapper = vec![
        "sh".into(),
        "-c".into(),
        format!(
            "ln -s '{}' \"{}/{name}\" && exec \"$0\"",
            victim.display(),
            dir.display()
        ),
    ];
    p
}

#[test]
fn the_metrics_temp_file_is_not_predictable_nor_followed() {
    let s = Scene::new();
    let metrics_dir = s.tmp.path().join("textfile");
    fs::create_dir_all(&metrics_dir).unwrap();
    let conf = s
        .conf
        .clone()
        .ipam("metricsFile", json!(metrics_dir.join("ipam.prom")));
    let plugin = with_planted_link(&s.victim(), &metrics_dir, ".ipam.prom.$$.tmp");
    plugin.run(&Call::add("c1", &conf)).ok();
    s.assert_victim_untouched("metrics temp link");
    let prom = fs::read_to_string(metrics_dir.join("ipam.prom")).unwrap();
    assert!(prom.contains("sticky_ipam_addresses"), "{prom}");
    // A link at the metrics file itself is replaced by the new file, never written through.
    fs::remove_file(metrics_dir.join("ipam.prom")).unwrap();
    symlink(s.victim(), metrics_dir.join("ipam.prom")).unwrap();
    Plugin::sticky().run(&Call::del("c1", &conf)).ok_empty();
    s.assert_victim_untouched("metrics file link");
    let left: Vec<_> = fs::read_dir(&metrics_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") && !n.contains(".$$"))
        .collect();
    assert!(
        left.is_empty() || left.iter().all(|n| n.starts_with(".ipam.prom.")),
        "{left:?}"
    );
}

#[test]
fn a_linked_network_dir_is_refused() {
    let s = Scene::new();
    let elsewhere = s.tmp.path().join("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    fs::create_dir_all(&s.data).unwrap();
    symlink(&elsewhere, s.dir()).unwrap();
    let out = Plugin::sticky().run(&Call::add("c1", &s.conf));
    out.expect_code(5);
    assert_eq!(
        fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "files were created through a linked network directory"
    );
}

/// Runs the operator's tool without `CNI_COMMAND`; returns (exit code, stdout, stderr).
fn tool(args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(sticky_bin());
    cmd.args(args);
    run_tool(cmd)
}

#[test]
fn an_unreadable_lease_is_held_never_reclaimed_nor_expired() {
    let s = Scene::new();
    // 10.40.0.2 .. 10.40.0.6: five addresses, two of them unreadable leases.
    let conf = Conf::v4(NET, &s.data, "10.40.0.0/29").ipam("leaseHold", json!("1s"));
    fs::create_dir_all(s.dir()).unwrap();
    let newer = r#"{"format":"sticky-ipam/v2","containerId":"c-new","state":"attached"}"#;
    let damaged = r#"{"format":"sticky-ipam/v1","containerId":"c-dam","ifna"#;
    fs::write(s.dir().join("10.40.0.2_ns_future"), newer).unwrap();
    fs::write(s.dir().join("10.40.0.3_ns_damaged"), damaged).unwrap();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let got = result_ip(
            &Plugin::sticky()
                .run(&Call::add(&format!("c{i}"), &conf).pod(&Pod::new("ns", name, name)))
                .ok(),
        );
        assert!(got != ip("10.40.0.2") && got != ip("10.40.0.3"), "{got}");
    }
    // The range is full: reclaim may take a released lease, never a held one.
    let out = Plugin::sticky().run(&Call::add("c9", &conf).pod(&Pod::new("ns", "z", "z")));
    assert!(
        !out.status.success(),
        "the range is full but ADD got {:?}",
        out.json
    );
    assert_eq!(
        fs::read_to_string(s.dir().join("10.40.0.2_ns_future")).unwrap(),
        newer
    );
    assert_eq!(
        fs::read_to_string(s.dir().join("10.40.0.3_ns_damaged")).unwrap(),
        damaged
    );
    // The pods named by the held records do not get them back either: nobody can tell.
    let out = Plugin::sticky().run(&Call::add("c8", &conf).pod(&Pod::new("ns", "future", "f")));
    assert!(!out.status.success(), "{:?}", out.json);
    let (code, text, err) = tool(&["list", "--json", "--data-dir", s.data.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let rows: serde_json::Value = serde_json::from_str(&text).unwrap();
    for held in ["10.40.0.2", "10.40.0.3"] {
        let row = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["ip"] == held)
            .unwrap_or_else(|| panic!("{held} not listed: {text}"));
        assert_eq!(row["state"], "held", "{row}");
        assert!(
            row["heldReason"].as_str().is_some_and(|r| !r.is_empty()),
            "{row}"
        );
    }
    let (_, table, _) = tool(&["list", "--data-dir", s.data.to_str().unwrap()]);
    assert!(table.contains("held ("), "{table}");
}

/// The same network with an `ipam` section that names no ranges (as sticky-vxlan's cluster
/// conflist, which DEL accepts).
fn without_ranges(conf: &Conf) -> Conf {
    let mut c = conf.clone();
    c.value["ipam"].as_object_mut().unwrap().remove("ranges");
    c
}

#[test]
fn del_without_ranges_releases_a_record_without_identity() {
    for (what, sticky_off, with_pod) in [
        ("ctr run --cni style (no CNI_ARGS)", false, false),
        ("sticky: false with a pod name", true, true),
    ] {
        let s = Scene::new();
        let mut conf = s.conf.clone();
        if sticky_off {
            conf = conf.ipam("sticky", json!(false));
        }
        let pod = Pod::new("ns", "a", "uid-a");
        let add = Call::add("c1", &conf);
        let add = if with_pod { add.pod(&pod) } else { add };
        let got = result_ip(&Plugin::sticky().run(&add).ok());
        assert!(
            s.dir().join(got.to_string()).exists(),
            "{what}: {got} recorded"
        );
        let del = Call::del("c1", &without_ranges(&conf));
        let del = if with_pod { del.pod(&pod) } else { del };
        Plugin::sticky().run(&del).ok_empty();
        let st = check_dir(&s.dir(), COMPLETED);
        assert!(
            st.attached_to("c1").is_empty(),
            "{what}: DEL without ranges left {got} attached to a dead sandbox: {st:?}"
        );
    }
}

#[test]
fn check_refuses_another_pods_address_outside_the_current_ranges() {
    let s = Scene::new();
    let a = Plugin::sticky()
        .run(&Call::add("c1", &s.conf).pod(&Pod::new("ns", "a", "ua")))
        .ok();
    let b = Plugin::sticky()
        .run(&Call::add("c2", &s.conf).pod(&Pod::new("ns", "b", "ub")))
        .ok();
    // The ranges move: both addresses now lie outside them.
    let moved = Conf::v4(NET, &s.data, "10.41.0.0/24");
    let check = |cid: &str, pod: &str, prev: &serde_json::Value| {
        Plugin::sticky()
            .run(&Call::check(cid, &moved.clone().prev_result(prev)).pod(&Pod::new("ns", pod, "u")))
    };
    check("c1", "a", &a).ok_empty();
    let out = check("c1", "a", &b);
    assert!(
        !out.status.success(),
        "CHECK of c1 passed with c2's address {}",
        result_ip(&b)
    );
    out.err_code();
}

/// A small tmpfs mounted at `dir`, unmounted on drop (also on panic).
struct SmallFs {
    dir: PathBuf,
}

impl SmallFs {
    fn mount(dir: &Path, size: &str) -> SmallFs {
        fs::create_dir_all(dir).unwrap();
        sh(&[
            "mount",
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0755"),
            "tmpfs",
            dir.to_str().unwrap(),
        ]);
        SmallFs {
            dir: dir.to_path_buf(),
        }
    }

    /// Writes a filler file until the filesystem refuses another byte.
    fn fill(&self) {
        use std::io::Write;
        let mut f = fs::File::create(self.dir.join("filler")).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).and_then(|()| f.sync_all()).is_ok() {}
        // Whatever is left over is less than a page; take it too.
        while f.write_all(&block[..1]).and_then(|()| f.sync_all()).is_ok() {}
    }

    fn unfill(&self) {
        fs::remove_file(self.dir.join("filler")).unwrap();
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
    }
}

#[test]
#[ignore = "needs root: mounting a small tmpfs"]
fn a_full_data_dir_never_blocks_teardown_and_status_says_so() {
    assert_root("mounting a small tmpfs");
    let s = Scene::new();
    let small = SmallFs::mount(&s.data, "256k");
    let conf = s.conf.clone().version("1.1.0");
    let pod = Pod::new("ns", "a", "uid-a");
    let ip_a = result_ip(&Plugin::sticky().run(&Call::add("c1", &conf).pod(&pod)).ok());
    let ip_anon = result_ip(&Plugin::sticky().run(&Call::add("c2", &conf)).ok());
    small.fill();
    let status = Call::new("STATUS", "c1", &conf.bytes());
    Plugin::sticky().run(&status).expect_code(50);
    Plugin::sticky()
        .run(&Call::del("c1", &conf).pod(&pod))
        .ok_empty();
    Plugin::sticky().run(&Call::del("c2", &conf)).ok_empty();
    let st = check_dir(&s.dir(), COMPLETED);
    assert!(
        st.attached_to("c1").is_empty() && st.attached_to("c2").is_empty(),
        "DEL on a full disk left an address attached to a dead sandbox: {st:?}"
    );
    assert!(
        !s.dir().join(ip_anon.to_string()).exists(),
        "{ip_anon} still recorded"
    );
    // Space again: the pod gets its address back, STATUS is ready.
    small.unfill();
    Plugin::sticky().run(&status).ok_empty();
    let back = result_ip(&Plugin::sticky().run(&Call::add("c3", &conf).pod(&pod)).ok());
    assert_eq!(back, ip_a, "the lease released on a full disk was not kept");
    check_dir(&s.dir(), COMPLETED);
}

#[test]
fn list_show_and_gc_dry_run_write_nothing() {
    let s = Scene::new();
    let pod = Pod::new("ns", "a", "uid-a");
    Plugin::sticky()
        .run(&Call::add("c1", &s.conf).pod(&pod))
        .ok();
    Plugin::sticky().run(&Call::add("c2", &s.conf)).ok();
    // No lock (a data dir copied from a backup), and a killed writer's temp file.
    fs::remove_file(s.dir().join("lock")).unwrap();
    fs::write(s.dir().join(".tmp.0123456789abcdef"), b"half").unwrap();
    let data = s.data.to_str().unwrap();
    let before = snapshot(s.tmp.path());
    for argv in [
        &["list", "--data-dir", data][..],
        &["list", "--json", "--data-dir", data],
        &["--data-dir", data, "show", "ns/a"],
        &["--data-dir", data, "show", "ns/a", "--json"],
        &["--data-dir", data, "gc", "--dry-run"],
    ] {
        let (code, out, err) = tool(argv);
        assert_eq!(code, 0, "{argv:?}: {out}{err}");
        assert_same_strict(&before, &snapshot(s.tmp.path()), &format!("{argv:?}"));
    }
}

#[test]
#[ignore = "needs root: a read-only bind mount"]
fn list_and_show_work_on_a_read_only_data_dir() {
    assert_root("a read-only bind mount");
    let s = Scene::new();
    let pod = Pod::new("ns", "a", "uid-a");
    Plugin::sticky()
        .run(&Call::add("c1", &s.conf).pod(&pod))
        .ok();
    let data = s.data.to_str().unwrap();
    sh(&["mount", "--bind", data, data]);
    struct Unmount<'a>(&'a str);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _guard = Unmount(data);
    sh(&["mount", "-o", "remount,ro,bind", data]);
    for argv in [
        &["list", "--data-dir", data][..],
        &["--data-dir", data, "show", "ns/a"],
        &["--data-dir", data, "gc", "--dry-run"],
    ] {
        let (code, out, err) = tool(argv);
        assert_eq!(code, 0, "{argv:?} on a read-only data dir: {out}{err}");
    }
}

#[test]
fn list_and_show_take_a_pod_name_longer_than_a_format_width() {
    let s = Scene::new();
    let long = "p".repeat(70_000);
    let pod = Pod::new("ns", &long, "uid-long");
    Plugin::sticky()
        .run(&Call::add("c1", &s.conf).pod(&pod))
        .ok();
    let data = s.data.to_str().unwrap();
    let (code, out, err) = tool(&["list", "--data-dir", data]);
    assert_eq!(code, 0, "list: {err}");
    assert!(out.contains(&long), "list shows the whole name");
    let who = format!("ns/{long}");
    let (code, _, err) = tool(&["--data-dir", data, "show", &who]);
    assert_eq!(code, 0, "show: {err}");
}

/// Runs the operator's tool in a new network namespace whose only address is `addr` on a
/// veth: a node of the cluster, without touching the host's addresses.
fn tool_on_node(addr: &str, args: &[&str]) -> (i32, String, String) {
    let script = format!(
        "ip link add d0 type veth peer name d1 && ip addr add {addr} dev d0 && ip link set d0 up && exec \"$0\" \"$@\""
    );
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-n", "sh", "-c", &script])
        .arg(sticky_bin())
        .args(args);
    run_tool(cmd)
}

#[test]
#[ignore = "needs root: a network namespace standing in for a node"]
fn the_tool_reads_the_cluster_conflist_as_the_plugin_does() {
    assert_root("a network namespace standing in for a node");
    let s = Scene::new();
    let peers = s.tmp.path().join("peers.json");
    fs::write(
        &peers,
        r#"{"peers": [{"ip": "192.0.2.10", "subnets": ["10.244.1.0/24"]},
                      {"ip": "192.0.2.11", "subnets": ["10.244.2.0/24"]}]}"#,
    )
    .unwrap();
    // The DaemonSet's conflist: ipam without ranges, this test's paths.
    let mut list: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(
            sticky_testkit::support::bins::repo_root()
                .join("conf-examples/11-sticky-vxlan-cluster.conflist"),
        )
        .unwrap(),
    )
    .unwrap();
    let net = list["name"].as_str().unwrap().to_string();
    list["plugins"][0]["peersFile"] = json!(peers);
    list["plugins"][0]["stateDir"] = json!(s.tmp.path().join("state"));
    list["plugins"][0]["ipam"]["dataDir"] = json!(s.data);
    let conflist = s.tmp.path().join("11-sticky-vxlan-cluster.conflist");
    fs::write(&conflist, list.to_string()).unwrap();
    // What the plugin holds on node 192.0.2.10: the ranges sticky-vxlan filled in.
    let conf = Conf::v4(&net, &s.data, "10.244.1.0/24");
    let pod = Pod::new("ns", "a", "uid-a");
    let got = result_ip(&Plugin::sticky().run(&Call::add("c1", &conf).pod(&pod)).ok());
    let config = conflist.to_str().unwrap();
    let (code, out, err) = tool_on_node("192.0.2.10/24", &["--config", config, "show", "ns/a"]);
    assert_eq!(code, 0, "show: {out}{err}");
    assert!(
        out.contains("10.244.1.1-10.244.1.254") && out.contains(&got.to_string()),
        "{out}"
    );
    let (code, out, err) = tool_on_node("192.0.2.10/24", &["--config", config, "gc", "--dry-run"]);
    assert_eq!(code, 0, "gc --dry-run: {out}{err}");
    // On a node the peers do not name, the tool says so (a usage error, nothing written).
    let (code, _, err) = tool_on_node("192.0.2.99/24", &["--config", config, "show", "ns/a"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no peer entry names this node"), "{err}");
    let (code, out, err) = tool_on_node("192.0.2.10/24", &["--config", config, "downgrade"]);
    assert_eq!(code, 0, "downgrade: {out}{err}");
    assert!(
        s.data.join(&net).join(got.to_string()).exists(),
        "downgrade converted the lease"
    );
}

#[test]
fn no_hint_is_rewritten_through_a_hard_link() {
    for hint in ["last_reserved_ip.0", "release_seq", "lease_clock"] {
        let pod = Pod::new("ns", "a", "uid-a");
        let s = Scene::with_released(&pod);
        let _ = fs::remove_file(s.dir().join(hint));
        fs::hard_link(s.victim(), s.dir().join(hint)).unwrap();
        let b = Pod::new("ns", "b", "uid-b");
        run_any(&Call::add("c1", &s.conf).pod(&b));
        run_any(&Call::del("c1", &s.conf).pod(&b));
        s.assert_victim_untouched(hint);
    }
}

/// The index's bucket and stamp files are rewritten in place too: a hard link planted at one
/// is never written through. The index directory is ours, the other name's file is not: our
/// name is replaced by a new file, the linked file is left as it is, and the calls and the
/// index work on (rebuilt from the records, trusted again afterwards).
#[test]
fn no_index_file_is_rewritten_through_a_hard_link() {
    for file in ["ip.00", "pod.ff", "stamp"] {
        let pod = Pod::new("ns", "a", "uid-a");
        let s = Scene::with_released(&pod);
        let planted = s.dir().join(INDEX_DIR).join(file);
        let _ = fs::remove_file(&planted);
        fs::hard_link(s.victim(), &planted).unwrap();
        // A record written and removed behind the index (an operator, host-local): the next
        // call lists the directory and rewrites every bucket and the stamp.
        fs::write(s.dir().join("stray"), b"").unwrap();
        fs::remove_file(s.dir().join("stray")).unwrap();
        let b = Pod::new("ns", "b", "uid-b");
        Plugin::sticky().run(&Call::add("c1", &s.conf).pod(&b)).ok();
        Plugin::sticky()
            .run(&Call::del("c1", &s.conf).pod(&b))
            .ok_empty();
        s.assert_victim_untouched(file);
        assert!(check_index(&s.dir()), "{file}: index not trusted again");
        let back = result_ip(
            &Plugin::sticky()
                .run(&Call::add("c2", &s.conf).pod(&pod))
                .ok(),
        );
        assert_eq!(back, ip("10.40.0.2"), "{file}: pod a lost its lease");
        s.assert_victim_untouched(file);
    }
}

/// A FIFO at the index's stamp or at its buckets cannot block a call: the index is read
/// `O_NONBLOCK` like every file, a FIFO is not trusted, and the calls go on and replace it.
#[test]
fn a_fifo_in_the_index_blocks_no_call() {
    for what in ["stamp", "every bucket"] {
        let s = Scene::new();
        let pod = Pod::new("ns", "a", "uid-a");
        Plugin::sticky()
            .run(&Call::add("c0", &s.conf).pod(&pod))
            .ok();
        let index = s.dir().join(INDEX_DIR);
        let mut fifos = Vec::new();
        for e in fs::read_dir(&index).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if (name == "stamp") == (what == "stamp") {
                fifos.push(index.join(name));
            }
        }
        for f in &fifos {
            fs::remove_file(f).unwrap();
            nix::unistd::mkfifo(f, nix::sys::stat::Mode::S_IRWXU).unwrap();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let conf = s.conf.clone();
        std::thread::spawn(move || {
            let b = Pod::new("ns", "b", "uid-b");
            let add = Plugin::sticky().run(&Call::add("c1", &conf).pod(&b));
            let del = Plugin::sticky().run(&Call::del("c1", &conf).pod(&b));
            tx.send((add, del)).ok();
        });
        let Ok((add, del)) = rx.recv_timeout(std::time::Duration::from_secs(20)) else {
            // Unblock the plugin stuck on the FIFOs (an open for reading or writing waits
            // for the other end), one after the other, so no process outlives the test.
            use std::os::unix::fs::OpenOptionsExt;
            for _ in 0..100 {
                for f in &fifos {
                    for write in [false, true] {
                        let _ = fs::OpenOptions::new()
                            .read(!write)
                            .write(write)
                            .custom_flags(nix::libc::O_NONBLOCK)
                            .open(f);
                    }
                }
                if rx
                    .recv_timeout(std::time::Duration::from_millis(100))
                    .is_ok()
                {
                    break;
                }
            }
            panic!("a FIFO at the index's {what} blocked the plugin");
        };
        add.ok();
        del.ok_empty();
        assert!(check_index(&s.dir()), "{what}: index not trusted again");
    }
}

#[test]
#[ignore = "needs root: mounting a small tmpfs"]
fn del_succeeds_when_no_inode_is_left() {
    assert_root("mounting a small tmpfs");
    let s = Scene::new();
    fs::create_dir_all(&s.data).unwrap();
    sh(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=4m,nr_inodes=1200,mode=0755",
        "tmpfs",
        s.data.to_str().unwrap(),
    ]);
    let small = SmallFs {
        dir: s.data.clone(),
    };
    let pod = Pod::new("ns", "a", "uid-a");
    let ip_a = result_ip(
        &Plugin::sticky()
            .run(&Call::add("c1", &s.conf).pod(&pod))
            .ok(),
    );
    // Every inode taken: not one more file can be created, whatever its size.
    let mut n = 0;
    while fs::File::create(small.dir.join(format!("i{n}"))).is_ok() {
        n += 1;
    }
    Plugin::sticky()
        .run(&Call::del("c1", &s.conf).pod(&pod))
        .ok_empty();
    let st = check_dir(&s.dir(), COMPLETED);
    assert!(st.attached_to("c1").is_empty(), "{st:?}");
    for i in 0..n {
        fs::remove_file(small.dir.join(format!("i{i}"))).unwrap();
    }
    let back = result_ip(
        &Plugin::sticky()
            .run(&Call::add("c2", &s.conf).pod(&pod))
            .ok(),
    );
    assert_eq!(back, ip_a);
}
