//! sticky-ipam's allocation semantics, run as a runtime runs it: the built binary, `CNI_*`
//! env and the network config on stdin, one JSON on stdout.

use sticky_testkit::support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::*;

const NET: &str = "stk";

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

    fn data(&self) -> &Path {
        self.dir.path()
    }

    fn net(&self) -> PathBuf {
        self.dir.path().join(NET)
    }

    fn conf(&self, subnet: &str) -> Conf {
        Conf::v4(NET, self.data(), subnet)
    }

    fn add(&self, conf: &Conf, cid: &str, pod: &Pod) -> IpAddr {
        result_ip(&self.p.run(&Call::add(cid, conf).pod(pod)).ok())
    }

    fn del(&self, conf: &Conf, cid: &str, pod: &Pod) {
        self.p.run(&Call::del(cid, conf).pod(pod)).ok_empty();
    }

    fn state(&self) -> State {
        check_dir(&self.net(), COMPLETED)
    }
}

#[test]
fn del_then_add_with_a_new_container_id_gets_the_same_ip() {
    let e = Env::new();
    let conf = e.conf("10.22.0.0/24");
    let web0 = Pod::new("default", "web-0", "uid-a1");
    let ip_a = e.add(&conf, "c-a1", &web0);
    let ip_b = e.add(&conf, "c-b1", &Pod::new("default", "web-1", "uid-b1"));
    e.del(&conf, "c-a1", &web0);
    // releasedAt is on the data dir's lease clock (`lease_clock`: "<clock> <wall> <next>").
    let clock_text = std::fs::read_to_string(e.net().join("lease_clock")).unwrap();
    let clock: u64 = clock_text
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();

    let st = e.state();
    let rec = st.sticky(ip_a);
    assert!(!rec.attached, "DEL must keep the lease as released");
    assert_eq!(rec.container_id, "c-a1");
    assert_eq!(
        rec.released_at, clock,
        "releasedAt must be the lease clock at release: {rec:?}"
    );
    assert_eq!(
        st.by_ip(ip_a).unwrap().0,
        &sticky_name(ip_a, "default", "web-0")
    );

    // A new pod does not get the released lease while the range has free addresses.
    let ip_c = e.add(&conf, "c-c1", &Pod::new("default", "web-2", "uid-c1"));
    assert!(ip_c != ip_a && ip_c != ip_b, "{ip_c} handed out twice");

    // The pod recreated (new sandbox, new UID as a StatefulSet pod gets) has its IP back.
    let web0_again = Pod::new("default", "web-0", "uid-a2");
    assert_eq!(e.add(&conf, "c-a2", &web0_again), ip_a);
    let rec = e.state().sticky(ip_a);
    assert!(rec.attached);
    assert_eq!(rec.container_id, "c-a2");
    assert_eq!(rec.pod_uid, "uid-a2");
    assert_eq!(rec.boot, current_boot_id());
    assert_eq!(e.state().records.len(), 3);
}

#[test]
fn sticky_off_behaves_like_host_local() {
    let e = Env::new();
    let conf = e.conf("10.22.1.0/24").ipam("sticky", json!(false));
    let web0 = Pod::new("default", "web-0", "uid-a1");
    let ip1 = e.add(&conf, "c1", &web0);
    let st = e.state();
    assert!(
        matches!(st.by_ip(ip1), Some((n, Record::Plain { .. })) if *n == ip1.to_string()),
        "sticky:false must write host-local's <ip> record: {st:?}"
    );
    e.del(&conf, "c1", &web0);
    assert!(e.state().records.is_empty(), "DEL must free the address");
    let ip2 = e.add(&conf, "c2", &web0);
    assert_ne!(ip1, ip2, "sticky:false must not keep leases");
}

