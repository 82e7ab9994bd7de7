//! Policy tests over the in-memory store: no filesystem, no clock.

use std::net::IpAddr;

use super::*;
use crate::check::{CheckError, check};
use crate::del::del;
use crate::store::mem::MemStore;
use cni_protocol::{Args, NetConf};

fn config(ipam: &str) -> IpamConfig {
    let doc = format!(r#"{{"cniVersion":"1.0.0","name":"net","ipam":{ipam}}}"#);
    IpamConfig::from_netconf(&NetConf::parse(doc.as_bytes()).unwrap(), &Args::default()).unwrap()
}

fn small() -> IpamConfig {
    // .1 is the gateway: .2 .. .6 are assignable.
    config(r#"{"subnet":"10.0.0.0/29"}"#)
}

fn pod(name: &str, uid: &str) -> Pod {
    Pod {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

fn req<'a>(container: &'a str, pod: Option<&'a Pod>, boot: &'a str) -> Request<'a> {
    Request {
        container_id: container,
        ifname: "eth0",
        pod,
        sticky: true,
        boot,
        lease_clock: 1000,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn add1(store: &mut MemStore, config: &IpamConfig, r: &Request) -> Result<IpAddr, AllocError> {
    let requested = assign_requested(config)?;
    Ok(add(store, config, r, &requested)?[0].ip)
}

#[test]
fn released_lease_comes_back_to_the_same_pod() {
    let (mut s, c) = (MemStore::default(), small());
    let p = pod("web", "u1");
    let first = add1(&mut s, &c, &req("c1", Some(&p), "b")).unwrap();
    let other = add1(&mut s, &c, &req("x1", Some(&pod("other", "u9")), "b")).unwrap();
    assert_ne!(first, other);
    assert_eq!(del(&mut s, &req("c1", Some(&p), "b"), &[], 1).unwrap(), 1);
    let lease = s.records().into_iter().find(|r| r.ip == first).unwrap();
    assert!(
        matches!(&lease.body, Body::Lease(l) if l.state == State::Released && l.release_seq == 1)
    );
    let p2 = pod("web", "u2");
    assert_eq!(add1(&mut s, &c, &req("c2", Some(&p2), "b")).unwrap(), first);
}

#[test]
fn add_is_idempotent() {
    let (mut s, c) = (MemStore::default(), small());
    let p = pod("web", "u1");
    let a = add1(&mut s, &c, &req("c1", Some(&p), "b")).unwrap();
    let files = s.files.clone();
    assert_eq!(add1(&mut s, &c, &req("c1", Some(&p), "b")).unwrap(), a);
    assert_eq!(s.files, files);
    let b = add1(&mut s, &c, &req("anon", None, "b")).unwrap();
    assert_eq!(add1(&mut s, &c, &req("anon", None, "b")).unwrap(), b);
    assert_eq!(s.files.len(), 2);
}

#[test]
fn attached_lease_is_taken_over_only_when_its_sandbox_cannot_be_alive() {
    let c = small();
    let old = pod("web", "u1");
    // Same UID: the runtime replaced the sandbox without a DEL.
    let mut s = MemStore::default();
    let a = add1(&mut s, &c, &req("c1", Some(&old), "b")).unwrap();
    assert_eq!(
        add1(&mut s, &c, &req("c2", Some(&pod("web", "u1")), "b")).unwrap(),
        a
    );
    // A late DEL of the old sandbox releases nothing of the new one.
    assert_eq!(
        del(&mut s, &req("c1", Some(&old), "b"), &[a], 1).unwrap(),
        0
    );
    assert!(s.records().iter().any(|r| r.is_attachment("c2", "eth0")));

    // Different UID in the same boot: may still be alive, so a different address.
    let mut s = MemStore::default();
    let a = add1(&mut s, &c, &req("c1", Some(&old), "b")).unwrap();
    let b = add1(&mut s, &c, &req("c2", Some(&pod("web", "u2")), "b")).unwrap();
    assert_ne!(a, b);

    // Different UID but attached in an earlier boot: taken.
    let mut s = MemStore::default();
    let a = add1(&mut s, &c, &req("c1", Some(&old), "boot1")).unwrap();
    assert_eq!(
        add1(&mut s, &c, &req("c2", Some(&pod("web", "u2")), "boot2")).unwrap(),
        a
    );

    // No UID on either side (podman): names are unique among live containers.
    let mut s = MemStore::default();
    let a = add1(&mut s, &c, &req("c1", Some(&pod("web", "")), "b")).unwrap();
    assert_eq!(
        add1(&mut s, &c, &req("c2", Some(&pod("web", "")), "b")).unwrap(),
        a
    );
}

#[test]
fn full_range_reclaims_the_longest_released_or_refuses() {
    let c = small();
    let mut s = MemStore::default();
    let names = ["a", "b", "c", "d", "e"];
    let mut ips = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let cid = format!("c{i}");
        let p = pod(n, "u");
        ips.push(add1(&mut s, &c, &req(&cid, Some(&p), "b")).unwrap());
    }
    // Release in the order c, a, e, b, d: c was released longest ago.
    for i in [2, 0, 4, 1, 3] {
        let cid = format!("c{i}");
        let p = pod(names[i], "u");
        del(&mut s, &req(&cid, Some(&p), "b"), &[], 1).unwrap();
    }
    let refuse = config(r#"{"subnet":"10.0.0.0/29","whenExhausted":"refuse"}"#);
    let before = s.files.clone();
    let err = add1(&mut s, &refuse, &req("n1", Some(&pod("new", "u")), "b")).unwrap_err();
    assert!(matches!(err, AllocError::Exhausted { .. }));
    assert_eq!(s.files, before, "a refused ADD changes nothing");
    assert_eq!(
        add1(&mut s, &c, &req("n1", Some(&pod("new", "u")), "b")).unwrap(),
        ips[2]
    );
    assert_eq!(
        add1(&mut s, &c, &req("n2", Some(&pod("new2", "u")), "b")).unwrap(),
        ips[0]
    );
    // c's lease is gone with its address; a still-released pod keeps its own.
    assert_eq!(
        add1(&mut s, &c, &req("c9", Some(&pod("e", "u")), "b")).unwrap(),
        ips[4]
    );
}

#[test]
fn a_range_whose_only_room_is_a_released_lease_is_full_when_reclaim_is_refused() {
    // What STATUS (statusFailsWhenFull) asks: could a new pod get an address?
    let (mut s, c) = (MemStore::default(), small());
    let set = &c.range_sets[0];
    for i in 0..5 {
        let (cid, p) = (format!("c{i}"), pod(&format!("p{i}"), "u"));
        add1(&mut s, &c, &req(&cid, Some(&p), "b")).unwrap();
    }
    del(&mut s, &req("c0", Some(&pod("p0", "u")), "b"), &[], 1).unwrap();
    assert!(has_room(&mut s, set, 0, WhenExhausted::Reclaim).unwrap());
    assert!(!has_room(&mut s, set, 0, WhenExhausted::Refuse).unwrap());
    let refuse = config(r#"{"subnet":"10.0.0.0/29","whenExhausted":"refuse"}"#);
    assert!(matches!(
        add1(&mut s, &refuse, &req("n", Some(&pod("new", "u")), "b")),
        Err(AllocError::Exhausted { .. })
    ));
}

#[test]
fn attached_addresses_are_never_reclaimed() {
    let c = small();
    let mut s = MemStore::default();
    for i in 0..5 {
        let cid = format!("c{i}");
        let p = pod(&format!("p{i}"), "u");
        add1(&mut s, &c, &req(&cid, Some(&p), "b")).unwrap();
    }
    assert!(matches!(
        add1(&mut s, &c, &req("x", None, "b")),
        Err(AllocError::Exhausted { .. })
    ));
}

#[test]
fn a_lease_on_what_is_now_the_gateway_is_never_handed_out() {
    // The config moved the gateway onto a released lease: neither its pod (taking its lease
    // back) nor another pod (reclaiming) may get the gateway's address.
    let mut s = MemStore::default();
    let p = pod("web", "u");
    let first = add1(&mut s, &small(), &req("c1", Some(&p), "b")).unwrap();
    assert_eq!(first, ip("10.0.0.2"));
    del(&mut s, &req("c1", Some(&p), "b"), &[], 1).unwrap();
    let moved = config(r#"{"subnet":"10.0.0.0/29","gateway":"10.0.0.2"}"#);
    let again = add1(&mut s, &moved, &req("c2", Some(&p), "b")).unwrap();
    assert_ne!(again, ip("10.0.0.2"), "the pod was given the gateway");
    // Another pod's released lease on the gateway, in a full range: never reclaimed.
    let mut s = MemStore::default();
    let tiny = config(r#"{"subnet":"10.0.0.0/30"}"#);
    let q = pod("q", "u");
    assert_eq!(
        add1(&mut s, &tiny, &req("q1", Some(&q), "b")).unwrap(),
        ip("10.0.0.2")
    );
    del(&mut s, &req("q1", Some(&q), "b"), &[], 1).unwrap();
    let tiny_moved =
        config(r#"{"subnet":"10.0.0.0/30","rangeStart":"10.0.0.2","gateway":"10.0.0.2"}"#);
    assert!(matches!(
        add1(&mut s, &tiny_moved, &req("n1", Some(&pod("new", "u")), "b")),
        Err(AllocError::Exhausted { .. })
    ));
}

#[test]
fn requested_addresses() {
    let c = config(r#"{"subnet":"10.0.0.0/29"}"#);
    let mut s = MemStore::default();
    let with = |ips: &str| {
        let doc = format!(
            r#"{{"cniVersion":"1.0.0","name":"net","runtimeConfig":{{"ips":[{ips}]}},"ipam":{{"subnet":"10.0.0.0/29"}}}}"#
        );
        IpamConfig::from_netconf(&NetConf::parse(doc.as_bytes()).unwrap(), &Args::default())
            .unwrap()
    };
    assert_eq!(
        add1(&mut s, &with(r#""10.0.0.5""#), &req("c1", None, "b")).unwrap(),
        ip("10.0.0.5")
    );
    assert!(matches!(
        add1(&mut s, &with(r#""10.0.0.5""#), &req("c2", None, "b")),
        Err(AllocError::RequestedTaken { .. })
    ));
    assert!(matches!(
        assign_requested(&with(r#""10.0.0.1""#)),
        Err(AllocError::RequestedGateway { .. })
    ));
    assert!(matches!(
        assign_requested(&with(r#""10.9.0.1""#)),
        Err(AllocError::RequestedUnfulfilled(_))
    ));
    // The pod's own lease may be requested.
    let p = pod("web", "u");
    let a = add1(&mut s, &c, &req("c3", Some(&p), "b")).unwrap();
    del(&mut s, &req("c3", Some(&p), "b"), &[], 1).unwrap();
    let again = with(&format!("\"{a}\""));
    assert_eq!(add1(&mut s, &again, &req("c4", Some(&p), "b")).unwrap(), a);
}

#[test]
fn del_releases_every_range_set_even_when_prev_result_names_one() {
    // A previous result that lists only one family's address must not leave the other
    // family's record of the same attachment allocated forever.
    let c = config(r#"{"ranges":[[{"subnet":"10.0.0.0/29"}],[{"subnet":"2001:db8::/125"}]]}"#);
    let mut s = MemStore::default();
    let got: Vec<IpAddr> = add(&mut s, &c, &req("c1", None, "b"), &[None, None])
        .unwrap()
        .iter()
        .map(|a| a.ip)
        .collect();
    assert_eq!(
        del(&mut s, &req("c1", None, "b"), &got[..1], c.range_sets.len()).unwrap(),
        2
    );
    assert!(s.files.is_empty(), "left allocated: {:?}", s.files.keys());
}

#[test]
fn dual_stack_is_sticky_per_family() {
    let c = config(r#"{"ranges":[[{"subnet":"10.0.0.0/29"}],[{"subnet":"2001:db8::/125"}]]}"#);
    let mut s = MemStore::default();
    let p = pod("web", "u");
    let first: Vec<IpAddr> = add(&mut s, &c, &req("c1", Some(&p), "b"), &[None, None])
        .unwrap()
        .iter()
        .map(|a| a.ip)
        .collect();
    assert_eq!(first.len(), 2);
    assert!(first[0].is_ipv4() && first[1].is_ipv6());
    del(&mut s, &req("c1", Some(&p), "b"), &[], 2).unwrap();
    add1(&mut s, &c, &req("x", Some(&pod("x", "u")), "b")).unwrap();
    let again: Vec<IpAddr> = add(&mut s, &c, &req("c2", Some(&p), "b"), &[None, None])
        .unwrap()
        .iter()
        .map(|a| a.ip)
        .collect();
    assert_eq!(again, first);
}

#[test]
fn a_failing_range_set_changes_nothing() {
    let c = config(r#"{"ranges":[[{"subnet":"10.0.0.0/29"}],[{"subnet":"10.1.0.0/30"}]]}"#);
    let mut s = MemStore::default();
    add(&mut s, &c, &req("c1", None, "b"), &[None, None]).unwrap();
    let before = s.files.clone();
    assert!(matches!(
        add(&mut s, &c, &req("c2", None, "b"), &[None, None]),
        Err(AllocError::Exhausted { .. })
    ));
    assert_eq!(s.files, before);
}

#[test]
fn adopted_host_local_and_openyurt_records() {
    let c = small();
    let mut s = MemStore::default();
    s.put_raw("10.0.0.2", b"old1\r\neth0");
    s.put_raw("10.0.0.3", b"old2\r\neth0");
    s.put_raw("10.0.0.3_ns_yurt", b"");
    s.put_raw("10.0.0.4_ns_gone", b"");
    let fresh = add1(&mut s, &c, &req("n", Some(&pod("n", "u")), "b")).unwrap();
    assert_eq!(
        fresh,
        ip("10.0.0.5"),
        "held and leased addresses are skipped"
    );
    // DEL with pod identity turns host-local's record into a lease the pod gets back.
    let p = pod("web", "u");
    assert_eq!(del(&mut s, &req("old1", Some(&p), "b"), &[], 1).unwrap(), 1);
    assert!(!s.files.contains_key("10.0.0.2"));
    assert_eq!(
        add1(&mut s, &c, &req("new", Some(&p), "b")).unwrap(),
        ip("10.0.0.2")
    );
    // OpenYurt: marker + <ip>; DEL by container id leaves the marker as a lease.
    assert_eq!(del(&mut s, &req("old2", None, "b"), &[], 1).unwrap(), 1);
    assert!(s.files.contains_key("10.0.0.3_ns_yurt") && !s.files.contains_key("10.0.0.3"));
    assert_eq!(
        add1(&mut s, &c, &req("y2", Some(&pod("yurt", "u")), "b")).unwrap(),
        ip("10.0.0.3")
    );
    // A lone marker is a released lease of its pod.
    assert_eq!(
        add1(&mut s, &c, &req("g2", Some(&pod("gone", "u")), "b")).unwrap(),
        ip("10.0.0.4")
    );
}

#[test]
fn crash_leftovers_resolve_to_what_the_operation_meant() {
    let c = small();
    let p = pod("web", "u");
    let lease = |state: &str, cid: &str| {
        format!(
            r#"{{"format":"sticky-ipam/v1","containerId":"{cid}","ifname":"eth0","namespace":"ns","pod":"web","podUid":"u","boot":"b","state":"{state}","releaseSeq":4,"releasedAt":1}}"#
        )
    };
    // Conversion of an adopted record interrupted: the lease wins.
    let mut s = MemStore::default();
    s.put_raw("10.0.0.2", b"old\r\neth0");
    s.put_raw("10.0.0.2_ns_web", lease("released", "old").as_bytes());
    assert_eq!(
        add1(&mut s, &c, &req("new", Some(&p), "b")).unwrap(),
        ip("10.0.0.2")
    );
    assert_eq!(s.files.keys().collect::<Vec<_>>(), ["10.0.0.2_ns_web"]);
    // A released lease under a live host-local attachment is dropped.
    let mut s = MemStore::default();
    s.put_raw("10.0.0.2", b"live\r\neth0");
    s.put_raw("10.0.0.2_ns_web", lease("released", "old").as_bytes());
    assert_ne!(
        add1(&mut s, &c, &req("new", Some(&p), "b")).unwrap(),
        ip("10.0.0.2")
    );
    assert_eq!(
        s.files.get("10.0.0.2").map(Vec::as_slice),
        Some(&b"live\r\neth0"[..])
    );
    assert!(!s.files.contains_key("10.0.0.2_ns_web"));
}

#[test]
fn interrupted_takeover_of_an_openyurt_attachment_never_loses_the_new_one() {
    // podman (no UID) takes over `<ip>` + marker; killed after the lease was renamed in,
    // before `<ip>` was removed: the old host-local file is a leftover, never a live record.
    let c = small();
    let p = Pod {
        namespace: String::new(),
        name: "web".into(),
        uid: String::new(),
    };
    let live =
        |s: &mut MemStore| check(s, &c, &req("new", Some(&p), "b"), &[ip("10.0.0.2")]).is_ok();
    let mut s = MemStore::default();
    s.put_raw("10.0.0.2", b"old\r\neth0");
    s.put_raw(
        "10.0.0.2__web",
        br#"{"format":"sticky-ipam/v1","containerId":"new","ifname":"eth0","namespace":"","pod":"web","podUid":"","boot":"b","state":"attached","releaseSeq":0,"releasedAt":0}"#,
    );
    // The runtime retries the ADD; then the dead sandbox's late DEL comes.
    assert_eq!(
        add1(&mut s, &c, &req("new", Some(&p), "b")).unwrap(),
        ip("10.0.0.2")
    );
    assert_eq!(s.files.keys().collect::<Vec<_>>(), ["10.0.0.2__web"]);
    assert_eq!(
        del(&mut s, &req("old", Some(&p), "b"), &[ip("10.0.0.2")], 1).unwrap(),
        0
    );
    assert!(live(&mut s), "the live sandbox lost its address");
    // Same leftover met first by the late DEL.
    let mut s2 = MemStore::default();
    s2.put_raw("10.0.0.2", b"old\r\neth0");
    s2.put_raw("10.0.0.2__web", &s.files["10.0.0.2__web"].clone());
    assert_eq!(
        del(&mut s2, &req("old", Some(&p), "b"), &[ip("10.0.0.2")], 1).unwrap(),
        0
    );
    assert!(live(&mut s2), "the live sandbox lost its address");
}

#[test]
fn check_consults_prev_result() {
    let c = small();
    let mut s = MemStore::default();
    let p = pod("web", "u");
    let a = add1(&mut s, &c, &req("c1", Some(&p), "b")).unwrap();
    check(&mut s, &c, &req("c1", Some(&p), "b"), &[a]).unwrap();
    check(&mut s, &c, &req("c1", Some(&p), "b"), &[]).unwrap();
    assert!(matches!(
        check(&mut s, &c, &req("c2", Some(&p), "b"), &[a]),
        Err(CheckError::NotRecorded { .. })
    ));
    assert!(matches!(
        check(&mut s, &c, &req("c1", Some(&p), "b"), &[ip("10.0.0.6")]),
        Err(CheckError::NotRecorded { .. })
    ));
    // Addresses of other networks in prevResult are not ours to judge.
    check(&mut s, &c, &req("c1", Some(&p), "b"), &[a, ip("192.0.2.9")]).unwrap();
    assert!(matches!(
        check(&mut s, &c, &req("zz", None, "b"), &[]),
        Err(CheckError::NoAttachment { .. })
    ));
}

#[test]
fn sticky_off_behaves_like_host_local() {
    let c = config(r#"{"subnet":"10.0.0.0/29","sticky":false}"#);
    let mut s = MemStore::default();
    let p = pod("web", "u");
    let r = Request {
        sticky: false,
        ..req("c1", Some(&p), "b")
    };
    let a = add1(&mut s, &c, &r).unwrap();
    assert_eq!(
        add1(&mut s, &c, &r).unwrap(),
        a,
        "idempotent without leases too"
    );
    assert_eq!(
        s.files.get(&a.to_string()).map(Vec::as_slice),
        Some(&b"c1\r\neth0"[..])
    );
    del(&mut s, &r, &[], 1).unwrap();
    assert!(s.files.is_empty());
}

#[test]
fn del_without_prev_result_or_pod_name_still_finds_a_lease() {
    let (mut s, c) = (MemStore::default(), small());
    let p = pod("web", "u");
    let a = add1(&mut s, &c, &req("c1", Some(&p), "b")).unwrap();
    add1(&mut s, &c, &req("c2", Some(&pod("other", "u")), "b")).unwrap();
    assert_eq!(del(&mut s, &req("c1", None, "b"), &[], 1).unwrap(), 1);
    let lease = s.records().into_iter().find(|r| r.ip == a).unwrap();
    assert!(matches!(&lease.body, Body::Lease(l) if l.state == State::Released));
    assert!(
        s.records().iter().any(|r| r.is_attachment("c2", "eth0")),
        "only c1's lease"
    );
}
