//! Every example in `conf-examples/` is accepted by sticky-ipam: its IPAM section, handed over
//! as libcni hands a conflist entry to a plugin, gives a working ADD/DEL and a sticky lease.

use sticky_testkit::support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::*;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("conf-examples")
}

fn load(name: &str) -> Value {
    let path = examples().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
}

/// The plugin entries of a conf or conflist as containerd 1.6/1.7 pass them.
fn entries(doc: &Value) -> Vec<Value> {
    runtime_entries(doc, false)
}

/// The first ADD of an example's entry: its IPAM section with `dataDir` moved to a temp dir,
/// pod default/example as container c1, through sticky-ipam.
struct FirstAdd {
    tmp: tempfile::TempDir,
    conf: Conf,
    p: Plugin,
    pod: Pod,
    r: Value,
}

fn first_add(name: &str, mut entry: Value) -> FirstAdd {
    assert_eq!(entry["ipam"]["type"], "sticky-ipam", "{name}");
    let tmp = temp_dir();
    entry["ipam"]["dataDir"] = json!(tmp.path().to_str().unwrap());
    let conf = Conf { value: entry };
    let p = Plugin::sticky();
    let pod = Pod::new("default", "example", "uid-1");
    let r = p.run(&Call::add("c1", &conf).pod(&pod)).ok();
    FirstAdd {
        tmp,
        conf,
        p,
        pod,
        r,
    }
}

/// Runs ADD, DEL and ADD of a recreated pod with the example's IPAM section (dataDir moved to a
/// temp dir), returns the addresses.
fn exercise(name: &str, entry: Value, families: usize) -> Vec<std::net::IpAddr> {
    let FirstAdd {
        tmp,
        conf,
        p,
        pod,
        r,
    } = first_add(name, entry);
    let ips = result_ips(&r);
    assert_eq!(ips.len(), families, "{name}: {r}");
    p.run(&Call::del("c1", &conf).pod(&pod)).ok_empty();
    let r2 = p
        .run(&Call::add("c2", &conf).pod(&Pod::new("default", "example", "uid-2")))
        .ok();
    assert_eq!(result_ips(&r2), ips, "{name}: the lease was not kept");
    check_dir(&tmp.path().join(conf.name()), COMPLETED);
    ips
}

#[test]
fn bridge_conflist_example_works() {
    let doc = load("10-sticky-ipam-bridge.conflist");
    assert_eq!(doc["cniVersion"], "1.0.0");
    let e = entries(&doc);
    assert_eq!(e[0]["type"], "bridge");
    let ips = exercise("10-sticky-ipam-bridge.conflist", e[0].clone(), 1);
    assert_eq!(ips[0], ip("10.88.0.2"));
}

#[test]
fn vxlan_conflist_example_ipam_section_works() {
    // The network the DaemonSet installs: its IPAM section, as sticky-vxlan delegates it.
    let doc = load("10-sticky-vxlan.conflist");
    assert_eq!(doc["cniVersion"], "1.0.0");
    let e = entries(&doc);
    assert_eq!(e[0]["type"], "sticky-vxlan");
    let ips = exercise("10-sticky-vxlan.conflist", e[0].clone(), 1);
    assert_eq!(ips[0], ip("10.244.1.2"));
}

#[test]
fn ipv6_underlay_conflist_example_ipam_section_works() {
    // Dual-stack pods on a node whose underlay is IPv6 only: one address per family.
    let doc = load("12-sticky-vxlan-ipv6-underlay.conflist");
    let e = entries(&doc);
    assert_eq!(e[0]["type"], "sticky-vxlan");
    let ips = exercise("12-sticky-vxlan-ipv6-underlay.conflist", e[0].clone(), 2);
    assert_eq!(ips, [ip("10.244.1.2"), ip("fd00:1::2")]);
}

#[test]
fn cluster_vxlan_conflist_example_gets_its_ranges_from_the_node() {
    // The DaemonSet's network: no range in the IPAM section; sticky-vxlan fills in the node's
    // own subnets from the peers file (tests/vxlan_sticky.rs proves that part with packets).
    let doc = load("11-sticky-vxlan-cluster.conflist");
    let e = entries(&doc);
    assert_eq!(e[0]["type"], "sticky-vxlan");
    assert!(
        sticky_overlay::config::Config::from_json("n", &e[0]).is_ok_and(|c| c.ranges_from_peers)
    );
    let mut entry = e[0].clone();
    entry["ipam"]["ranges"] = json!([[{"subnet": "10.244.7.0/24"}]]);
    let ips = exercise("11-sticky-vxlan-cluster.conflist", entry, 1);
    assert_eq!(ips[0], ip("10.244.7.2"));
}

#[test]
fn dualstack_conf_example_works() {
    let doc = load("20-sticky-ipam-dualstack.conf");
    assert!(doc.get("plugins").is_none(), "a single-plugin .conf");
    let ips = exercise("20-sticky-ipam-dualstack.conf", doc, 2);
    assert!(ips[0].is_ipv4() && ips[1].is_ipv6(), "{ips:?}");
}