#[test]
fn new_sandbox_with_same_uid_takes_over_and_a_late_del_of_the_old_one_releases_nothing() {
    let e = Env::new();
    let conf = e.conf("10.22.2.0/24");
    let pod = Pod::new("kube-system", "coredns-x", "uid-1");
    let first = e.p.run(&Call::add("c1", &conf).pod(&pod)).ok();
    let ip1 = result_ip(&first);
    // The kubelet recreates the sandbox without a DEL of the old one (e.g. after a crash).
    assert_eq!(e.add(&conf, "c2", &pod), ip1);
    let st = e.state();
    assert_eq!(st.attached_to("c2"), vec![ip1]);
    assert!(st.attached_to("c1").is_empty());
    assert_eq!(st.records.len(), 1, "one lease for the pod: {st:?}");
    let file = e.net().join(st.by_ip(ip1).unwrap().0);
    let before = std::fs::read(&file).unwrap();

    // The late DEL of c1, as libcni sends it (cached result as prevResult, pod args) ...
    e.p.run(&Call::del("c1", &conf.clone().prev_result(&first)).pod(&pod))
        .ok_empty();
    // ... and as containerd may send it (no netns, no prevResult, no args).
    e.p.run(&Call::del("c1", &conf).netns("")).ok_empty();
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "a late DEL of the old container changed the new sandbox's record"
    );
    assert_eq!(e.state().attached_to("c2"), vec![ip1]);
    let other = e.add(&conf, "c3", &Pod::new("default", "other", "uid-o"));
    assert_ne!(other, ip1, "the new sandbox's address was handed out again");
    e.p.run(&Call::check("c2", &conf.clone().prev_result(&first)).pod(&pod))
        .ok_empty();
}

#[test]
fn different_uid_while_attached_in_this_boot_gets_a_different_ip() {
    let e = Env::new();
    let conf = e.conf("10.22.3.0/24");
    let ip1 = e.add(&conf, "c1", &Pod::new("default", "db-0", "uid-1"));
    let ip2 = e.add(&conf, "c2", &Pod::new("default", "db-0", "uid-2"));
    assert_ne!(ip1, ip2, "two live sandboxes share {ip1}");
    let st = e.state();
    assert_eq!(st.attached_to("c1"), vec![ip1]);
    assert_eq!(st.attached_to("c2"), vec![ip2]);
    // c2 goes away; a third sandbox takes the pod's released lease, never c1's attached one.
    e.del(&conf, "c2", &Pod::new("default", "db-0", "uid-2"));
    let ip3 = e.add(&conf, "c3", &Pod::new("default", "db-0", "uid-3"));
    assert_eq!(ip3, ip2, "the pod's released lease must be taken back");
    assert_eq!(e.state().attached_to("c1"), vec![ip1]);
}

#[test]
#[ignore = "needs root: simulating a reboot with unshare -m and a bind mount"]
fn after_a_reboot_the_old_attachment_is_taken_over() {
    assert_root("simulating a reboot with unshare -m and a bind mount");
    let e = Env::new();
    let conf = e.conf("10.22.4.0/24");
    let ip_a = e.add(&conf, "c-a1", &Pod::new("default", "a", "uid-a1"));
    let ip_b = e.add(&conf, "c-b1", &Pod::new("default", "b", "uid-b1"));
    let fake = e.data().join("fake_boot_id");
    let fake_id = "0b00b1e5-1111-2222-3333-444444444444";
    assert_ne!(fake_id, current_boot_id());
    std::fs::write(&fake, format!("{fake_id}\n")).unwrap();
    let rebooted = Plugin::sticky().with_boot_id(&fake);

    // The pod comes back after the reboot with a new UID: the old attachment cannot belong to
    // a live sandbox any more.
    let r = rebooted
        .run(&Call::add("c-a2", &conf).pod(&Pod::new("default", "a", "uid-a2")))
        .ok();
    assert_eq!(result_ip(&r), ip_a);
    let rec = e.state().sticky(ip_a);
    assert_eq!(rec.container_id, "c-a2");
    assert_eq!(rec.boot, fake_id, "the record must carry the new boot id");

    // A new pod after the reboot gets neither old address (b's lease is kept for b).
    let r = rebooted
        .run(&Call::add("c-n", &conf).pod(&Pod::new("default", "new", "uid-n")))
        .ok();
    let ip_n = result_ip(&r);
    assert!(ip_n != ip_a && ip_n != ip_b, "{ip_n} was someone's lease");
    let r = rebooted
        .run(&Call::add("c-b2", &conf).pod(&Pod::new("default", "b", "uid-b2")))
        .ok();
    assert_eq!(result_ip(&r), ip_b);
    e.state();
}

