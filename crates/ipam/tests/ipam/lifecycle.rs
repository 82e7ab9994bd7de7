//! sticky-ipam's lifecycle commands and passes, run as a runtime runs them: GC (CNI 1.1.0),
//! STATUS, lease expiry on the data dir's lease clock (`leaseHold`), and the once-per-boot
//! sweep of attachments from an earlier boot (simulated with a bind mount over the kernel's
//! boot id inside `unshare -m`, never with a switch in the product).
//!
//! Expiry is tested without sleeping: the records and the `lease_clock` file
//! (`<clock> <wall> <next-expiry|->`) are seeded or moved forward directly.

use sticky_testkit::support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use support::*;

const NET: &str = "life";

struct Env {
    dir: tempfile::TempDir,
    p: Plugin,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: temp_dir(),
            p: Plugin::sticky(),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn net(&self) -> PathBuf {
        self.data().join(NET)
    }

    /// A 1.1.0 config (GC and STATUS need it) with one IPv4 range set.
    fn conf(&self, range: Value) -> Conf {
        Conf::new(NET, &self.data(), json!([[range]])).version("1.1.0")
    }

    fn add_with(&self, p: &Plugin, conf: &Conf, cid: &str, pod: &Pod) -> IpAddr {
        result_ip(&p.run(&Call::add(cid, conf).pod(pod)).ok())
    }

    fn add(&self, conf: &Conf, cid: &str, pod: &Pod) -> IpAddr {
        self.add_with(&self.p, conf, cid, pod)
    }

    fn del(&self, conf: &Conf, cid: &str, pod: &Pod) {
        self.p.run(&Call::del(cid, conf).pod(pod)).ok_empty();
    }

    fn state(&self) -> State {
        check_dir(&self.net(), COMPLETED)
    }

    fn file(&self, name: &str) -> Option<Vec<u8>> {
        std::fs::read(self.net().join(name)).ok()
    }
}

fn pod(name: &str) -> Pod {
    Pod::new("ns", name, &format!("uid-{name}"))
}

/// A GC call: only `CNI_COMMAND` and `CNI_PATH`, as libcni sends it.
fn gc_call(conf: &Conf) -> Call {
    let mut c = Call::new("GC", "", &conf.bytes());
    c.container_id = None;
    c.ifname = None;
    c.netns = None;
    c
}

/// A STATUS call: only `CNI_COMMAND` (and `CNI_PATH`).
fn status_call(stdin: &[u8]) -> Call {
    let mut c = Call::new("STATUS", "", stdin);
    c.container_id = None;
    c.ifname = None;
    c.netns = None;
    c
}

/// `conf` with `cni.dev/valid-attachments` listing (container id, ifname) pairs.
fn with_valid(conf: &Conf, valid: &[(&str, &str)]) -> Conf {
    let list: Vec<Value> = valid
        .iter()
        .map(|(c, i)| json!({ "containerID": c, "ifname": i }))
        .collect();
    conf.clone().top("cni.dev/valid-attachments", json!(list))
}

fn wall_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `lease_clock` parsed: (clock, wall, next expiry).
fn read_clock(net: &Path) -> (u64, u64, Option<u64>) {
    let text = std::fs::read_to_string(net.join("lease_clock")).expect("lease_clock exists");
    let parts: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(
        parts.len(),
        3,
        "lease_clock is `<clock> <wall> <next|->`: {text:?}"
    );
    let next = match parts[2] {
        "-" => None,
        n => Some(n.parse().unwrap()),
    };
    (parts[0].parse().unwrap(), parts[1].parse().unwrap(), next)
}

fn write_clock(net: &Path, clock: u64, wall: u64, next: Option<u64>) {
    std::fs::create_dir_all(net).unwrap();
    let next = next.map_or_else(|| "-".to_string(), |n| n.to_string());
    std::fs::write(net.join("lease_clock"), format!("{clock} {wall} {next}")).unwrap();
}

fn lease(name: &str, attached: bool, seq: u64, released_at: u64) -> StickyRecord {
    StickyRecord {
        container_id: format!("c-{name}"),
        ifname: "eth0".into(),
        namespace: "ns".into(),
        pod: name.into(),
        pod_uid: format!("uid-{name}"),
        boot: current_boot_id(),
        attached,
        release_seq: if attached { 0 } else { seq },
        released_at: if attached { 0 } else { released_at },
    }
}

// ---------------------------------------------------------------------------------------------
// GC