#[test]
fn host_local_dropin_differs_by_one_word_and_gives_the_same_addresses() {
    let before = load("30-host-local-dropin.conflist.host-local");
    let after = load("30-host-local-dropin.conflist");
    let mut expected = before.clone();
    expected["plugins"][0]["ipam"]["type"] = json!("sticky-ipam");
    assert_eq!(after, expected, "the drop-in must change only ipam.type");
    exercise(
        "30-host-local-dropin.conflist",
        entries(&after)[0].clone(),
        1,
    );

    // Without pod identity, the first addresses are host-local's own.
    let hl = host_local_bin();
    let (d1, d2) = (temp_dir(), temp_dir());
    let mut a = entries(&before)[0].clone();
    a["ipam"]["dataDir"] = json!(d1.path().to_str().unwrap());
    let mut b = entries(&after)[0].clone();
    b["ipam"]["dataDir"] = json!(d2.path().to_str().unwrap());
    for cid in ["c1", "c2", "c3"] {
        let ra = Plugin::at(&hl)
            .run(&Call::add(cid, &Conf { value: a.clone() }).env("CNI_PATH", "/usr/lib/cni"))
            .ok();
        let rb = Plugin::sticky()
            .run(&Call::add(cid, &Conf { value: b.clone() }))
            .ok();
        assert_eq!(ra, rb, "{cid}");
    }
}

#[test]
fn segment_conflist_example_reads_and_its_node_slice_gives_addresses() {
    // A secondary network: sticky-vxlan in segment mode; sticky-ipam over the segment's
    // subnet, cut to node 192.0.2.1's slice (tests/conf_examples_e2e.rs runs it whole).
    let name = "40-sticky-vxlan-segment.conflist";
    let doc = load(name);
    let e = entries(&doc);
    let cfg = sticky_vxlan::segment::config::Config::from_json("vxeth0", &e[0]).unwrap();
    assert_eq!((cfg.vni, cfg.node_slice), (100, Some(27)));
    let nodes: Vec<std::net::IpAddr> =
        vec!["192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap()];
    let sliced = sticky_vxlan::segment::slice::apply(&e[0], nodes[0], &nodes, 27).unwrap();
    let ips = exercise(name, sliced, 1);
    assert_eq!(ips[0], ip("192.168.10.33"));
}

#[test]
fn segment_nad_example_is_the_readme_example_of_kube_vxlan_controller() {
    let text = std::fs::read_to_string(examples().join("41-vxlan-segment-nad.yaml")).unwrap();
    assert!(text.contains("kind: NetworkAttachmentDefinition"));
    let conf = nad_config(&text);
    let cfg = sticky_vxlan::segment::config::Config::from_json("vxeth1", &conf).unwrap();
    assert_eq!(
        (cfg.vni, cfg.ipam_type),
        (101, None),
        "L2 + fixed addresses, no IPAM"
    );
    let gw =
        sticky_vxlan::segment::attachments::find(&cfg.attachments, "default", "gw-f87979b47-5p57h");
    assert_eq!(gw.unwrap().ips[0].to_string(), "192.168.11.1/29");
    let a =
        sticky_vxlan::segment::attachments::find(&cfg.attachments, "default", "a-5cd8c6ccb8-kkvwt");
    assert_eq!(a.unwrap().routes[0].gw, Some(ip("192.168.11.1")));
}

/// Every shipped conflist at 1.0.0 declares `cniVersions` up to 1.1.0: containerd 1.6/1.7
/// (libcni 1.1) load it at 1.0.0, a runtime on libcni ≥ 1.2 negotiates 1.1.0, and sticky-ipam
/// answers ADD, STATUS and GC at that version (GC releasing what is not valid).
#[test]
fn shipped_conflists_negotiate_1_1_0_and_sticky_ipam_answers_add_status_gc() {
    let mut names: Vec<String> = std::fs::read_dir(examples())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".conflist"))
        .collect();
    names.sort();
    let mut exercised = 0;
    for name in names {
        let doc = load(&name);
        if doc["cniVersion"] != "1.0.0" {
            continue;
        }
        assert_eq!(
            doc["cniVersions"],
            json!(["1.0.0", "1.1.0"]),
            "{name}: cniVersions beside cniVersion 1.0.0"
        );
        assert_eq!(runtime_entries(&doc, false)[0]["cniVersion"], "1.0.0");
        let entry = runtime_entries(&doc, true)[0].clone();
        assert_eq!(entry["cniVersion"], LIBCNI_1_2_MAX, "{name}");
        if entry["ipam"]["type"] != "sticky-ipam" || entry["ipam"]["ranges"].is_null() {
            continue;
        }
        let FirstAdd {
            tmp, conf, p, r, ..
        } = first_add(&name, entry);
        assert_eq!(r["cniVersion"], LIBCNI_1_2_MAX, "{name}: {r}");
        let ips = result_ips(&r);
        assert!(!ips.is_empty(), "{name}: {r}");
        p.run(&Call::new("STATUS", "c1", &conf.bytes())).ok_empty();
        let gc = conf.clone().top("cni.dev/valid-attachments", json!([]));
        p.run(&Call::new("GC", "c1", &gc.bytes())).ok_empty();
        let state = check_dir(&tmp.path().join(conf.name()), COMPLETED);
        assert_eq!(state.released_count(), ips.len(), "{name}: GC released c1");
        exercised += 1;
    }
    assert!(exercised >= 3, "only {exercised} conflists exercised");
}

#[test]
fn every_example_is_covered() {
    let mut names: Vec<String> = std::fs::read_dir(examples())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            [".conf", ".conflist", ".json", ".yaml"]
                .iter()
                .any(|ext| n.ends_with(ext))
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "10-sticky-ipam-bridge.conflist",
            "10-sticky-vxlan.conflist",
            "11-sticky-vxlan-cluster.conflist",
            "12-sticky-vxlan-ipv6-underlay.conflist",
            "13-sticky-vxlan-sites.conflist",
            "20-sticky-ipam-dualstack.conf",
            "30-host-local-dropin.conflist",
            "40-sticky-vxlan-segment.conflist",
            "41-vxlan-segment-nad.yaml"
        ],
        "a new example needs a test here"
    );
}