#[test]
fn podman_names_are_sticky_by_name() {
    let e = Env::new();
    let conf = e.conf("10.22.5.0/24");
    let cid = |n: u8| format!("{:064x}", u64::from(n) * 0x1234_5678_9abc_def1);
    let add = |c: &str, name: &str| {
        result_ip(&e.p.run(&Call::add(c, &conf).args(podman_args(name))).ok())
    };
    let del = |c: &str, name: &str| {
        e.p.run(&Call::del(c, &conf).args(podman_args(name)))
            .ok_empty()
    };
    let ip1 = add(&cid(1), "happy_turing");
    let st = e.state();
    assert_eq!(
        st.by_ip(ip1).unwrap().0,
        &format!("{ip1}__happy%5Fturing"),
        "podman: empty namespace, '_' percent-encoded"
    );
    let rec = st.sticky(ip1);
    assert_eq!(
        (
            rec.namespace.as_str(),
            rec.pod.as_str(),
            rec.pod_uid.as_str()
        ),
        ("", "happy_turing", "")
    );
    let ip2 = add(&cid(2), "sad_hopper");
    assert_ne!(ip1, ip2);
    del(&cid(1), "happy_turing");
    let ip3 = add(&cid(3), "new_one");
    assert!(ip3 != ip1 && ip3 != ip2);
    assert_eq!(add(&cid(4), "happy_turing"), ip1);
    // Recreated with the same --name without a DEL: no UID on either side, names are unique
    // among live podman containers, so the lease is taken over.
    assert_eq!(add(&cid(5), "happy_turing"), ip1);
    assert_eq!(e.state().attached_to(&cid(5)), vec![ip1]);
    del(&cid(4), "happy_turing");
    assert_eq!(
        e.state().attached_to(&cid(5)),
        vec![ip1],
        "late DEL released the live container's address"
    );
}

/// Runs the same calls against sticky-ipam and host-local in two data dirs and compares
/// results, file names and file bytes after every call.
fn compare_with_host_local(make_conf: impl Fn(&Path) -> Conf, calls: &[(&str, &str, &str, &str)]) {
    let hl = host_local_bin();
    let hl = Plugin::at(hl);
    let st = Plugin::sticky();
    let (d_st, d_hl) = (temp_dir(), temp_dir());
    let (c_st, c_hl) = (make_conf(d_st.path()), make_conf(d_hl.path()));
    for &(cmd, cid, ifname, args) in calls {
        let mk = |conf: &Conf| {
            Call::new(cmd, cid, &conf.bytes())
                .ifname(ifname)
                .args(args)
                .env("CNI_PATH", "/usr/lib/cni")
        };
        let a = st.run(&mk(&c_st));
        let b = hl.run(&mk(&c_hl));
        let what = format!("{cmd} {cid} {ifname} {args:?}");
        assert_eq!(
            a.status.success(),
            b.status.success(),
            "{what}: sticky {:?} vs host-local {:?}",
            a.json,
            b.json
        );
        if b.status.success() {
            assert_eq!(a.json, b.json, "{what}: results differ");
        }
        let (s_st, s_hl) = (snapshot(d_st.path()), snapshot(d_hl.path()));
        let ours: Snapshot = s_st
            .into_iter()
            .filter(|(k, _)| !BOOKKEEPING.iter().any(|b| k.ends_with(&format!("/{b}"))))
            .collect();
        assert_same(&s_hl, &ours, &format!("{what}: sticky vs host-local"));
        check_dir(&d_st.path().join(c_st.name()), COMPLETED);
    }
}

const SEQUENCE: &[(&str, &str, &str, &str)] = &[
    ("ADD", "c1", "eth0", ""),
    (
        "ADD",
        "c2",
        "eth0",
        "IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=c2",
    ),
    ("ADD", "c3", "eth1", ""),
    ("DEL", "c2", "eth0", ""),
    ("ADD", "c4", "eth0", ""),
    ("ADD", "c5", "eth0", ""),
    ("DEL", "c1", "eth0", ""),
    ("ADD", "c6", "eth0", ""),
    ("ADD", "c7", "eth0", ""),
    ("ADD", "c8", "eth0", ""),
    ("DEL", "c3", "eth1", ""),
    ("DEL", "c3", "eth1", ""),
    ("DEL", "nobody", "eth0", ""),
    ("ADD", "c9", "eth0", ""),
];

#[test]
fn no_identity_is_host_local_byte_for_byte() {
    compare_with_host_local(
        |d| {
            Conf::new(
                "hl",
                d,
                json!([[{"subnet": "10.9.0.0/29"}], [{"subnet": "2001:db8:9::/64", "rangeStart": "2001:db8:9::10", "rangeEnd": "2001:db8:9::16"}]]),
            )
        },
        SEQUENCE,
    );
}

