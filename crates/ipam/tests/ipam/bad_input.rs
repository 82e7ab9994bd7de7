//! Untrusted input: every refusal has the right exit status and error code and leaves the data
//! dir byte-for-byte unchanged; hostile pod names are not errors but stay inside the data dir.

use sticky_testkit::support;

use std::path::PathBuf;

use serde_json::{Value, json};
use support::*;

const NET: &str = "bad";

/// A data dir holding one attached lease, one released lease and one record without identity.
/// The data dir is `<tmp>/data`, so a file escaping it is still inside the snapshot of `<tmp>`.
fn populated() -> (tempfile::TempDir, PathBuf, Conf) {
    let tmp = temp_dir();
    let data = tmp.path().join("data");
    let conf = Conf::v4(NET, &data, "10.30.0.0/24");
    let p = Plugin::sticky();
    let a = Pod::new("ns", "a", "uid-a");
    let b = Pod::new("ns", "b", "uid-b");
    p.run(&Call::add("ca", &conf).pod(&a)).ok();
    p.run(&Call::add("cb", &conf).pod(&b)).ok();
    p.run(&Call::del("cb", &conf).pod(&b)).ok_empty();
    p.run(&Call::add("cn", &conf)).ok();
    check_dir(&data.join(NET), COMPLETED);
    (tmp, data, conf)
}

fn with_ipam(conf: &Conf, ipam: Value) -> Vec<u8> {
    let mut c = conf.clone();
    let dd = c.value["ipam"]["dataDir"].clone();
    c.value["ipam"] = ipam;
    c.value["ipam"]["dataDir"] = dd;
    c.value["ipam"]["type"] = json!("sticky-ipam");
    c.bytes()
}

fn with_top(conf: &Conf, key: &str, v: Value) -> Vec<u8> {
    conf.clone().top(key, v).bytes()
}

