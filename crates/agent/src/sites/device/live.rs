//! The device as the host holds it. `sticky-wg` makes the device (a persistent TUN) and serves
//! its WireGuard socket, which [`Live`] speaks to ([`uapi::Uapi`]); over netlink it sets the
//! device's MTU, brings it up, and routes the remote sites' pod subnets into it (proto 118,
//! sticky-cni's, as the VTEP's routes: [`route_changes`] is the pure part).

use std::collections::HashSet;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use sticky_netlink::route::Route;
use sticky_netlink::socket::Socket;
use sticky_netlink::{link, route};
use sticky_overlay::ROUTE_PROTOCOL;
use sticky_sites::keys::PrivateKey;
use sticky_sites::tunnel::{DeviceState, PeerChange};

use super::{Device, Error, uapi};

/// The route into device `index` for `dst`.
fn into_device(dst: IpNet, index: u32) -> Route {
    Route {
        dst,
        gateway: None,
        oif: Some(index),
        onlink: false,
        metric: 0,
        protocol: ROUTE_PROTOCOL,
    }
}

/// Pure: the routes to add and to delete so that device `index` holds exactly one route of
/// ours for each of `want`; other routes (other devices, other protocols) are not ours.
pub fn route_changes(want: &[IpNet], have: &[Route], index: u32) -> (Vec<Route>, Vec<Route>) {
    let wanted: HashSet<Route> = want.iter().map(|d| into_device(d.trunc(), index)).collect();
    let ours: HashSet<&Route> = have
        .iter()
        .filter(|r| r.oif == Some(index) && r.protocol == ROUTE_PROTOCOL)
        .collect();
    let mut add: Vec<Route> = wanted
        .iter()
        .filter(|r| !ours.contains(r))
        .cloned()
        .collect();
    let mut del: Vec<Route> = ours
        .into_iter()
        .filter(|r| !wanted.contains(*r))
        .cloned()
        .collect();
    add.sort_by_key(|r| r.dst);
    del.sort_by_key(|r| r.dst);
    (add, del)
}

/// The host's device: `sticky-wg`'s socket under `socket_dir`, netlink, a UDP socket.
#[derive(Debug, Clone)]
pub struct Live {
    uapi: uapi::Uapi,
}

impl Live {
    /// Each exchange with the socket bounded by `timeout`.
    pub fn new(socket_dir: impl Into<PathBuf>, timeout: Duration) -> Live {
        Live {
            uapi: uapi::Uapi::new(socket_dir, timeout),
        }
    }
}

/// The link named `ifname`.
fn device(sock: &mut Socket, ifname: &str) -> Result<link::Link, Error> {
    link::get(sock, ifname)
        .map_err(|source| Error::Link {
            ifname: ifname.into(),
            source,
        })?
        .ok_or_else(|| Error::NoDevice(ifname.into()))
}

impl Device for Live {
    fn ensure(&self, ifname: &str, mtu: u32) -> Result<(), Error> {
        let mut sock = Socket::open()?;
        let dev = device(&mut sock, ifname)?;
        let failed = |source| Error::Link {
            ifname: ifname.into(),
            source,
        };
        if dev.mtu != Some(mtu) {
            link::set_mtu(&mut sock, &dev, mtu).map_err(failed)?;
        }
        if !dev.up {
            link::set_up(&mut sock, &dev).map_err(failed)?;
        }
        Ok(())
    }

    fn get(&self, ifname: &str) -> Result<DeviceState, Error> {
        self.uapi.get(ifname).map_err(|source| Error::Uapi {
            ifname: ifname.into(),
            source,
        })
    }

    fn set(
        &self,
        ifname: &str,
        key: Option<&PrivateKey>,
        port: Option<u16>,
        changes: &[PeerChange],
    ) -> Result<(), Error> {
        self.uapi
            .set(ifname, key, port, changes)
            .map_err(|source| Error::Uapi {
                ifname: ifname.into(),
                source,
            })
    }

    fn routes(&self, ifname: &str, want: &[IpNet]) -> Result<(), Error> {
        let mut sock = Socket::open()?;
        let dev = device(&mut sock, ifname)?;
        let have = route::list(&mut sock)?;
        let (add, del) = route_changes(want, &have, dev.index);
        for r in &del {
            route::delete(&mut sock, r)?;
        }
        for r in &add {
            route::replace(&mut sock, r)?;
        }
        Ok(())
    }

    fn nudge(&self, to: SocketAddr) -> Result<(), Error> {
        let any: SocketAddr = match to {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let failed = |source| Error::Nudge { to, source };
        let sock = UdpSocket::bind(any).map_err(failed)?;
        sock.send_to(b"sticky-cni: handshake", to).map_err(failed)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn only_our_routes_on_the_device_are_changed() {
        let have = vec![
            into_device(net("198.18.21.0/24"), 7),
            into_device(net("198.18.99.0/24"), 7),
            // Someone else's route on the device, and ours on another device: not ours to touch.
            Route {
                protocol: 4,
                ..into_device(net("198.18.50.0/24"), 7)
            },
            into_device(net("198.18.98.0/24"), 3),
        ];
        let (add, del) = route_changes(&[net("198.18.21.0/24"), net("198.18.1.0/24")], &have, 7);
        assert_eq!(add, vec![into_device(net("198.18.1.0/24"), 7)]);
        assert_eq!(del, vec![into_device(net("198.18.99.0/24"), 7)]);
        let (add, del) = route_changes(&[net("198.18.21.0/24"), net("198.18.99.0/24")], &have, 7);
        assert!(add.is_empty() && del.is_empty());
    }
}