#[test]
fn no_identity_legacy_flat_config_is_host_local_byte_for_byte() {
    compare_with_host_local(
        |d| {
            let mut c = Conf::v4("flat", d, "10.9.0.0/24");
            let ipam = c.value["ipam"].as_object_mut().unwrap();
            ipam.remove("ranges");
            ipam.insert("subnet".into(), json!("10.9.1.0/24"));
            ipam.insert("rangeStart".into(), json!("10.9.1.20"));
            ipam.insert("rangeEnd".into(), json!("10.9.1.26"));
            ipam.insert("gateway".into(), json!("10.9.1.254"));
            ipam.insert("routes".into(), json!([{"dst": "0.0.0.0/0"}]));
            c.version("0.3.1")
        },
        SEQUENCE,
    );
}

#[test]
fn results_have_every_versions_shape_and_match_host_local() {
    let e = Env::new();
    let resolv = e.data().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 192.0.2.53\nsearch example.org\noptions ndots:2\n",
    )
    .unwrap();
    let make = |d: &Path, v: &str| {
        Conf::new(
            "ver",
            d,
            json!([[{"subnet": "10.9.0.0/28"}], [{"subnet": "2001:db8::/64"}]]),
        )
        .version(v)
        .ipam("resolvConf", json!(resolv.to_str().unwrap()))
        .ipam(
            "routes",
            json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "2001:db8::9"}]),
        )
    };
    let hl = Plugin::at(host_local_bin());
    let d_hl = temp_dir();
    for (i, v) in [
        "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
    ]
    .into_iter()
    .enumerate()
    {
        let cid = format!("c{i}");
        let r = e.p.run(&Call::add(&cid, &make(e.data(), v))).ok();
        assert_eq!(r["cniVersion"], v);
        let n = i + 2;
        let (a4, a6) = (format!("10.9.0.{n}/28"), format!("2001:db8::{n}/64"));
        match v {
            "0.1.0" | "0.2.0" => {
                assert!(r.get("ips").is_none(), "{v}: {r}");
                assert_eq!(r["ip4"]["ip"], a4.as_str(), "{v}: {r}");
                assert_eq!(r["ip4"]["gateway"], "10.9.0.1");
                assert_eq!(r["ip4"]["routes"], json!([{"dst": "0.0.0.0/0"}]));
                assert_eq!(r["ip6"]["ip"], a6.as_str(), "{v}: {r}");
                assert_eq!(r["ip6"]["routes"][0]["gw"], "2001:db8::9");
            }
            "0.3.0" | "0.3.1" | "0.4.0" => {
                assert!(r.get("ip4").is_none(), "{v}: {r}");
                assert_eq!(
                    r["ips"],
                    json!([{"version": "4", "address": a4, "gateway": "10.9.0.1"},
                           {"version": "6", "address": a6, "gateway": "2001:db8::1"}]),
                    "{v}: {r}"
                );
            }
            _ => {
                assert_eq!(
                    r["ips"],
                    json!([{"address": a4, "gateway": "10.9.0.1"},
                           {"address": a6, "gateway": "2001:db8::1"}]),
                    "{v}: {r}"
                );
                assert_eq!(r["routes"][1], json!({"dst": "::/0", "gw": "2001:db8::9"}));
            }
        }
        assert_eq!(
            r["dns"],
            json!({"nameservers": ["192.0.2.53"], "search": ["example.org"], "options": ["ndots:2"]}),
            "{v}: resolvConf"
        );
        // Debian's host-local speaks up to 1.0.0: the results must be identical.
        if v != "1.1.0" {
            let h = hl
                .run(&Call::add(&cid, &make(d_hl.path(), v)).env("CNI_PATH", "/usr/lib/cni"))
                .ok();
            assert_eq!(r, h, "{v}: sticky-ipam and host-local differ");
        }
    }
    e.state();
}

