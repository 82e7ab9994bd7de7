//! A small synchronous netlink layer for `sticky-vxlan`.
//!
//! A blocking rtnetlink socket ([`socket`]) over `netlink-packet-route` and `netlink-sys`, with
//! one file per kind of object ([`link`], [`addr`], [`route`], [`neigh`]), the one error of
//! its decoders ([`decode`]), plus entering a
//! network namespace safely ([`netns`]) and sysctls ([`sysctl`]). No async runtime: a CNI
//! plugin lives for one call and wants a blocking socket.

pub mod addr;
mod decode;
pub mod link;
pub mod neigh;
pub mod netns;
pub mod route;
pub mod socket;
pub mod sysctl;

pub use socket::Socket;

/// For the root tests of this layer: the `ip` arguments of a VXLAN device `vt0` (VNI 42, port
/// 8472, no learning) on `eth0` at 192.0.2.1.
#[cfg(test)]
pub(crate) const TEST_VTEP: &[&str] = &[
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
];

/// For the root tests of this layer: the `ip` commands of a node, `eth0` (a veth end: the dummy
/// driver is not in every kernel) at 192.0.2.1/24 and [`TEST_VTEP`] on it.
#[cfg(test)]
pub(crate) const TEST_NODE: &[&[&str]] = &[
    &[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
    ],
    &["address", "add", "192.0.2.1/24", "dev", "eth0"],
    TEST_VTEP,
];

/// For the root tests of this layer: runs `f` on a thread of its own in a network namespace of
/// its own (gone with the thread, even when an assertion fails), after the `ip` commands
/// `setup` (each one's arguments; each must succeed).
#[cfg(test)]
pub(crate) fn in_own_netns<T: Send + 'static>(
    setup: &[&[&str]],
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let setup: Vec<Vec<String>> = setup
        .iter()
        .map(|args| args.iter().map(|a| a.to_string()).collect())
        .collect();
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        for args in &setup {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        }
        f()
    })
    .join()
    .unwrap()
}
