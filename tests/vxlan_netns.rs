//! The netlink layer against a real kernel: work in another namespace never leaks back to the
//! calling thread (even when it panics), and the kernel's errno reaches the caller.

mod vxlan_support;

use std::path::Path;

use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{InfoKind, LinkMessage};
use sticky_cni::netlink::{Socket, link, netns, sysctl};
use vxlan_support::*;

fn my_netns() -> std::path::PathBuf {
    std::fs::read_link("/proc/thread-self/ns/net").unwrap()
}

#[test]
#[ignore = "needs root: network namespaces"]
fn work_in_a_namespace_runs_there_and_never_leaks_back() {
    assert_can_run();
    let topo = Topo::new(1500);
    let path = format!("/run/netns/{}", topo.underlay);
    let before = my_netns();
    let (inside, has_br0) = netns::run_in(Path::new(&path), || {
        let mut sock = Socket::open().unwrap();
        (my_netns(), link::get(&mut sock, "br0").unwrap().is_some())
    })
    .unwrap();
    assert_ne!(inside, before);
    assert!(has_br0, "the socket was opened inside the namespace");
    assert_eq!(my_netns(), before);

    // A panic inside is reported, and the caller is still home.
    let err = netns::run_in(Path::new(&path), || panic!("boom")).unwrap_err();
    assert!(matches!(err, netns::Error::Panicked { .. }), "{err}");
    assert_eq!(my_netns(), before);

    // Sysctls written from inside land in that namespace only.
    let host_value = sysctl::read("net/ipv4/conf/all/arp_notify").unwrap();
    netns::run_in(Path::new(&path), || {
        sysctl::write("net/ipv4/conf/all/arp_notify", "1")
    })
    .unwrap()
    .unwrap();
    let inner = netns::run_in(Path::new(&path), || {
        sysctl::read("net/ipv4/conf/all/arp_notify")
    })
    .unwrap()
    .unwrap();
    assert_eq!(inner, "1");
    assert_eq!(
        sysctl::read("net/ipv4/conf/all/arp_notify").unwrap(),
        host_value
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn kernel_errno_reaches_the_caller() {
    assert_can_run();
    let topo = Topo::new(1500);
    let path = format!("/run/netns/{}", topo.underlay);
    netns::run_in(Path::new(&path), || {
        let mut sock = Socket::open().unwrap();
        // Creating a second br0 in the same namespace: EEXIST, kept as such.
        let err = link::add_bridge(&mut sock, "br0", None, None).unwrap_err();
        assert_eq!(err.errno(), Some(nix::errno::Errno::EEXIST as i32), "{err}");
        assert!(err.to_string().contains("br0"), "{err}");
        // Deleting a missing link is success; looking it up is None.
        link::delete(&mut sock, "nosuchlink").unwrap();
        assert!(link::get(&mut sock, "nosuchlink").unwrap().is_none());
        // A dump returns every link (multipart until DONE).
        let names: Vec<String> = link::list(&mut sock)
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert!(
            names.contains(&"lo".to_string()) && names.contains(&"br0".to_string()),
            "{names:?}"
        );
    })
    .unwrap();
}

#[test]
#[ignore = "needs root: network namespaces"]
fn links_read_field_by_field_are_what_full_decoding_reads_from_the_kernel() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let ns = topo.node_ns(1);
    for args in [
        &[
            "link",
            "add",
            "vt0",
            "type",
            "vxlan",
            "id",
            "42",
            "local",
            "192.0.2.1",
            "dev",
            "eth0",
            "dstport",
            "8472",
            "nolearning",
        ][..],
        &["link", "add", "br9", "mtu", "1400", "type", "bridge"],
        &["link", "add", "vh0", "type", "veth", "peer", "name", "vp0"],
        &["link", "set", "vh0", "master", "br9", "up"],
        &["link", "set", "vt0", "alias", "sticky-vxlan:vtep x", "up"],
    ] {
        topo.ip(1, args);
    }
    let path = format!("/run/netns/{ns}");
    let (fast, full, one) = netns::run_in(Path::new(&path), || {
        let mut sock = Socket::open().unwrap();
        let fast = link::list(&mut sock).unwrap();
        let full: Vec<link::Link> = sock
            .dump("t", RouteNetlinkMessage::GetLink(LinkMessage::default()))
            .unwrap()
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(link::Link::from_message(l)),
                _ => None,
            })
            .collect();
        let one = link::get(&mut sock, "vt0").unwrap();
        let vxlan = link::list_kind(&mut sock, InfoKind::Vxlan).unwrap();
        let at = link::get_at(&mut sock, one.as_ref().unwrap().index).unwrap();
        let none = link::get_at(&mut sock, 999_999).unwrap();
        assert_eq!(vxlan, vec![one.clone().unwrap()], "only the VXLAN device");
        assert_eq!(at, one);
        assert_eq!(none, None);
        (fast, full, one)
    })
    .unwrap();
    assert_eq!(fast, full);
    let vt0 = fast.iter().find(|l| l.name == "vt0").unwrap();
    assert_eq!(one.as_ref(), Some(vt0));
    let v = vt0.vxlan.as_ref().unwrap();
    assert_eq!(
        (v.vni, v.port, v.learning),
        (Some(42), Some(8472), Some(false))
    );
    assert_eq!(vt0.alias.as_deref(), Some("sticky-vxlan:vtep x"));
    let br9 = fast.iter().find(|l| l.name == "br9").unwrap();
    let vh0 = fast.iter().find(|l| l.name == "vh0").unwrap();
    assert_eq!(vh0.master, Some(br9.index));
    assert_eq!(vh0.kind.as_deref(), Some("veth"));
}