#[test]
fn dual_stack_each_family_is_sticky_on_its_own() {
    let e = Env::new();
    let conf = Conf::new(
        NET,
        e.data(),
        json!([[{"subnet": "10.23.0.0/24"}],
               [{"subnet": "2001:db8:23::/64", "rangeStart": "2001:db8:23::10", "rangeEnd": "2001:db8:23::11"}]]),
    );
    let pa = Pod::new("default", "a", "uid-a");
    let pb = Pod::new("default", "b", "uid-b");
    let pc = Pod::new("default", "c", "uid-c");
    let add = |cid: &str, pod: &Pod| -> (IpAddr, IpAddr) {
        let r = e.p.run(&Call::add(cid, &conf).pod(pod)).ok();
        let ips = result_ips(&r);
        assert_eq!(ips.len(), 2, "{r}");
        assert!(ips[0].is_ipv4() && ips[1].is_ipv6(), "{r}");
        (ips[0], ips[1])
    };
    let (a4, a6) = add("ca1", &pa);
    let (b4, b6) = add("cb1", &pb);
    e.del(&conf, "ca1", &pa);
    e.del(&conf, "cb1", &pb);
    // The v6 range (2 addresses) is full of released leases: c reclaims a's (released first);
    // the v4 range has room, so c gets a fresh v4 address.
    let (c4, c6) = add("cc1", &pc);
    assert!(c4 != a4 && c4 != b4, "{c4} was a lease");
    assert_eq!(c6, a6, "reclaim must take the earliest released v6 lease");
    // a comes back: its v4 lease is still its own, its v6 lease is gone.
    let (a4_again, a6_again) = add("ca2", &pa);
    assert_eq!(a4_again, a4, "v4 stickiness must not depend on v6");
    assert_eq!(a6_again, b6, "v6: the only released lease left is b's");
    let st = e.state();
    assert_eq!(st.attached_to("ca2").len(), 2);
    assert_eq!(st.sticky(a6).pod, "c");
    assert_eq!(st.sticky(b6).pod, "a");
    assert!(!st.sticky(b4).attached);
}

#[test]
fn full_range_of_released_leases_reclaims_the_earliest_released() {
    let e = Env::new();
    let conf = Conf::new(
        NET,
        e.data(),
        json!([[{"subnet": "10.24.0.0/24", "rangeStart": "10.24.0.10", "rangeEnd": "10.24.0.13"}]]),
    );
    let pods: Vec<Pod> = ["p0", "p1", "p2", "p3"]
        .iter()
        .map(|n| Pod::new("ns", n, &format!("uid-{n}")))
        .collect();
    let ips: Vec<IpAddr> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| e.add(&conf, &format!("c{i}"), p))
        .collect();
    assert_eq!(
        ips,
        ["10.24.0.10", "10.24.0.11", "10.24.0.12", "10.24.0.13"]
            .map(ip)
            .to_vec()
    );
    // Released in the order p2, p0, p3, p1 (not address order, not name order).
    for i in [2, 0, 3, 1] {
        e.del(&conf, &format!("c{i}"), &pods[i]);
    }
    let st = e.state();
    let seq = |i: usize| st.sticky(ips[i]).release_seq;
    assert!(seq(2) < seq(0) && seq(0) < seq(3) && seq(3) < seq(1));

    // Refuse: a clear exhaustion error and nothing changes.
    let refuse = conf.clone().ipam("whenExhausted", json!("refuse"));
    let before = snapshot(e.data());
    e.p.run(&Call::add("cn", &refuse).pod(&Pod::new("ns", "new", "uid-new")))
        .expect_code(100);
    assert_same(&before, &snapshot(e.data()), "refused ADD");
    // With refuse, a pod still gets its own lease.
    assert_eq!(e.add(&refuse, "c1b", &pods[1]), ips[1]);

    // Reclaim (the default): the lease released longest ago.
    assert_eq!(
        e.add(&conf, "cn", &Pod::new("ns", "new", "uid-new")),
        ips[2]
    );
    let st = e.state();
    assert_eq!(st.sticky(ips[2]).pod, "new");
    assert!(st.records.keys().all(|k| !k.ends_with("_ns_p2")));
    assert_eq!(e.add(&conf, "cm", &Pod::new("ns", "m", "uid-m")), ips[0]);
    // p2 returns: its lease was reclaimed; the earliest released left is p3's.
    assert_eq!(e.add(&conf, "c2b", &pods[2]), ips[3]);
    // Now every address is attached: nothing can be reclaimed.
    let before = snapshot(e.data());
    e.p.run(&Call::add("cx", &conf).pod(&Pod::new("ns", "x", "uid-x")))
        .expect_code(100);
    assert_same(&before, &snapshot(e.data()), "ADD into a full range");
}