#[test]
fn gc_with_an_empty_valid_list_releases_every_attachment_and_the_pods_come_back() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.40.0.0/24" }));
    let (a, b) = (pod("a"), pod("b"));
    let ip_a = e.add(&conf, "c-a1", &a);
    let ip_b = e.add(&conf, "c-b1", &b);
    let ip_anon = result_ip(&e.p.run(&Call::add("c-anon", &conf)).ok());
    assert_eq!(
        e.file(&ip_anon.to_string()).as_deref(),
        Some(&b"c-anon\r\neth0"[..])
    );
    let hint = e.file("last_reserved_ip.0").unwrap();
    let lock = e.file("lock").unwrap();

    let out = e.p.run(&gc_call(&with_valid(&conf, &[])));
    out.ok_empty();

    let st = e.state();
    for ip in [ip_a, ip_b] {
        let rec = st.sticky(ip);
        assert!(!rec.attached, "GC must release {ip}: {rec:?}");
        assert!(rec.release_seq > 0);
    }
    assert!(
        st.by_ip(ip_anon).is_none(),
        "a record without pod identity is deleted by GC: {st:?}"
    );
    assert_eq!(st.records.len(), 2, "{st:?}");
    assert_eq!(e.file("last_reserved_ip.0").unwrap(), hint, "hint touched");
    assert_eq!(e.file("lock").unwrap(), lock, "lock touched");

    // A new pod does not get a released lease while free addresses remain ...
    let ip_n = e.add(&conf, "c-n", &pod("n"));
    assert!(ip_n != ip_a && ip_n != ip_b, "{ip_n} was a kept lease");
    // ... and the released pods come back, with new sandboxes, on their addresses.
    assert_eq!(e.add(&conf, "c-b2", &Pod::new("ns", "b", "uid-b2")), ip_b);
    assert_eq!(e.add(&conf, "c-a2", &a), ip_a);
    let st = e.state();
    assert_eq!(st.attached_to("c-a2"), vec![ip_a]);
    assert_eq!(st.attached_to("c-b2"), vec![ip_b]);
}

#[test]
fn gc_with_a_partial_list_releases_only_the_unlisted_and_ignores_unknown_ids() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.40.1.0/24" }));
    let pods = ["a", "b", "c", "d"].map(pod);
    let ips: Vec<IpAddr> = pods
        .iter()
        .map(|p| e.add(&conf, &format!("c-{}", p.name), p))
        .collect();
    // d has a second interface, which the list does not name.
    let ip_d1 = result_ip(
        &e.p.run(&Call::add("c-d", &conf).pod(&pods[3]).ifname("net1"))
            .ok(),
    );
    let anon_kept = result_ip(&e.p.run(&Call::add("c-anon-kept", &conf)).ok());
    let anon_gone = result_ip(&e.p.run(&Call::add("c-anon-gone", &conf)).ok());
    let before = snapshot(&e.net());
    let name_of = |ip: IpAddr| e.state().by_ip(ip).unwrap().0.clone();
    let kept_names = [ips[0], ips[2], ips[3], anon_kept].map(name_of);

    let valid = with_valid(
        &conf,
        &[
            ("c-a", "eth0"),
            ("c-c", "eth0"),
            ("c-d", "eth0"),
            ("c-anon-kept", "eth0"),
            // Unknown to the plugin: nothing is created for them.
            ("c-unknown", "eth0"),
            ("c-b", "eth9"),
        ],
    );
    e.p.run(&gc_call(&valid)).ok_empty();

    let after = snapshot(&e.net());
    for name in &kept_names {
        assert_eq!(
            before.get(name),
            after.get(name),
            "{name} is listed: GC must not touch it"
        );
    }
    let st = e.state();
    assert!(!st.sticky(ips[1]).attached, "c-b/eth0 is not listed");
    assert!(
        !st.sticky(ip_d1).attached,
        "c-d/net1 is not listed (c-d/eth0 is)"
    );
    assert!(st.by_ip(anon_gone).is_none(), "unlisted anonymous record");
    assert!(st.attached_to("c-unknown").is_empty());
    assert_eq!(st.records.len(), 6, "nothing created or lost: {st:?}");

    // GC is idempotent: the same list again changes no record.
    let records = |s: &Snapshot| -> Vec<(String, Vec<u8>)> {
        s.iter()
            .filter(|(k, _)| k.contains('_') && !k.starts_with("last_reserved"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let once = snapshot(&e.net());
    e.p.run(&gc_call(&valid)).ok_empty();
    assert_eq!(records(&once), records(&snapshot(&e.net())));

    // b comes back on its address.
    assert_eq!(e.add(&conf, "c-b2", &pods[1]), ips[1]);
}

#[test]
fn gc_with_a_null_list_is_gc_with_an_empty_one() {
    // CRI-O (ocicni) hands libcni a nil slice for a network without a live pod, and libcni
    // sends it as `null`: nothing is valid, exactly as with `[]`.
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.40.4.0/24" }));
    let ip_a = e.add(&conf, "c-a", &pod("a"));
    let ip_anon = result_ip(&e.p.run(&Call::add("c-anon", &conf)).ok());
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        e.p.run(&gc_call(&conf.clone().top(key, Value::Null)))
            .ok_empty();
    }
    let st = e.state();
    assert!(!st.sticky(ip_a).attached, "{st:?}");
    assert!(st.by_ip(ip_anon).is_none(), "{st:?}");
}

#[test]
fn gc_accepts_libcni_attachments_key_too() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.40.2.0/24" }));
    let ip_a = e.add(&conf, "c-a", &pod("a"));
    let ip_b = e.add(&conf, "c-b", &pod("b"));
    let gc = conf.clone().top(
        "cni.dev/attachments",
        json!([{ "containerID": "c-a", "ifname": "eth0" }]),
    );
    e.p.run(&gc_call(&gc)).ok_empty();
    let st = e.state();
    assert!(st.sticky(ip_a).attached);
    assert!(!st.sticky(ip_b).attached);
}

