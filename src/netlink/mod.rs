//! A small synchronous netlink layer for `sticky-vxlan`.
//!
//! A blocking rtnetlink socket ([`socket`]) over `netlink-packet-route` and `netlink-sys`, with
//! one file per kind of object ([`link`], [`addr`], [`route`], [`neigh`]), the one error of
//! its decoders ([`decode`]), plus entering a
//! network namespace safely ([`netns`]) and sysctls ([`sysctl`]). No async runtime: a CNI
//! plugin lives for one call and wants a blocking socket.

pub mod addr;
pub mod decode;
pub mod link;
pub mod neigh;
pub mod netns;
pub mod route;
pub mod socket;
pub mod sysctl;

pub use socket::Socket;