#[test]
fn seeded_leases_reclaim_by_release_seq_not_by_address() {
    let e = Env::new();
    let conf = Conf::new(
        NET,
        e.data(),
        json!([[{"subnet": "10.24.1.0/24", "rangeStart": "10.24.1.10", "rangeEnd": "10.24.1.13"}]]),
    );
    for (last, pod, seq) in [(10, "a", 7), (11, "b", 3), (12, "c", 9), (13, "d", 5)] {
        seed_sticky(
            &e.net(),
            ip(&format!("10.24.1.{last}")),
            &released("ns", pod, seq),
        );
    }
    e.state();
    // A first call creates the lock; the last boot seen is this one (as the plugin writes it).
    e.p.run(&Call::del("init", &conf)).ok_empty();
    std::fs::write(e.net().join("boot_id"), current_boot_id()).unwrap();
    let refuse = conf.clone().ipam("whenExhausted", json!("refuse"));
    let before = snapshot(e.data());
    e.p.run(&Call::add("cn", &refuse).pod(&Pod::new("ns", "n", "uid-n")))
        .expect_code(100);
    assert_same(&before, &snapshot(e.data()), "refused ADD");
    assert_eq!(
        e.add(&conf, "cn", &Pod::new("ns", "n", "uid-n")),
        ip("10.24.1.11")
    );
    assert_eq!(
        e.add(&conf, "cm", &Pod::new("ns", "m", "uid-m")),
        ip("10.24.1.13")
    );
    assert_eq!(
        e.add(&conf, "ca", &Pod::new("ns", "a", "uid-a2")),
        ip("10.24.1.10")
    );
}

#[test]
fn an_attached_address_is_never_handed_out_twice() {
    let e = Env::new();
    let conf = Conf::new(
        NET,
        e.data(),
        json!([[{"subnet": "10.24.2.0/24", "rangeStart": "10.24.2.10", "rangeEnd": "10.24.2.12"}]]),
    );
    let pods: Vec<Pod> = (0..3)
        .map(|i| Pod::new("ns", &format!("p{i}"), &format!("uid-{i}")))
        .collect();
    for (i, p) in pods.iter().enumerate() {
        e.add(&conf, &format!("c{i}"), p);
    }
    let before = snapshot(e.data());
    for policy in ["reclaim", "refuse"] {
        let c = conf.clone().ipam("whenExhausted", json!(policy));
        e.p.run(&Call::add("cx", &c).pod(&Pod::new("ns", "x", "uid-x")))
            .expect_code(100);
        // Same name, another UID, in this boot: the old sandbox may be alive.
        e.p.run(&Call::add("cy", &c).pod(&Pod::new("ns", "p1", "uid-other")))
            .expect_code(100);
        // No identity at all.
        e.p.run(&Call::add("cz", &c)).expect_code(100);
    }
    assert_same(&before, &snapshot(e.data()), "ADDs into a full range");
    e.del(&conf, "c1", &pods[1]);
    assert_eq!(
        e.add(&conf, "cx", &Pod::new("ns", "x", "uid-x")),
        ip("10.24.2.11")
    );
}

#[test]
fn requested_ips_from_all_three_sources() {
    let e = Env::new();
    let conf = e.conf("10.25.0.0/24");
    let pa = Pod::new("ns", "a", "uid-a");
    let pb = Pod::new("ns", "b", "uid-b");
    let pc = Pod::new("ns", "c", "uid-c");
    let rt = conf
        .clone()
        .top("runtimeConfig", json!({"ips": ["10.25.0.50/24"]}));
    assert_eq!(e.add(&rt, "ca", &pa), ip("10.25.0.50"));
    let args = conf
        .clone()
        .top("args", json!({"cni": {"ips": ["10.25.0.51"]}}));
    assert_eq!(e.add(&args, "cb", &pb), ip("10.25.0.51"));
    let r =
        e.p.run(&Call::add("cc", &conf).args(format!("{};IP=10.25.0.52", pc.kubelet_args("cc"))))
            .ok();
    assert_eq!(result_ip(&r), ip("10.25.0.52"));
    let st = e.state();
    assert_eq!(st.sticky(ip("10.25.0.52")).pod, "c");
    assert_eq!(st.sticky(ip("10.25.0.50")).pod, "a");

    // Taken by a live container: 101, nothing changes.
    let before = snapshot(e.data());
    let pd = Pod::new("ns", "d", "uid-d");
    e.p.run(&Call::add("cd", &rt).pod(&pd)).expect_code(101);
    e.p.run(&Call::add("cd", &conf).args(format!("{};IP=10.25.0.51", pd.kubelet_args("cd"))))
        .expect_code(101);
    assert_same(&before, &snapshot(e.data()), "refused requested IP");

    // A pod may request its own released lease.
    e.del(&conf, "ca", &pa);
    assert_eq!(e.add(&rt, "ca2", &pa), ip("10.25.0.50"));
    // Without identity, as host-local.
    let r = e.p.run(&Call::add("cn", &conf).args("IP=10.25.0.60")).ok();
    assert_eq!(result_ip(&r), ip("10.25.0.60"));
    assert!(matches!(
        e.state().by_ip(ip("10.25.0.60")),
        Some((_, Record::Plain { .. }))
    ));
}

