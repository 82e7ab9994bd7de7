//! The one seam between the sites round and the gateway's device: the WireGuard tunnel (its
//! key, port and peers over the userspace API), the routes of the remote sites' pod subnets
//! into it, and the datagram that makes the tunnel handshake at once. [`Live`] is the host's
//! (`sticky-wg`'s socket, netlink, a UDP socket); [`fake::Fake`] records every call and keeps
//! the device in memory, for the tests and the simulation.

mod live;

#[cfg(test)]
pub mod fake;

use std::net::SocketAddr;

use ipnet::IpNet;
use sticky_sites::keys::PrivateKey;
use sticky_sites::tunnel::{DeviceState, PeerChange};

pub use live::Live;

use super::uapi;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no tunnel device {0}: it is made by sticky-wg (is `sticky-wg {0}` running? docs/sites.md)"
    )]
    NoDevice(String),
    #[error("tunnel device {ifname}: {source}")]
    Link {
        ifname: String,
        #[source]
        source: sticky_netlink::link::Error,
    },
    #[error(transparent)]
    Route(#[from] sticky_netlink::route::Error),
    #[error(transparent)]
    Socket(#[from] sticky_netlink::socket::Error),
    #[error("tunnel device {ifname}: {source}")]
    Uapi {
        ifname: String,
        #[source]
        source: uapi::Error,
    },
    #[error("a datagram to {to} to start a handshake: {source}")]
    Nudge {
        to: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The gateway's device (see the module doc). Every method names the device; none keeps
/// anything between calls but what the device itself holds.
pub trait Device {
    /// The device exists (`sticky-wg` made it) and is up with this MTU. Whether its daemon
    /// answers is the next `get`'s to say (the round reads the device right after).
    fn ensure(&self, ifname: &str, mtu: u32) -> Result<(), Error>;
    /// The device's state.
    fn get(&self, ifname: &str) -> Result<DeviceState, Error>;
    /// One transaction: the private key and the listen port (each when given) and the peer
    /// changes. Give the key with every change that adds or updates a peer: a device made again
    /// between two transactions must never get peers without its key, and a key or port the
    /// device already has changes nothing (a new key re-keys every session). Nothing given: no
    /// request at all.
    fn set(
        &self,
        ifname: &str,
        key: Option<&PrivateKey>,
        port: Option<u16>,
        changes: &[PeerChange],
    ) -> Result<(), Error>;
    /// The device's routes of ours become exactly `want` (one route per subnet). A device that
    /// does not exist is an error ([`Error::NoDevice`]).
    fn routes(&self, ifname: &str, want: &[IpNet]) -> Result<(), Error>;
    /// One datagram to `to`, which the routes send into the tunnel.
    fn nudge(&self, to: SocketAddr) -> Result<(), Error>;
}
