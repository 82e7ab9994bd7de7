//! The name index (`<network>/sticky-index/`) is derived data: a call that can trust it lists
//! nothing, and nothing can make it hand out an address a record holds — records written
//! behind its back right after a call, a damaged or missing bucket, a forged stamp, a
//! symlink in its place.

use sticky_testkit::support;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::json;
use support::*;

const NET: &str = "idx";

fn conf(data: &Path) -> Conf {
    Conf::new(NET, data, json!([[{"subnet": "10.62.0.0/16"}]]))
}

fn pod(i: usize) -> Pod {
    Pod::new("ns", &format!("p{i}"), &format!("uid-{i}"))
}

/// The address after `ip` in 10.62.0.0/16.
fn next(ip: std::net::IpAddr, n: u32) -> std::net::IpAddr {
    let std::net::IpAddr::V4(v4) = ip else {
        unreachable!()
    };
    std::net::IpAddr::V4((u32::from(v4) + n).into())
}

#[test]
fn records_written_right_after_a_call_are_never_handed_out() {
    let tmp = temp_dir();
    let c = conf(tmp.path());
    let net = tmp.path().join(NET);
    let p = Plugin::sticky();
    let mut foreign = BTreeSet::new();
    for i in 0..40 {
        let ip = result_ip(&p.run(&Call::add(&format!("c{i}"), &c).pod(&pod(i))).ok());
        assert!(check_index(&net), "call {i} left no trusted index");
        // What host-local and an older sticky-ipam write next, at once (same clock tick).
        let (a, b) = (next(ip, 1), next(ip, 2));
        std::fs::write(net.join(a.to_string()), format!("hl{i}\r\neth0")).unwrap();
        seed_sticky(&net, b, &released("old", &format!("o{i}"), 1000 + i as u64));
        foreign.extend([a, b]);
        let got = result_ip(
            &p.run(&Call::add(&format!("d{i}"), &c).pod(&pod(1000 + i)))
                .ok(),
        );
        assert!(
            !foreign.contains(&got),
            "round {i}: {got} handed out although a record written behind the index holds it"
        );
    }
    check_dir(&net, COMPLETED);
}

/// Every way the stored index can be wrong while its stamp still matches the directory.
#[test]
fn a_damaged_index_is_never_trusted() {
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 4] = [
        ("every bucket emptied", |ix| {
            for e in std::fs::read_dir(ix).unwrap() {
                let e = e.unwrap();
                if e.file_name() != "stamp" {
                    std::fs::write(e.path(), b"").unwrap();
                }
            }
        }),
        ("bucket files removed", |ix| {
            for e in std::fs::read_dir(ix).unwrap() {
                let e = e.unwrap();
                if e.file_name() != "stamp" {
                    std::fs::remove_file(e.path()).unwrap();
                }
            }
        }),
        ("stamp torn", |ix| {
            let s = std::fs::read(ix.join("stamp")).unwrap();
            std::fs::write(ix.join("stamp"), &s[..s.len() / 2]).unwrap();
        }),
        ("garbage in every bucket", |ix| {
            for e in std::fs::read_dir(ix).unwrap() {
                let e = e.unwrap();
                if e.file_name() != "stamp" {
                    std::fs::write(e.path(), b"10.62.99.99\n\xff\xfe\n").unwrap();
                }
            }
        }),
    ];
    for (what, damage) in damages {
        let tmp = temp_dir();
        let c = conf(tmp.path());
        let net = tmp.path().join(NET);
        let p = Plugin::sticky();
        let mut held = BTreeSet::new();
        for i in 0..20 {
            held.insert(result_ip(
                &p.run(&Call::add(&format!("c{i}"), &c).pod(&pod(i))).ok(),
            ));
        }
        // The round robin starts over, across every held address.
        std::fs::remove_file(net.join("last_reserved_ip.0")).unwrap();
        // Pod 3 leaves; its lease must still be found after the damage.
        let own = result_ip(&p.run(&Call::add("c3", &c).pod(&pod(3))).ok());
        p.run(&Call::del("c3", &c).pod(&pod(3))).ok_empty();
        assert!(check_index(&net));
        damage(&net.join(INDEX_DIR));
        let back = result_ip(&p.run(&Call::add("c3b", &c).pod(&pod(3))).ok());
        assert_eq!(back, own, "{what}: pod 3 lost its lease");
        for i in 100..110 {
            let got = result_ip(&p.run(&Call::add(&format!("n{i}"), &c).pod(&pod(i))).ok());
            assert!(!held.contains(&got), "{what}: {got} handed out twice");
            held.insert(got);
        }
        assert!(check_index(&net), "{what}: index not rebuilt");
        check_dir(&net, COMPLETED);
    }
}

#[test]
fn an_index_replaced_by_a_symlink_is_not_written_through() {
    let tmp = temp_dir();
    let c = conf(tmp.path());
    let net = tmp.path().join(NET);
    let p = Plugin::sticky();
    p.run(&Call::add("c0", &c).pod(&pod(0))).ok();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::remove_dir_all(net.join(INDEX_DIR)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, net.join(INDEX_DIR)).unwrap();
    let a = result_ip(&p.run(&Call::add("c1", &c).pod(&pod(1))).ok());
    let b = result_ip(&p.run(&Call::add("c2", &c).pod(&pod(2))).ok());
    assert_ne!(a, b);
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "wrote through the symlink"
    );
}

/// With a trusted index, ADD and DEL (a repeated DEL too) list nothing and open only their own
/// buckets and records, however many records exist.
#[test]
fn calls_list_nothing_when_the_index_holds() {
    assert_installed("strace", "strace");
    let tmp = temp_dir();
    let c = conf(tmp.path());
    let net = tmp.path().join(NET);
    for i in 0..3000u32 {
        let ip = std::net::IpAddr::V4(std::net::Ipv4Addr::new(
            10,
            62,
            (i / 250) as u8,
            (2 + i % 250) as u8,
        ));
        if i % 3 == 0 {
            std::fs::create_dir_all(&net).unwrap();
            std::fs::write(net.join(ip.to_string()), format!("hl{i}\r\neth0")).unwrap();
        } else {
            seed_sticky(
                &net,
                ip,
                &released("other", &format!("o{i}"), u64::from(i) + 1),
            );
        }
    }
    std::fs::write(net.join("boot_id"), current_boot_id()).unwrap();
    std::fs::write(net.join("release_seq"), "3000").unwrap();
    let p = Plugin::sticky();
    // The first call lists the directory and builds the index.
    p.run(&Call::add("c0", &c).pod(&pod(0))).ok();
    let log = tmp.path().join("strace.log");
    let traced = p.traced("openat,getdents64", &log);
    for call in [
        Call::add("c1", &c).pod(&pod(1)),
        Call::del("c1", &c).pod(&pod(1)),
        // kubelet's DEL again (StopPodSandbox, then RemovePodSandbox): the lease is released
        // already, and no host-local record can hold this attachment.
        Call::del("c1", &c).pod(&pod(1)),
        Call::add("c2", &c).pod(&pod(1)),
    ] {
        traced.run(&call).ok();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !text.contains("getdents64"),
            "{}: listed a directory",
            describe(&call)
        );
        let opened: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("openat("))
            .filter_map(|l| l.split('"').nth(1))
            .filter(|p| p.contains(NET))
            .collect();
        assert!(
            opened.len() <= 16,
            "{}: opened {} files: {opened:?}",
            describe(&call),
            opened.len()
        );
    }
    assert!(check_index(&net));
}