#[test]
fn check_verifies_prev_result_against_the_records() {
    for version in ["0.4.0", "1.0.0", "1.1.0"] {
        let e = Env::new();
        let conf = e.conf("10.26.0.0/24").version(version);
        let pa = Pod::new("ns", "a", "uid-a");
        let ra = e.p.run(&Call::add("ca", &conf).pod(&pa)).ok();
        let rn = e.p.run(&Call::add("cn", &conf)).ok();
        let with = |r: &Value| conf.clone().prev_result(r);
        e.p.run(&Call::check("ca", &with(&ra)).pod(&pa)).ok_empty();
        e.p.run(&Call::check("cn", &with(&rn))).ok_empty();
        // Another container's address.
        e.p.run(&Call::check("ca", &with(&rn)).pod(&pa))
            .expect_code(102);
        e.p.run(&Call::check("cx", &with(&ra)).pod(&pa))
            .expect_code(102);
        // The right address on another interface.
        e.p.run(&Call::check("ca", &with(&ra)).pod(&pa).ifname("eth1"))
            .expect_code(102);
        // Addresses outside this network are not ours to judge.
        let mut mixed = ra.clone();
        mixed["ips"]
            .as_array_mut()
            .unwrap()
            .push(json!({"address": "192.0.2.9/24"}));
        e.p.run(&Call::check("ca", &with(&mixed)).pod(&pa))
            .ok_empty();
        e.p.run(&Call::del("ca", &conf).pod(&pa)).ok_empty();
        e.p.run(&Call::check("ca", &with(&ra)).pod(&pa))
            .expect_code(102);
        e.state();
    }
}

#[test]
fn add_is_idempotent_and_del_too() {
    let e = Env::new();
    let conf = e.conf("10.27.0.0/24");
    let pa = Pod::new("ns", "a", "uid-a");
    let r1 = e.p.run(&Call::add("ca", &conf).pod(&pa)).ok();
    let n1 = e.p.run(&Call::add("cn", &conf)).ok();
    let before = snapshot(e.data());
    assert_eq!(e.p.run(&Call::add("ca", &conf).pod(&pa)).ok(), r1);
    assert_eq!(e.p.run(&Call::add("cn", &conf)).ok(), n1);
    assert_same(&before, &snapshot(e.data()), "repeated ADD");
    // Another interface of the same container is another attachment.
    let r2 =
        e.p.run(&Call::add("ca", &conf).pod(&pa).ifname("net1"))
            .ok();
    assert_ne!(result_ip(&r1), result_ip(&r2));
    e.p.run(&Call::del("ca", &conf).pod(&pa)).ok_empty();
    let st = e.state();
    assert!(!st.sticky(result_ip(&r1)).attached);
    assert!(st.sticky(result_ip(&r2)).attached, "DEL eth0 released net1");
    let before = snapshot(e.data());
    e.p.run(&Call::del("ca", &conf).pod(&pa)).ok_empty();
    e.p.run(&Call::del("never", &conf)).ok_empty();
    assert_same(&before, &snapshot(e.data()), "repeated DEL");
    e.p.run(&Call::del("cn", &conf)).ok_empty();
    assert!(e.state().by_ip(result_ip(&n1)).is_none());
}

#[test]
fn the_boot_is_recorded_once_per_boot_not_on_every_call() {
    use std::os::unix::fs::MetadataExt;
    let e = Env::new();
    let conf = e.conf("10.28.0.0/24");
    e.add(&conf, "c0", &Pod::new("ns", "p0", "u0"));
    let boot_file = e.net().join("boot_id");
    assert_eq!(
        std::fs::read_to_string(&boot_file).unwrap().trim(),
        current_boot_id()
    );
    let inode = std::fs::metadata(&boot_file).unwrap().ino();
    // Later calls in the same boot neither rewrite it (each rewrite is a temp file, an fsync
    // and a rename) nor redo the earlier-boot sweep.
    e.add(&conf, "c1", &Pod::new("ns", "p1", "u1"));
    e.del(&conf, "c1", &Pod::new("ns", "p1", "u1"));
    e.p.run(&Call::add("c2", &conf)).ok();
    assert_eq!(
        std::fs::metadata(&boot_file).unwrap().ino(),
        inode,
        "boot_id was rewritten by a call in the same boot"
    );
}