#[test]
fn gc_without_a_list_or_with_a_malformed_one_is_refused_and_changes_nothing() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.40.3.0/24" }));
    e.add(&conf, "c-a", &pod("a"));
    e.p.run(&Call::add("c-anon", &conf)).ok();
    let before = snapshot(e.dir.path());
    let cases: Vec<(&str, Conf, u64)> = vec![
        ("no list at all", conf.clone(), 7),
        (
            "list is a string",
            conf.clone().top("cni.dev/valid-attachments", json!("all")),
            7,
        ),
        (
            "entry without ifname",
            conf.clone().top(
                "cni.dev/valid-attachments",
                json!([{ "containerID": "c-a" }]),
            ),
            7,
        ),
        (
            "entry of the wrong type",
            conf.clone().top("cni.dev/valid-attachments", json!([7])),
            7,
        ),
        (
            "GC under cniVersion 1.0.0",
            with_valid(&conf, &[]).version("1.0.0"),
            1,
        ),
    ];
    for (what, c, code) in cases {
        let out = e.p.run(&gc_call(&c));
        assert_eq!(out.err_code(), code, "{what}: {}", out.stderr);
        assert_same(&before, &snapshot(e.dir.path()), what);
    }
}

#[test]
fn disable_gc_makes_gc_a_no_op() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.40.4.0/24" }));
    e.add(&conf, "c-a", &pod("a"));
    e.p.run(&Call::add("c-anon", &conf)).ok();
    let before = snapshot(e.dir.path());
    let off = with_valid(&conf, &[]).top("disableGC", json!(true));
    e.p.run(&gc_call(&off)).ok_empty();
    assert_same(&before, &snapshot(e.dir.path()), "GC with disableGC: true");
    // The same GC with disableGC: false does release.
    let on = with_valid(&conf, &[]).top("disableGC", json!(false));
    e.p.run(&gc_call(&on)).ok_empty();
    assert!(e.state().attached_to("c-a").is_empty());
}

/// A data dir with a, b attached and a record name that cannot be read (a directory).
fn with_unreadable_record(e: &Env, conf: &Conf) -> (IpAddr, IpAddr) {
    let ip_a = e.add(conf, "c-a", &pod("a"));
    let ip_b = e.add(conf, "c-b", &pod("b"));
    std::fs::create_dir(e.net().join("10.40.5.200_ns_broken")).unwrap();
    (ip_a, ip_b)
}

/// GC releases every other attachment and leaves the unreadable record held: not removed,
/// not an error (it may be a live pod's lease that this version cannot read).
fn assert_gc_kept_going(e: &Env, conf: &Conf, ip_a: IpAddr, ip_b: IpAddr) {
    let out = e.p.run(&gc_call(&with_valid(conf, &[])));
    let held = e.net().join("10.40.5.200_ns_broken").is_dir();
    std::fs::remove_dir(e.net().join("10.40.5.200_ns_broken")).unwrap();
    out.ok_empty();
    assert!(held, "GC removed a record it could not read");
    let st = e.state();
    assert!(
        !st.sticky(ip_a).attached && !st.sticky(ip_b).attached,
        "GC stopped at the unreadable record"
    );
}

#[test]
fn gc_holds_an_unreadable_record_and_releases_the_rest() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.40.5.0/24" }));
    // One release first, so the release counter exists.
    e.add(&conf, "c-z", &pod("z"));
    e.del(&conf, "c-z", &pod("z"));
    let (ip_a, ip_b) = with_unreadable_record(&e, &conf);
    assert_gc_kept_going(&e, &conf, ip_a, ip_b);
}

