//! The tunnel device as the kernel holds it. `sticky-wg` makes the device (a persistent TUN)
//! and serves its WireGuard socket; the agent sets the device's MTU, brings it up, and routes
//! the remote sites' pod subnets into it (proto 118, sticky-cni's, as the VTEP's routes).
//! [`route_changes`] is the pure decision; [`Kernel`] carries it out over netlink.

use std::collections::HashSet;

use ipnet::IpNet;
use sticky_netlink::route::Route;
use sticky_netlink::socket::Socket;
use sticky_netlink::{link, route};
use sticky_overlay::ROUTE_PROTOCOL;

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
        source: link::Error,
    },
    #[error(transparent)]
    Route(#[from] route::Error),
    #[error(transparent)]
    Socket(#[from] sticky_netlink::socket::Error),
}

/// Routes into the tunnel device.
pub trait Routes {
    /// The device's routes of ours become exactly `want` (one route per subnet); returns how
    /// many were added and removed. A device that does not exist is an error.
    fn sync(&self, ifname: &str, want: &[IpNet]) -> Result<(usize, usize), Error>;
}

/// The route into device `index` for `dst`.
fn into_device(dst: IpNet, index: u32) -> Route {
    Route {
        dst,
        gateway: None,
        oif: Some(index),
        onlink: false,
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

/// The host's kernel, over netlink.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kernel;

impl Kernel {
    fn device(sock: &mut Socket, ifname: &str) -> Result<link::Link, Error> {
        link::get(sock, ifname)
            .map_err(|source| Error::Link {
                ifname: ifname.into(),
                source,
            })?
            .ok_or_else(|| Error::NoDevice(ifname.into()))
    }
}

impl sticky_sites::uapi::Link for Kernel {
    fn ensure(&self, ifname: &str, mtu: u32) -> Result<(), String> {
        let run = || -> Result<(), Error> {
            let mut sock = Socket::open()?;
            let dev = Kernel::device(&mut sock, ifname)?;
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
        };
        run().map_err(|e| e.to_string())
    }

    fn remove(&self, ifname: &str) -> Result<(), String> {
        let mut sock = Socket::open().map_err(|e| e.to_string())?;
        match link::get(&mut sock, ifname) {
            Ok(None) => Ok(()),
            Ok(Some(_)) => link::delete(&mut sock, ifname).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Routes for Kernel {
    fn sync(&self, ifname: &str, want: &[IpNet]) -> Result<(usize, usize), Error> {
        let mut sock = Socket::open()?;
        let dev = Kernel::device(&mut sock, ifname)?;
        let have = route::list(&mut sock)?;
        let (add, del) = route_changes(want, &have, dev.index);
        for r in &del {
            route::delete(&mut sock, r)?;
        }
        for r in &add {
            route::replace(&mut sock, r)?;
        }
        Ok((add.len(), del.len()))
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