#[test]
fn ip_ranges_capability_is_host_local_byte_for_byte() {
    compare_with_host_local(
        |d| {
            Conf::v4("caps", d, "10.9.0.0/24").top(
                "runtimeConfig",
                json!({"ipRanges": [[{"subnet": "10.9.7.0/29", "gateway": "10.9.7.6"}]]}),
            )
        },
        SEQUENCE,
    );
}

/// Record files (names starting with a digit or containing ':') opened by one call, seen with
/// strace (which must be installed).
fn records_opened(p: &Plugin, call: &Call, net: &Path) -> Vec<String> {
    let log = net.parent().unwrap().join("strace.log");
    let traced = p.traced("open,openat,openat2", &log);
    traced.run(call).ok();
    let text = std::fs::read_to_string(&log).unwrap();
    let prefix = format!("{}/", net.display());
    text.lines()
        .filter_map(|l| l.split('"').nth(1))
        .filter_map(|path| path.strip_prefix(&prefix))
        .filter(|name| name.starts_with(|c: char| c.is_ascii_digit()))
        .map(str::to_string)
        .collect()
}

#[test]
fn del_finds_its_record_without_reading_every_file() {
    let e = Env::new();
    let conf = e.conf("10.29.0.0/16");
    // 300 leases of other pods and 100 host-local records.
    for i in 0..300u32 {
        let a = ip(&format!("10.29.{}.{}", 1 + i / 200, 2 + i % 200));
        let mut rec = released("other", &format!("pod-{i}"), u64::from(i) + 1);
        rec.attached = i % 2 == 0;
        if rec.attached {
            rec.release_seq = 0;
            rec.released_at = 0;
        }
        seed_sticky(&e.net(), a, &rec);
    }
    for i in 0..100u32 {
        let a = format!("10.29.5.{}", 2 + i);
        std::fs::write(e.net().join(a), format!("plain{i}\r\neth0")).unwrap();
    }
    // The bookkeeping as the plugin keeps it: this boot, and the release counter.
    std::fs::write(e.net().join("boot_id"), current_boot_id()).unwrap();
    std::fs::write(e.net().join("release_seq"), "300").unwrap();
    let pod = Pod::new("ns", "mine", "uid-mine");
    let r = e.p.run(&Call::add("cm", &conf).pod(&pod)).ok();
    let mine = result_ip(&r);
    let own = sticky_name(mine, "ns", "mine");

    // As kubelet sends it (pod args, no prevResult): the pod's own names are enough.
    let opened = records_opened(&e.p, &Call::del("cm", &conf).pod(&pod), &e.net());
    assert!(!e.state().sticky(mine).attached, "DEL did not release");
    assert!(
        opened.iter().all(|n| n.ends_with("_ns_mine")),
        "DEL with pod args opened {} records of other pods (e.g. {:?})",
        opened.iter().filter(|n| !n.ends_with("_ns_mine")).count(),
        opened.iter().find(|n| !n.ends_with("_ns_mine"))
    );
    assert!(opened.contains(&own), "{opened:?}");

    // As libcni sends it with the cached result: the addresses in prevResult are enough.
    e.p.run(&Call::add("cm2", &conf).pod(&pod)).ok();
    let prev = conf.clone().prev_result(&r);
    let opened = records_opened(&e.p, &Call::del("cm2", &prev).pod(&pod), &e.net());
    assert!(!e.state().sticky(mine).attached, "DEL did not release");
    assert!(
        opened.len() <= 3,
        "DEL with prevResult opened {} records: {:?}...",
        opened.len(),
        &opened[..opened.len().min(5)]
    );
}

/// A DEL whose IPAM section lost its ranges (a main plugin that fills them in per node could
/// not work the node out any more) still releases the pod's lease: DEL never needs a range,
/// and a DEL that cannot succeed would block the pod's deletion forever. ADD still refuses.
#[test]
fn del_without_ranges_still_releases_and_add_still_refuses() {
    let e = Env::new();
    let conf = e.conf("10.23.0.0/24");
    let web = Pod::new("default", "web-0", "uid-1");
    let ip = e.add(&conf, "c-1", &web);
    let mut bare = conf.clone();
    bare.value["ipam"].as_object_mut().unwrap().remove("ranges");
    e.p.run(&Call::del("c-1", &bare).pod(&web)).ok_empty();
    assert!(!e.state().sticky(ip).attached, "released without ranges");
    assert_eq!(e.p.run(&Call::add("c-2", &bare).pod(&web)).err_code(), 7);
}