/// The same before the first release ever (no `release_seq` file yet): the design says an
/// unreadable record is tolerated, never fatal.
#[test]
fn gc_holds_an_unreadable_record_before_any_release() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.40.5.0/24" }));
    let (ip_a, ip_b) = with_unreadable_record(&e, &conf);
    assert!(!e.net().join("release_seq").exists());
    assert_gc_kept_going(&e, &conf, ip_a, ip_b);
}

/// Same root as above, seen from DEL: DEL is best-effort and must release its own lease even
/// when another pod's record cannot be read.
#[test]
fn del_releases_its_lease_despite_an_unreadable_record_of_another_pod() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.40.6.0/24" }));
    let ip_a = e.add(&conf, "c-a", &pod("a"));
    std::fs::create_dir(e.net().join("10.40.6.200_ns_broken")).unwrap();
    let out = e.p.run(&Call::del("c-a", &conf).pod(&pod("a")));
    std::fs::remove_dir(e.net().join("10.40.6.200_ns_broken")).unwrap();
    out.ok_empty();
    assert!(!e.state().sticky(ip_a).attached);
}

// ---------------------------------------------------------------------------------------------
// STATUS

#[test]
fn status_is_ready_with_free_addresses_and_changes_nothing() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.41.0.0/24" }));
    // Ready before the data dir exists and after it holds records.
    e.p.run(&status_call(&conf.bytes())).ok_empty();
    e.add(&conf, "c-a", &pod("a"));
    let before = snapshot(e.dir.path());
    e.p.run(&status_call(&conf.bytes())).ok_empty();
    let strict = conf.clone().ipam("statusFailsWhenFull", json!(true));
    e.p.run(&status_call(&strict.bytes())).ok_empty();
    assert_same(&before, &snapshot(e.dir.path()), "STATUS");
}

#[test]
fn status_counts_a_released_lease_as_room_only_when_new_pods_may_reclaim_it() {
    let e = Env::new();
    let range =
        json!({ "subnet": "10.41.2.0/24", "rangeStart": "10.41.2.10", "rangeEnd": "10.41.2.11" });
    let conf = e.conf(range).ipam("statusFailsWhenFull", json!(true));
    let refuse = conf.clone().ipam("whenExhausted", json!("refuse"));
    e.add(&conf, "c-a", &pod("a"));
    e.add(&conf, "c-b", &pod("b"));
    e.p.run(&Call::del("c-a", &conf).pod(&pod("a"))).ok_empty();
    // Reclaim: a new pod would get a's released lease.
    e.p.run(&status_call(&conf.bytes())).ok_empty();
    // Refuse: a new pod gets 100, so the range is full.
    assert_eq!(
        e.p.run(&Call::add("c-n", &refuse).pod(&pod("n")))
            .err_code(),
        100
    );
    e.p.run(&status_call(&refuse.bytes())).expect_code(50);
}

#[test]
fn status_fails_on_a_full_range_only_when_asked_to() {
    let e = Env::new();
    let range =
        json!({ "subnet": "10.41.1.0/24", "rangeStart": "10.41.1.10", "rangeEnd": "10.41.1.12" });
    let conf = e.conf(range);
    let strict = conf.clone().ipam("statusFailsWhenFull", json!(true));
    for name in ["a", "b", "c"] {
        e.add(&conf, &format!("c-{name}"), &pod(name));
    }
    // Full: a new pod cannot be served.
    assert_eq!(
        e.p.run(&Call::add("c-d", &conf).pod(&pod("d"))).err_code(),
        100
    );
    let before = snapshot(e.dir.path());
    // Default: a full range is not "not ready" (pods holding leases can still come back).
    e.p.run(&status_call(&conf.bytes())).ok_empty();
    let out = e.p.run(&status_call(&strict.bytes()));
    out.expect_code(50);
    let msg = out.json.as_ref().unwrap()["msg"].as_str().unwrap();
    assert!(msg.contains("full"), "message names the cause: {msg}");
    assert_same(&before, &snapshot(e.dir.path()), "STATUS on a full range");

    // A released lease can be reclaimed (default policy): ready again.
    e.del(&conf, "c-b", &pod("b"));
    e.p.run(&status_call(&strict.bytes())).ok_empty();
}

