//! The way back: `sticky-ipam downgrade` rewrites a data dir into host-local's layout, and
//! Debian's host-local then works on it without handing out an address that is held.
//! Interrupted at every step (crash points), the data dir stays usable and a second run
//! finishes the job.

use sticky_testkit::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use support::*;

const NET: &str = "back";

fn run_cli(bin: &Path, args: &[&str], crash_at: Option<usize>) -> Output {
    let mut cmd = Command::new(bin);
    for var in RUNTIME_VARS {
        cmd.env_remove(var);
    }
    if let Some(n) = crash_at {
        cmd.env("STICKY_CRASH_AT", n.to_string());
    }
    cmd.args(args).output().expect("run sticky-ipam")
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = run_cli(&sticky_bin(), args, None);
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A populated sticky-ipam data dir: attached leases, released leases, host-local records
/// and an OpenYurt marker.
struct Seeded {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    sticky: Conf,
    /// Address → (container id, ifname) of every attachment: what must stay held.
    held: BTreeMap<IpAddr, (String, String)>,
    released: BTreeSet<IpAddr>,
}

impl Seeded {
    fn dir(&self) -> PathBuf {
        self.data.join(NET)
    }

    fn data_arg(&self) -> &str {
        self.data.to_str().unwrap()
    }

    /// The same network config with host-local as the IPAM plugin.
    fn host_local_conf(&self) -> Conf {
        self.sticky.clone().ipam("type", json!("host-local"))
    }
}

fn seeded() -> Seeded {
    let tmp = temp_dir();
    let data = tmp.path().join("data");
    // .2 .. .30 are assignable: 29 addresses.
    let conf = Conf::v4(NET, &data, "10.60.0.0/27");
    let p = Plugin::sticky();
    let mut held = BTreeMap::new();
    let mut released = BTreeSet::new();
    for i in 0..10 {
        let pod = Pod::new("ns", &format!("p{i}"), &format!("u{i}"));
        let cid = format!("sticky{i}");
        let a = result_ip(&p.run(&Call::add(&cid, &conf).pod(&pod)).ok());
        if i % 3 == 0 {
            p.run(&Call::del(&cid, &conf).pod(&pod)).ok_empty();
            released.insert(a);
        } else {
            held.insert(a, (cid, "eth0".to_string()));
        }
    }
    for i in 0..3 {
        let cid = format!("anon{i}");
        let a = result_ip(&p.run(&Call::add(&cid, &conf).ifname("net1")).ok());
        held.insert(a, (cid, "net1".to_string()));
    }
    // An OpenYurt marker alone: a reservation host-local cannot express.
    std::fs::write(data.join(NET).join("10.60.0.29_kube-system_coredns"), "").unwrap();
    released.insert(ip("10.60.0.29"));
    Seeded {
        _tmp: tmp,
        data,
        sticky: conf,
        held,
        released,
    }
}

/// Asserts the network dir is exactly host-local's layout holding `held`.
fn assert_host_local_layout(dir: &Path, held: &BTreeMap<IpAddr, (String, String)>) {
    let mut seen = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name == "lock" || name.starts_with("last_reserved_ip.") {
            continue;
        }
        let a: IpAddr = name
            .parse()
            .unwrap_or_else(|_| panic!("{name}: not in host-local's layout"));
        let body = std::fs::read_to_string(dir.join(&name)).unwrap();
        let (cid, ifname) = body
            .split_once("\r\n")
            .unwrap_or_else(|| panic!("{name}: body {body:?} is not <id>\\r\\n<ifname>"));
        seen.insert(a, (cid.to_string(), ifname.to_string()));
    }
    assert_eq!(&seen, held, "host-local records");
}