#[test]
fn bad_inputs_are_refused_with_the_right_code_and_change_nothing() {
    let (tmp, _data, conf) = populated();
    let good = conf.bytes();
    let pod = Pod::new("ns", "new", "uid-new");
    let add = |stdin: &[u8]| Call::new("ADD", "cnew", stdin).pod(&pod);
    let unset = |mut c: Call, var: &str| {
        match var {
            "CNI_CONTAINERID" => c.container_id = None,
            "CNI_IFNAME" => c.ifname = None,
            "CNI_NETNS" => c.netns = None,
            _ => unreachable!(),
        }
        c
    };
    let ranges = |r: Value| with_ipam(&conf, json!({ "ranges": r }));
    let cases: Vec<(&str, Call, u64)> = vec![
        ("malformed JSON", add(b"{\"cniVersion\": \"1.0.0\", "), 6),
        ("not JSON at all", add(b"\x00\xffgarbage"), 6),
        ("JSON array", add(b"[]"), 6),
        ("empty stdin", add(b""), 6),
        (
            "unknown cniVersion",
            add(&with_top(&conf, "cniVersion", json!("0.5.0"))),
            1,
        ),
        (
            "cniVersion not a string",
            add(&with_top(&conf, "cniVersion", json!(1))),
            7,
        ),
        (
            "CHECK under 0.3.1",
            Call::new(
                "CHECK",
                "ca",
                &with_top(&conf, "cniVersion", json!("0.3.1")),
            ),
            1,
        ),
        (
            "empty CNI_COMMAND",
            {
                let mut c = add(&good);
                c.command = String::new();
                c.extra_env.push(("CNI_COMMAND".into(), String::new()));
                c
            },
            4,
        ),
        (
            "unknown CNI_COMMAND",
            {
                let mut c = add(&good);
                c.command = "add".into();
                c
            },
            4,
        ),
        (
            "missing CNI_CONTAINERID",
            unset(add(&good), "CNI_CONTAINERID"),
            4,
        ),
        ("missing CNI_IFNAME", unset(add(&good), "CNI_IFNAME"), 4),
        (
            "missing CNI_NETNS on ADD",
            unset(add(&good), "CNI_NETNS"),
            4,
        ),
        (
            "missing CNI_NETNS on CHECK",
            unset(Call::new("CHECK", "ca", &good), "CNI_NETNS"),
            4,
        ),
        (
            "missing CNI_CONTAINERID on DEL",
            unset(Call::new("DEL", "ca", &good), "CNI_CONTAINERID"),
            4,
        ),
        ("container id ../x", Call::new("ADD", "../x", &good), 4),
        ("container id a/b", Call::new("ADD", "a/b", &good), 4),
        (
            "container id ../x on DEL",
            Call::new("DEL", "../ca", &good),
            4,
        ),
        (
            "container id with a space",
            Call::new("DEL", "c a", &good),
            4,
        ),
        (
            "container id starting with -",
            Call::new("ADD", "-ca", &good),
            4,
        ),
        ("ifname too long", add(&good).ifname("eth0123456789012"), 4),
        ("ifname with /", add(&good).ifname("a/b"), 4),
        ("ifname ..", add(&good).ifname(".."), 4),
        (
            "network name with /",
            add(&with_top(&conf, "name", json!("a/b"))),
            7,
        ),
        (
            "network name ..",
            add(&with_top(&conf, "name", json!(".."))),
            7,
        ),
        (
            "network name ../escape",
            add(&with_top(&conf, "name", json!("../escape"))),
            7,
        ),
        (
            "network name missing",
            add(&{
                let mut c = conf.clone();
                c.value.as_object_mut().unwrap().remove("name");
                c.bytes()
            }),
            7,
        ),
        (
            "unknown CNI_ARGS key",
            Call::new("ADD", "cnew", &good).args("FOO=1"),
            4,
        ),
        (
            "unknown CNI_ARGS key beside pod args",
            Call::new("ADD", "cnew", &good).args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=x;FOO=1"),
            4,
        ),
        (
            "CNI_ARGS item without =",
            Call::new("ADD", "cnew", &good).args("IgnoreUnknown=1;novalue"),
            4,
        ),
        (
            "unknown CNI_ARGS key on DEL",
            Call::new("DEL", "ca", &good).args("FOO=1"),
            4,
        ),
        (
            "subnet garbage",
            add(&ranges(json!([[{"subnet": "banana"}]]))),
            7,
        ),
        (
            "subnet out of range",
            add(&ranges(json!([[{"subnet": "10.30.0.300/24"}]]))),
            7,
        ),
        (
            "/32 subnet",
            add(&ranges(json!([[{"subnet": "10.30.0.5/32"}]]))),
            7,
        ),
        (
            "/31 subnet",
            add(&ranges(json!([[{"subnet": "10.30.0.4/31"}]]))),
            7,
        ),
        (
            "/128 subnet",
            add(&ranges(json!([[{"subnet": "2001:db8::5/128"}]]))),
            7,
        ),
        (
            "overlapping ranges in one set",
            add(&ranges(
                json!([[{"subnet": "10.30.0.0/24"}, {"subnet": "10.30.0.128/25"}]]),
            )),
            7,
        ),
        (
            "overlapping ranges across sets",
            add(&ranges(
                json!([[{"subnet": "10.30.0.0/24"}], [{"subnet": "10.30.0.0/16"}]]),
            )),
            7,
        ),
        (
            "two families in one set",
            add(&ranges(
                json!([[{"subnet": "10.30.0.0/24"}, {"subnet": "2001:db8::/64"}]]),
            )),
            7,
        ),
        (
            "rangeStart outside subnet",
            add(&ranges(
                json!([[{"subnet": "10.30.0.0/24", "rangeStart": "10.31.0.10"}]]),
            )),
            7,
        ),
        (
            "rangeEnd outside subnet",
            add(&ranges(
                json!([[{"subnet": "10.30.0.0/24", "rangeEnd": "10.31.0.10"}]]),
            )),
            7,
        ),
        ("no ranges", add(&ranges(json!([]))), 7),
        (
            "no ipam section",
            add(&{
                let mut c = conf.clone();
                c.value.as_object_mut().unwrap().remove("ipam");
                c.bytes()
            }),
            7,
        ),
        (
            "whenExhausted unknown",
            add(&conf.clone().ipam("whenExhausted", json!("maybe")).bytes()),
            7,
        ),
        (
            "sticky not a bool",
            add(&conf.clone().ipam("sticky", json!("yes")).bytes()),
            7,
        ),
        (
            "prevResult garbage",
            Call::new(
                "CHECK",
                "ca",
                &with_top(&conf, "prevResult", json!({"ips": [{"address": "nope"}]})),
            ),
            6,
        ),
        (
            "requested IP outside the ranges",
            add(&with_top(
                &conf,
                "runtimeConfig",
                json!({"ips": ["10.99.0.5/24"]}),
            )),
            101,
        ),
        (
            "requested IP = gateway",
            add(&with_top(
                &conf,
                "runtimeConfig",
                json!({"ips": ["10.30.0.1"]}),
            )),
            101,
        ),
        (
            "requested IP = network address",
            add(&with_top(
                &conf,
                "args",
                json!({"cni": {"ips": ["10.30.0.0"]}}),
            )),
            101,
        ),
        (
            "requested IP held by a live pod",
            add(&with_top(
                &conf,
                "args",
                json!({"cni": {"ips": ["10.30.0.2"]}}),
            )),
            101,
        ),
        (
            "requested IP held by another pod's lease",
            Call::new("ADD", "cnew", &good)
                .args(format!("{};IP=10.30.0.3", pod.kubelet_args("cnew"))),
            101,
        ),
    ];
    let p = Plugin::sticky();
    let before = snapshot(tmp.path());
    let mut failures = Vec::new();
    for (what, call, code) in &cases {
        let out = p.run(call);
        let result = std::panic::catch_unwind(|| {
            out.expect_code(*code);
            // Refused before the store is opened: not even the lease clock moves.
            if *code == 101 {
                assert_same(&before, &snapshot(tmp.path()), what);
            } else {
                assert_same_strict(&before, &snapshot(tmp.path()), what);
            }
        });
        if let Err(e) = result {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!(
                "{what}: {msg}\n    stdout: {}\n    stderr: {}",
                String::from_utf8_lossy(&out.stdout).trim(),
                out.stderr.trim()
            ));
            // Keep the table independent: restore nothing, but report every row.
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad inputs were not refused as expected:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn without_cni_command_the_data_dir_is_untouched() {
    // Run without CNI_COMMAND the binary is an operator's tool; whatever it prints, it must
    // not treat stdin as a CNI call.
    let (tmp, _data, conf) = populated();
    let before = snapshot(tmp.path());
    let mut call = Call::add("cnew", &conf).pod(&Pod::new("ns", "x", "u"));
    call.command = String::new();
    let out = Plugin::sticky().run(&call);
    assert_same_strict(&before, &snapshot(tmp.path()), "call without CNI_COMMAND");
    if let Some(v) = &out.json {
        assert!(v.get("ips").is_none(), "allocated without CNI_COMMAND: {v}");
    }
}

#[test]
fn hostile_pod_names_work_and_stay_inside_the_data_dir() {
    let tmp = temp_dir();
    let data = tmp.path().join("data");
    let conf = Conf::v4(NET, &data, "10.31.0.0/24");
    let p = Plugin::sticky();
    let long_a = format!("{}a", "x".repeat(299));
    let long_b = format!("{}b", "x".repeat(299));
    let long_ns = "N".repeat(300);
    let names: Vec<(String, String)> = vec![
        ("default".into(), "a/b".into()),
        ("default".into(), "../../../etc/passwd".into()),
        ("..".into(), "..".into()),
        ("default".into(), "happy_turing".into()),
        ("default".into(), "50%off".into()),
        ("Default".into(), "UPPER".into()),
        ("default".into(), "web-0.x".into()),
        ("a_b".into(), "c".into()),
        ("a".into(), "b_c".into()),
        ("default".into(), "sp ace".into()),
        ("default".into(), "caf\u{e9}".into()),
        ("default".into(), long_a.clone()),
        ("default".into(), long_b.clone()),
        (long_ns.clone(), long_a.clone()),
    ];
    let mut ips = Vec::new();
    for (i, (ns, name)) in names.iter().enumerate() {
        let pod = Pod::new(ns, name, &format!("uid-{i}"));
        let r = p.run(&Call::add(&format!("c{i}"), &conf).pod(&pod)).ok();
        let a = result_ip(&r);
        assert!(!ips.contains(&a), "{ns}/{name}: {a} handed out twice");
        ips.push(a);
    }
    let check = || {
        let snap = snapshot(tmp.path());
        for key in snap.keys() {
            assert!(
                key == "data/" || key == &format!("data/{NET}/") || {
                    let rest = key.strip_prefix(&format!("data/{NET}/"));
                    rest.is_some_and(|r| !r.contains('/') && !r.is_empty())
                },
                "file outside the network directory: {key:?}"
            );
        }
        check_dir(&data.join(NET), COMPLETED)
    };
    let st = check();
    for (i, (ns, name)) in names.iter().enumerate() {
        let (file, rec) = st.by_ip(ips[i]).unwrap();
        let Record::Sticky(rec) = rec else {
            panic!("{ns}/{name}: not a sticky record: {rec:?}")
        };
        assert_eq!((&rec.namespace, &rec.pod), (ns, name), "names kept whole");
        if sticky_name(ips[i], ns, name).len() <= 255 {
            assert_eq!(file, &sticky_name(ips[i], ns, name));
        } else {
            assert!(file.len() <= 255 && file.contains('~'), "{file}");
        }
    }
    // Each is sticky on its own, including the long names that share a 299-byte prefix.
    for (i, (ns, name)) in names.iter().enumerate() {
        let pod = Pod::new(ns, name, &format!("uid-{i}"));
        p.run(&Call::del(&format!("c{i}"), &conf).pod(&pod))
            .ok_empty();
    }
    for (i, (ns, name)) in names.iter().enumerate().rev() {
        let pod = Pod::new(ns, name, &format!("uid2-{i}"));
        let r = p.run(&Call::add(&format!("d{i}"), &conf).pod(&pod)).ok();
        assert_eq!(
            result_ip(&r),
            ips[i],
            "{ns}/{name} did not get its lease back"
        );
    }
    let st = check();
    assert_eq!(st.records.len(), names.len());
}

#[test]
fn damaged_records_and_leftover_temp_files_are_tolerated() {
    let tmp = temp_dir();
    let data = tmp.path().join("data");
    let conf = Conf::new(
        NET,
        &data,
        json!([[{"subnet": "10.32.0.0/24", "rangeStart": "10.32.0.10", "rangeEnd": "10.32.0.15"}]]),
    );
    let net = data.join(NET);
    std::fs::create_dir_all(&net).unwrap();
    // An empty host-local record, a truncated lease, a lease of an unknown future format, and
    // a temp file left by a killed call.
    std::fs::write(net.join("10.32.0.10"), "").unwrap();
    std::fs::write(
        net.join("10.32.0.11_ns_trunc"),
        "{\"format\":\"sticky-ipam/v1\",\"cont",
    )
    .unwrap();
    std::fs::write(
        net.join("10.32.0.12_ns_future"),
        "{\"format\":\"sticky-ipam/v9\"}\n",
    )
    .unwrap();
    std::fs::write(net.join(".tmp.99999.1"), "half a record").unwrap();
    let p = Plugin::sticky();
    let mut got = Vec::new();
    for i in 0..3 {
        let pod = Pod::new("ns", &format!("p{i}"), &format!("u{i}"));
        let r = p.run(&Call::add(&format!("c{i}"), &conf).pod(&pod)).ok();
        got.push(result_ip(&r));
    }
    // Addresses whose record cannot be read are held, not handed out, while others are free.
    assert_eq!(
        got,
        ["10.32.0.13", "10.32.0.14", "10.32.0.15"].map(ip).to_vec()
    );
    assert!(
        !net.join(".tmp.99999.1").exists(),
        "leftover temp file not cleaned"
    );
    for i in 0..3 {
        let pod = Pod::new("ns", &format!("p{i}"), &format!("u{i}"));
        p.run(&Call::del(&format!("c{i}"), &conf).pod(&pod))
            .ok_empty();
    }
    p.run(&Call::del("nobody", &conf)).ok_empty();
    // The damaged files are not rewritten behind the operator's back.
    assert_eq!(std::fs::read(net.join("10.32.0.10")).unwrap(), b"");
    assert_eq!(
        std::fs::read(net.join("10.32.0.12_ns_future")).unwrap(),
        b"{\"format\":\"sticky-ipam/v9\"}\n"
    );
}

/// A data dir on a tmpfs of `size`, unmounted on drop.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn new(size: &str) -> SmallFs {
        let dir = temp_dir();
        sh(&[
            "mount",
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "sticky-test",
            dir.path().to_str().unwrap(),
        ]);
        SmallFs { dir }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

#[test]
#[ignore = "needs root: mounting a small tmpfs"]
fn a_full_disk_is_an_io_error_that_leaves_the_data_dir_consistent() {
    assert_root("mounting a small tmpfs");
    let fs = SmallFs::new("64k");
    let data = fs.dir.path().join("data");
    let conf = Conf::v4(NET, &data, "10.33.0.0/24");
    let p = Plugin::sticky();
    let a = Pod::new("ns", "a", "ua");
    let ip_a = result_ip(&p.run(&Call::add("ca", &conf).pod(&a)).ok());
    // Fill the file system.
    let filler = fs.dir.path().join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 1 << 20]);
    let before = snapshot(&data);
    let out = p.run(&Call::add("cb", &conf).pod(&Pod::new("ns", "b", "ub")));
    out.expect_code(5);
    let after = snapshot(&data);
    let st = check_dir(&data.join(NET), AFTER_KILL);
    assert_eq!(
        st.ips(),
        [ip_a].into_iter().collect(),
        "a partial allocation was left"
    );
    assert!(
        st.tmp_files.is_empty(),
        "temp files left on a full disk: {after:?}"
    );
    assert_same(&before, &after, "failed ADD on a full disk");
    // Space again: the same call works.
    std::fs::remove_file(&filler).unwrap();
    p.run(&Call::add("cb", &conf).pod(&Pod::new("ns", "b", "ub")))
        .ok();
    check_dir(&data.join(NET), COMPLETED);
}

#[test]
#[ignore = "needs root: a read-only bind mount"]
fn a_read_only_data_dir_is_an_io_error() {
    assert_root("a read-only bind mount");
    let tmp = temp_dir();
    let data = tmp.path().join("data");
    let conf = Conf::v4(NET, &data, "10.34.0.0/24");
    let p = Plugin::sticky();
    let a = Pod::new("ns", "a", "ua");
    p.run(&Call::add("ca", &conf).pod(&a)).ok();
    let d = data.to_str().unwrap();
    sh(&["mount", "--bind", d, d]);
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(d.to_string());
    sh(&["mount", "-o", "remount,bind,ro", d]);
    let before = snapshot(tmp.path());
    p.run(&Call::add("cb", &conf).pod(&Pod::new("ns", "b", "ub")))
        .expect_code(5);
    p.run(&Call::del("ca", &conf).pod(&a)).expect_code(5);
    assert_same_strict(
        &before,
        &snapshot(tmp.path()),
        "calls on a read-only data dir",
    );
}