#[test]
fn status_fails_with_50_when_the_data_dir_is_not_a_directory() {
    let e = Env::new();
    let file = e.dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let conf = Conf::new(NET, &file, json!([[{ "subnet": "10.41.2.0/24" }]])).version("1.1.0");
    let out = e.p.run(&status_call(&conf.bytes()));
    out.expect_code(50);
    let msg = out.json.as_ref().unwrap()["msg"].as_str().unwrap();
    assert!(
        msg.contains("data dir") && msg.contains("plain-file"),
        "message names the cause and the path: {msg}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
#[ignore = "needs root: a read-only bind mount inside unshare -m"]
fn status_fails_with_50_on_a_read_only_data_dir() {
    assert_root("a read-only bind mount inside unshare -m");
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.41.3.0/24" }));
    e.add(&conf, "c-a", &pod("a"));
    let data = e.data();
    let d = data.display();
    let ro = Plugin {
        bin: sticky_bin(),
        wrapper: vec![
            "unshare".into(),
            "-m".into(),
            "sh".into(),
            "-c".into(),
            format!("mount --bind '{d}' '{d}' && mount -o remount,bind,ro '{d}' && exec \"$0\""),
        ],
    };
    let before = snapshot(e.dir.path());
    let out = ro.run(&status_call(&conf.bytes()));
    out.expect_code(50);
    let msg = out.json.as_ref().unwrap()["msg"].as_str().unwrap();
    assert!(
        msg.contains("data dir") && msg.contains("Read-only file system"),
        "message names the cause: {msg}"
    );
    // The same data dir writable again: ready.
    e.p.run(&status_call(&conf.bytes())).ok_empty();
    assert_same(&before, &snapshot(e.dir.path()), "STATUS");
}

#[test]
fn status_fails_with_50_on_an_invalid_ipam_config() {
    let e = Env::new();
    let base = e.conf(json!({ "subnet": "10.41.4.0/24" }));
    let ipam = |v: Value| {
        let mut c = base.clone();
        c.value["ipam"] = v;
        c.value["ipam"]["dataDir"] = json!(e.data());
        c
    };
    let cases: Vec<(&str, Conf)> = vec![
        ("no ipam section", base.clone().top("ipam", Value::Null)),
        ("no ranges", ipam(json!({ "type": "sticky-ipam" }))),
        (
            "bad leaseHold",
            base.clone().ipam("leaseHold", json!("soon")),
        ),
        (
            "bad whenExhausted",
            base.clone().ipam("whenExhausted", json!("maybe")),
        ),
        (
            "relative dataDir",
            base.clone().ipam("dataDir", json!("rel")),
        ),
        (
            "subnet not a string",
            base.clone().ipam("ranges", json!([[{ "subnet": 7 }]])),
        ),
        (
            "overlapping range sets",
            base.clone().ipam(
                "ranges",
                json!([[{ "subnet": "10.41.4.0/24" }], [{ "subnet": "10.41.0.0/16" }]]),
            ),
        ),
    ];
    for (what, c) in cases {
        let out = e.p.run(&status_call(&c.bytes()));
        assert_eq!(out.err_code(), 50, "{what}: {}", out.stderr);
        let msg = out.json.as_ref().unwrap()["msg"].as_str().unwrap();
        assert!(
            msg.contains("config"),
            "{what}: message names the cause: {msg}"
        );
    }
    assert!(!e.data().exists(), "a refused STATUS created the data dir");
}

/// The design: STATUS fails with 50 when the config is invalid — the network-level part of
/// the config (name, cniVersion type) included, not only the `ipam` section.
#[test]
fn status_fails_with_50_on_an_invalid_network_config() {
    let e = Env::new();
    let base = e.conf(json!({ "subnet": "10.41.5.0/24" }));
    let mut no_name = base.clone();
    no_name.value.as_object_mut().unwrap().remove("name");
    let cases: Vec<(&str, Conf)> = vec![
        ("no network name", no_name),
        (
            "network name escapes",
            base.clone().top("name", json!("../x")),
        ),
    ];
    for (what, c) in cases {
        let out = e.p.run(&status_call(&c.bytes()));
        assert_eq!(
            out.err_code(),
            50,
            "{what}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

#[test]
fn status_under_an_older_cni_version_is_refused() {
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.41.6.0/24" })).version("1.0.0");
    e.p.run(&status_call(&conf.bytes())).expect_code(1);
}

// ---------------------------------------------------------------------------------------------
// Lease expiry (leaseHold) on the lease clock

/// A data dir on lease-clock time 100000 (wall = now) with: `old` released at 0, `recent`
/// released at 99000, `live` attached. Returns their addresses.
fn seed_expiry(e: &Env) -> (IpAddr, IpAddr, IpAddr) {
    let net = e.net();
    let (old, recent, live) = (ip("10.42.0.2"), ip("10.42.0.3"), ip("10.42.0.4"));
    seed_sticky(&net, old, &lease("old", false, 1, 0));
    seed_sticky(&net, recent, &lease("recent", false, 2, 99_000));
    seed_sticky(&net, live, &lease("live", true, 0, 0));
    std::fs::write(net.join("release_seq"), "2").unwrap();
    std::fs::write(net.join("boot_id"), current_boot_id()).unwrap();
    write_clock(&net, 100_000, wall_now(), None);
    (old, recent, live)
}

fn expiry_conf(e: &Env, hold: Option<&str>) -> Conf {
    let c = e.conf(json!({ "subnet": "10.42.0.0/24" }));
    match hold {
        Some(h) => c.ipam("leaseHold", json!(h)),
        None => c,
    }
}

#[test]
fn a_lease_released_longer_ago_than_the_hold_is_freed_at_add() {
    let e = Env::new();
    let (old, recent, live) = seed_expiry(&e);
    let conf = expiry_conf(&e, Some("1h"));
    let before = snapshot(&e.net());
    let name = |ip: IpAddr, p: &str| sticky_name(ip, "ns", p);

    let ip_n = e.add(&conf, "c-n", &pod("n"));
    assert!(ip_n != recent && ip_n != live, "{ip_n} was held");
    let after = snapshot(&e.net());
    assert!(
        !after.contains_key(&name(old, "old")),
        "released at 0, clock 100000, hold 3600: must be freed"
    );
    for n in [name(recent, "recent"), name(live, "live")] {
        assert_eq!(before.get(&n), after.get(&n), "{n} must be kept as is");
    }
    let (clock, _, next) = read_clock(&e.net());
    assert!(
        (100_000..100_000 + 3600).contains(&clock),
        "the clock advances from the seeded 100000: {clock}"
    );
    assert_eq!(next, Some(99_000 + 3600), "the next expiry is recent's");
    // The expired pod comes back as a new pod would: any free address, a fresh lease.
    let ip_old = e.add(&conf, "c-old2", &pod("old"));
    assert!(ip_old != recent && ip_old != live && ip_old != ip_n);
    e.state();
}

#[test]
fn without_lease_hold_released_leases_are_kept() {
    let e = Env::new();
    let (old, recent, _) = seed_expiry(&e);
    let conf = expiry_conf(&e, None);
    e.add(&conf, "c-n", &pod("n"));
    let st = e.state();
    assert!(!st.sticky(old).attached && !st.sticky(recent).attached);
    assert_eq!(e.add(&conf, "c-old2", &pod("old")), old);
}

#[test]
fn expiry_also_runs_at_gc() {
    let e = Env::new();
    let (old, recent, live) = seed_expiry(&e);
    let conf = expiry_conf(&e, Some("1h"));
    e.p.run(&gc_call(&with_valid(&conf, &[("c-live", "eth0")])))
        .ok_empty();
    let st = e.state();
    assert!(st.by_ip(old).is_none(), "expired lease kept by GC: {st:?}");
    assert!(!st.sticky(recent).attached);
    assert!(st.sticky(live).attached);
}

#[test]
fn a_wall_clock_jump_advances_the_lease_clock_by_at_most_an_hour() {
    let e = Env::new();
    let (_, recent, _) = seed_expiry(&e);
    // The last call ran ten years ago by the wall clock (an NTP catch-up on a box without an
    // RTC looks like this).
    write_clock(&e.net(), 100_000, wall_now() - 10 * 365 * 86_400, None);
    // recent: released at 99000, due at 106200 with a 2h hold.
    let conf = expiry_conf(&e, Some("2h"));
    e.add(&conf, "c-n", &pod("n"));
    let (clock, wall, _) = read_clock(&e.net());
    assert_eq!(clock, 100_000 + 3600, "the jump must be clamped to 3600 s");
    assert!(
        wall >= wall_now() - 86_400,
        "wall is the real clock now: {wall}"
    );
    assert!(
        !e.state().sticky(recent).attached,
        "a clamped jump must not expire recent"
    );
}

#[test]
fn a_wall_clock_going_back_does_not_move_the_lease_clock() {
    let e = Env::new();
    let (_, _, _) = seed_expiry(&e);
    let net = e.net();
    // Released at 97000: due at 100600 with a 1h hold.
    seed_sticky(&net, ip("10.42.0.5"), &lease("edge", false, 3, 97_000));
    std::fs::write(net.join("release_seq"), "3").unwrap();
    write_clock(&net, 100_000, wall_now() + 10 * 365 * 86_400, None);
    let conf = expiry_conf(&e, Some("1h"));
    e.add(&conf, "c-n", &pod("n"));
    let (clock, _, _) = read_clock(&net);
    assert_eq!(
        clock, 100_000,
        "the lease clock never runs backwards or forwards here"
    );
    assert!(
        !e.state().sticky(ip("10.42.0.5")).attached,
        "edge must be kept"
    );
}

#[test]
fn del_stamps_the_release_on_the_lease_clock_and_it_expires_after_the_hold() {
    let e = Env::new();
    let net = e.net();
    write_clock(&net, 100_000, wall_now(), None);
    let conf = e
        .conf(json!({ "subnet": "10.42.1.0/24" }))
        .ipam("leaseHold", json!("1h"));
    let ip_a = e.add(&conf, "c-a", &pod("a"));
    e.del(&conf, "c-a", &pod("a"));
    let released_at = e.state().sticky(ip_a).released_at;
    assert!(
        (100_000..100_000 + 3600).contains(&released_at),
        "releasedAt must be on the lease clock, not the wall clock: {released_at}"
    );
    let (_, _, next) = read_clock(&net);
    assert_eq!(
        next,
        Some(released_at + 3600),
        "the DEL sets the next expiry"
    );

    // 50 minutes later on the lease clock: kept.
    let (_, wall, next) = read_clock(&net);
    write_clock(&net, released_at + 3000, wall, next);
    e.add(&conf, "c-b", &pod("b"));
    assert!(
        !e.state().sticky(ip_a).attached,
        "freed before the hold ran out"
    );
    // An hour later: freed.
    let (_, wall, next) = read_clock(&net);
    write_clock(&net, released_at + 3600, wall, next);
    e.add(&conf, "c-c", &pod("c"));
    assert!(
        e.state().by_ip(ip_a).is_none(),
        "kept after the hold ran out"
    );
}

// ---------------------------------------------------------------------------------------------
// Earlier boots (root: a bind mount over the boot id inside `unshare -m`)

/// A plugin that sees `id` as the kernel's boot id.
fn booted(e: &Env, id: &str) -> Plugin {
    let file = e.dir.path().join(format!("boot-{id}"));
    std::fs::write(&file, format!("{id}\n")).unwrap();
    Plugin::sticky().with_boot_id(&file)
}

const BOOT1: &str = "b0000001-0000-4000-8000-000000000001";
const BOOT2: &str = "b0000002-0000-4000-8000-000000000002";

#[test]
#[ignore = "needs root: simulating a reboot with unshare -m and a bind mount"]
fn attachments_of_an_earlier_boot_become_released_leases_at_the_first_add() {
    assert_root("simulating a reboot with unshare -m and a bind mount");
    let e = Env::new();
    let range =
        json!({ "subnet": "10.43.0.0/24", "rangeStart": "10.43.0.10", "rangeEnd": "10.43.0.14" });
    let conf = e.conf(range);
    let (b1, b2) = (booted(&e, BOOT1), booted(&e, BOOT2));
    let ip_a = e.add_with(&b1, &conf, "c-a1", &pod("a"));
    let ip_b = e.add_with(&b1, &conf, "c-b1", &pod("b"));
    let anon = result_ip(&b1.run(&Call::add("c-anon", &conf)).ok());
    let anon_body = e.file(&anon.to_string()).unwrap();
    assert_eq!(e.state().sticky(ip_a).boot, BOOT1);
    assert_eq!(e.file("boot_id").as_deref(), Some(BOOT1.as_bytes()));

    // After the reboot, the first ADD (another pod) sweeps boot 1's attachments.
    let ip_c = e.add_with(&b2, &conf, "c-c2", &pod("c"));
    assert!(ip_c != ip_a && ip_c != ip_b, "{ip_c} was a lease");
    let st = e.state();
    for ip in [ip_a, ip_b] {
        let rec = st.sticky(ip);
        assert!(!rec.attached, "{ip} of boot 1 is still attached: {rec:?}");
        assert!(rec.release_seq > 0);
    }
    assert!(st.sticky(ip_c).attached);
    assert_eq!(e.file("boot_id").as_deref(), Some(BOOT2.as_bytes()));
    assert_eq!(
        e.file(&anon.to_string()).unwrap(),
        anon_body,
        "records without identity carry no boot: kept as they are"
    );

    // Once per boot: c (attached in boot 2) is not swept by later calls of boot 2.
    e.add_with(&b2, &conf, "c-d2", &pod("d"));
    assert!(e.state().sticky(ip_c).attached, "boot 2 swept twice");

    // The range (5 addresses) now holds a, b (released), anon, c, d: a new pod reclaims
    // the earliest released, which no live sandbox holds.
    let ip_e = e.add_with(&b2, &conf, "c-e2", &pod("e"));
    assert!(
        ip_e == ip_a || ip_e == ip_b,
        "{ip_e} is not a released lease"
    );
    let other = if ip_e == ip_a { ip_b } else { ip_a };
    let back = if ip_e == ip_a { pod("b") } else { pod("a") };
    // The pod whose lease was kept comes back with a new UID on its address.
    let again = Pod::new("ns", &back.name, "uid-new");
    assert_eq!(e.add_with(&b2, &conf, "c-back", &again), other);
    e.state();
}

#[test]
#[ignore = "needs root: simulating a boot id with unshare -m and a bind mount"]
fn in_the_same_boot_attached_leases_are_never_taken() {
    assert_root("simulating a boot id with unshare -m and a bind mount");
    let e = Env::new();
    let range =
        json!({ "subnet": "10.43.1.0/24", "rangeStart": "10.43.1.10", "rangeEnd": "10.43.1.11" });
    let conf = e.conf(range);
    let b1 = booted(&e, BOOT1);
    e.add_with(&b1, &conf, "c-a", &pod("a"));
    e.add_with(&b1, &conf, "c-b", &pod("b"));
    let before = snapshot(e.dir.path());
    b1.run(&Call::add("c-c", &conf).pod(&pod("c")))
        .expect_code(100);
    assert_same(&before, &snapshot(e.dir.path()), "refused ADD");
    // The same ADD after a reboot succeeds: boot 1's sandboxes are gone.
    let b2 = booted(&e, BOOT2);
    e.add_with(&b2, &conf, "c-c", &pod("c"));
}

#[test]
#[ignore = "needs root: simulating a reboot with unshare -m and a bind mount"]
fn gc_also_sweeps_an_earlier_boot_even_for_listed_containers() {
    assert_root("simulating a reboot with unshare -m and a bind mount");
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.43.2.0/24" }));
    let (b1, b2) = (booted(&e, BOOT1), booted(&e, BOOT2));
    let ip_a = e.add_with(&b1, &conf, "c-a1", &pod("a"));
    // No ADD after the reboot; GC comes first. A sandbox of boot 1 cannot be alive in boot 2,
    // whatever the runtime lists.
    b2.run(&gc_call(&with_valid(&conf, &[("c-a1", "eth0")])))
        .ok_empty();
    assert!(!e.state().sticky(ip_a).attached);
    assert_eq!(e.file("boot_id").as_deref(), Some(BOOT2.as_bytes()));
    // A pod attached in boot 2 and listed stays attached.
    let ip_b = e.add_with(&b2, &conf, "c-b2", &pod("b"));
    b2.run(&gc_call(&with_valid(&conf, &[("c-b2", "eth0")])))
        .ok_empty();
    assert!(e.state().sticky(ip_b).attached);
    assert_eq!(e.add_with(&b2, &conf, "c-a2", &pod("a")), ip_a);
}

#[test]
#[ignore = "needs root: simulating a boot id with unshare -m and a bind mount"]
fn an_unreadable_boot_id_never_judges_a_lease_to_be_from_an_earlier_boot() {
    assert_root("simulating a boot id with unshare -m and a bind mount");
    let e = Env::new();
    let conf = e.conf(json!({ "subnet": "10.43.3.0/24" }));
    let b1 = booted(&e, BOOT1);
    let ip_a = e.add_with(&b1, &conf, "c-a", &pod("a"));
    let empty = e.dir.path().join("boot-empty");
    std::fs::write(&empty, b"").unwrap();
    let unknown = Plugin::sticky().with_boot_id(&empty);
    let ip_b = e.add_with(&unknown, &conf, "c-b", &pod("b"));
    assert_ne!(ip_a, ip_b);
    assert!(
        e.state().sticky(ip_a).attached,
        "swept without knowing the boot"
    );
    // A different UID for a while attached: still refused to take over.
    let ip_a2 = e.add_with(&unknown, &conf, "c-a2", &Pod::new("ns", "a", "uid-other"));
    assert_ne!(ip_a2, ip_a, "two live sandboxes would share {ip_a}");
}

#[test]
#[ignore = "needs root: simulating a reboot with unshare -m and a bind mount"]
fn leases_released_by_the_boot_sweep_expire_after_the_hold() {
    assert_root("simulating a reboot with unshare -m and a bind mount");
    let e = Env::new();
    let net = e.net();
    let conf = e
        .conf(json!({ "subnet": "10.43.4.0/24" }))
        .ipam("leaseHold", json!("1h"));
    let (b1, b2) = (booted(&e, BOOT1), booted(&e, BOOT2));
    let ip_a = e.add_with(&b1, &conf, "c-a1", &pod("a"));
    // The reboot: the first ADD releases a (a never comes back).
    e.add_with(&b2, &conf, "c-b2", &pod("b"));
    let released_at = e.state().sticky(ip_a).released_at;
    // Two hours later on the lease clock, with no DEL or GC in between.
    let (_, wall, next) = read_clock(&net);
    write_clock(&net, released_at + 7200, wall, next);
    e.add_with(&b2, &conf, "c-c2", &pod("c"));
    assert!(
        e.state().by_ip(ip_a).is_none(),
        "a lease released by the boot sweep 2h ago with a 1h hold was kept (lease_clock {:?})",
        std::fs::read_to_string(net.join("lease_clock")).unwrap()
    );
}