#[test]
fn downgrade_then_host_local_never_hands_out_a_held_address() {
    let s = seeded();
    let d = s.data_arg();
    let before = snapshot(&s.data);

    // Released leases and the marker block the downgrade: listed, nothing changed, exit 3.
    let (code, out, err) = cli(&["--data-dir", d, "downgrade", "--json"]);
    assert_eq!(code, 3, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let refused: BTreeSet<IpAddr> = v["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["ip"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(refused, s.released);
    assert!(err.contains("--drop-leases"), "{err}");
    let (code, out, _) = cli(&["--data-dir", d, "--network", NET, "downgrade"]);
    assert_eq!(code, 3);
    assert!(
        out.contains("released lease") && out.contains("OpenYurt marker"),
        "{out}"
    );
    assert_same(&before, &snapshot(&s.data), "refused downgrade");

    let (code, out, err) = cli(&["--data-dir", d, "downgrade", "--drop-leases", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["converted"].as_array().unwrap().len(), 6);
    assert_eq!(v["dropped"].as_array().unwrap().len(), s.released.len());
    assert_eq!(v["kept"], 3);
    assert_eq!(v["converted"][0]["containerId"], "sticky1");
    assert_host_local_layout(&s.dir(), &s.held);
    // Run again: nothing left to do, the layout is unchanged.
    let (code, out, _) = cli(&["--data-dir", d, "downgrade"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("0 lease(s) converted, 0 record(s) dropped, 9 host-local"),
        "{out}"
    );
    assert_host_local_layout(&s.dir(), &s.held);

    // Debian's host-local on the converted dir: every free address once, no held one.
    let hl = host_local_bin();
    let hl = Plugin::at(hl);
    let conf = s.host_local_conf();
    let free = 29 - s.held.len();
    let mut got = BTreeSet::new();
    for i in 0..free {
        let out = hl.run(&Call::add(&format!("hl{i}"), &conf));
        let a = result_ip(&out.ok());
        assert!(!s.held.contains_key(&a), "host-local handed out held {a}");
        assert!(got.insert(a), "host-local handed out {a} twice");
    }
    let full = hl.run(&Call::add("hl-full", &conf));
    assert!(
        !full.status.success(),
        "the range is full: held addresses stay held"
    );

    // DEL by container id through host-local releases a converted record.
    let (&converted, (cid, ifname)) = s.held.iter().find(|(_, (c, _))| c == "sticky1").unwrap();
    hl.run(&Call::del(cid, &conf).ifname(ifname)).ok_empty();
    assert!(!s.dir().join(converted.to_string()).exists());
    let again = result_ip(&hl.run(&Call::add("hl-again", &conf)).ok());
    assert_eq!(again, converted, "the only free address");
}

#[test]
fn table_output_names_what_was_converted_and_dropped() {
    let s = seeded();
    let (code, out, _) = cli(&["--data-dir", s.data_arg(), "downgrade", "--drop-leases"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with(&format!(
        "network {NET}: 6 lease(s) converted, {} record(s) dropped, 3 host-local record(s) kept",
        s.released.len()
    )));
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let header = rows
        .iter()
        .position(|r| r[..] == ["IP", "POD", "CONTAINER", "IFNAME"]);
    assert!(header.is_some(), "{out}");
    for (a, (cid, _)) in s.held.iter().filter(|(_, (c, _))| c.starts_with("sticky")) {
        let text = a.to_string();
        assert!(
            rows.iter()
                .any(|r| r.first() == Some(&text.as_str()) && r.contains(&cid.as_str())),
            "{a} {cid} not listed:\n{out}"
        );
    }
    assert!(
        out.contains("kube-system/coredns  OpenYurt marker"),
        "{out}"
    );
    assert!(out.contains("\"type\": \"host-local\""));
    for f in ["release_seq", "boot_id", "lease_clock", "sticky_counters"] {
        assert!(!s.dir().join(f).exists(), "{f} left behind");
    }
    assert!(s.dir().join("lock").exists() && s.dir().join("last_reserved_ip.0").exists());
}

#[test]
fn interrupted_downgrade_keeps_every_address_held_and_a_rerun_finishes() {
    let crash = crash_bin_path();
    let mut n = 1;
    loop {
        assert!(n < 200, "downgrade never finished without crashing");
        let s = seeded();
        let d = s.data_arg();
        let out = run_cli(
            &crash,
            &["--data-dir", d, "downgrade", "--drop-leases"],
            Some(n),
        );
        if out.status.success() {
            assert_host_local_layout(&s.dir(), &s.held);
            break;
        }
        assert_eq!(
            out.status.code(),
            None,
            "step {n}: killed by abort, not an error"
        );

        // Half-converted: sticky-ipam still reads one record per address and every held
        // address is still held by its container.
        let (code, listing, err) = cli(&["--data-dir", d, "list", "--json"]);
        assert_eq!(code, 0, "step {n}: {err}");
        let rows: Value = serde_json::from_str(&listing).unwrap();
        let mut listed = BTreeMap::new();
        for row in rows.as_array().unwrap() {
            let a: IpAddr = row["ip"].as_str().unwrap().parse().unwrap();
            assert!(
                listed.insert(a, row.clone()).is_none(),
                "step {n}: {a} twice"
            );
        }
        for (a, (cid, _)) in &s.held {
            let row = listed
                .get(a)
                .unwrap_or_else(|| panic!("step {n}: {a} no longer held"));
            assert_eq!(row["containerId"], cid.as_str(), "step {n}");
            assert!(
                ["attached", "host-local"].contains(&row["state"].as_str().unwrap()),
                "step {n}: {row}"
            );
        }
        // Running it again finishes the job.
        let (code, out, err) = cli(&["--data-dir", d, "downgrade", "--drop-leases"]);
        assert_eq!(code, 0, "step {n}: {out}{err}");
        assert_host_local_layout(&s.dir(), &s.held);
        n += 1;
    }
    assert!(
        n > 10,
        "only {n} crash points were reached: is the feature on?"
    );
}

#[test]
fn a_lease_beside_its_own_host_local_record_is_one_attachment() {
    // The state a crash between "create <ip>" and "remove the lease" leaves.
    let s = seeded();
    let (a, (cid, _)) = s
        .held
        .iter()
        .find(|(_, (c, _))| c == "sticky2")
        .map(|(a, v)| (*a, v.clone()))
        .unwrap();
    std::fs::write(s.dir().join(a.to_string()), format!("{cid}\r\neth0")).unwrap();
    // sticky-ipam treats the pair as the lease: the pod comes back to it; nobody else gets it.
    let p = Plugin::sticky();
    let other = result_ip(&p.run(&Call::add("newcomer", &s.sticky)).ok());
    assert_ne!(other, a);
    let (code, out, _) = cli(&["--data-dir", s.data_arg(), "downgrade", "--drop-leases"]);
    assert_eq!(code, 0, "{out}");
    let mut held = s.held.clone();
    held.insert(other, ("newcomer".into(), "eth0".into()));
    assert_host_local_layout(&s.dir(), &held);
}
