//! The netlink layer against a real kernel: work in another namespace never leaks back to the
//! calling thread (even when it panics), and the kernel's errno reaches the caller. (Links read
//! field by field against the full decoder: `netlink::link`'s unit tests.)

use sticky_testkit::vxlan_support;

use std::path::Path;

use sticky_netlink::{Socket, link, netns, sysctl};
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
