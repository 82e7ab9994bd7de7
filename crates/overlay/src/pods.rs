//! What ADD and DEL do to one pod's interface, behind a seam: the veth pair (the host end on
//! the bridge, the container end created directly in the pod's namespace), the container
//! end's MAC, addresses, state and routes, and removing the host end again.
//!
//! Both modes go through [`Pods`] ([`super::kernel::Kernel`] is the node's seam; [`Pods`] is
//! the pod's, implemented by the same [`Live`] so that one socket serves both). The tests use
//! the recording fake (`super::fake_pods`), so ADD's and DEL's decisions, and the one
//! rollback decision both modes share ([`after_ipam`], carried out by [`settle`]), are tested
//! without root. Names, aliases, routes and CHECK are [`super::pod`]'s.

use std::path::Path;

use ipnet::IpNet;

use super::Error;
use super::kernel::{Kernel, Live};
use cni_protocol::delegate::Error as Delegate;
use cni_protocol::{CniResult, Route};
use sticky_netlink::link::{self, Link};
use sticky_netlink::route as nlroute;
use sticky_netlink::{Socket, addr, netns, sysctl};

/// `ip route add`'s protocol (`proto boot`) for the pod's own routes.
const RTPROT_BOOT: u8 = 3;

/// The kernel's limit on an interface alias (IFALIASZ, with its NUL).
pub(crate) const MAX_ALIAS: usize = 256;

/// One pod's veth pair, as [`Pods::create_veth`] makes it.
#[derive(Debug, Clone)]
pub struct Veth<'a> {
    /// The pod's network namespace, where the container end is created.
    pub netns: &'a Path,
    /// The host end's name ([`super::pod::host_veth_name`]) and alias
    /// ([`super::pod::host_alias`]; left out when longer than the kernel allows).
    pub host: &'a str,
    pub alias: String,
    /// The container end's name (`CNI_IFNAME`).
    pub ifname: &'a str,
    pub mtu: u32,
    /// The bridge's index.
    pub bridge: u32,
    pub hairpin: bool,
    /// The container end's MAC when it is known before IPAM has answered (else
    /// [`Setup::mac`] sets it before the link comes up).
    pub mac: Option<[u8; 6]>,
    /// No IPv6 on the host end, set before it comes up (the segment mode keeps the node off
    /// its segment).
    pub ipv6_off: bool,
}

/// What the container end gets once its addresses are known.
#[derive(Debug, Clone)]
pub struct Setup<'a> {
    /// Set when the link's MAC differs.
    pub mac: Option<[u8; 6]>,
    pub addresses: &'a [IpNet],
    /// Brought up, and then given its routes; a link left down gets no route.
    pub up: bool,
    /// Each with its gateway worked out.
    pub routes: &'a [Route],
}

/// What ADD and DEL do to a pod's interface.
pub trait Pods {
    /// The container end, reached from inside the pod's namespace.
    type Container;

    /// Creates the pair: the host end a port of the bridge, marked with its alias and up; the
    /// container end, down, in the pod's namespace. Returns the host end. It needs no address,
    /// so ADD makes it while IPAM is still working.
    fn create_veth(&mut self, v: &Veth<'_>) -> Result<Link, Error>;

    /// Reaches the container end `ifname` in `netns`, and sets `arp_notify` on it when asked
    /// (so that its MAC is announced when it comes up). Needs no address either.
    fn enter(
        &mut self,
        netns: &Path,
        ifname: &str,
        arp_notify: bool,
    ) -> Result<Self::Container, Error>;

    /// MAC, addresses, up, routes, in that order. Returns the container end as it now is.
    fn configure(&mut self, container: Self::Container, setup: &Setup<'_>) -> Result<Link, Error>;

    /// Removes the host end `host`, and with it the pair; a missing link is success.
    fn delete_veth(&mut self, host: &str) -> Result<(), Error>;
}

/// The real container end: a socket opened inside the pod's namespace (a netlink socket stays
/// in the namespace it was opened in, whichever thread uses it later) and the link.
pub struct Container {
    sock: Socket,
    link: Link,
}

impl Pods for Live<'_> {
    type Container = Container;

    /// Three requests in the host namespace: the pair (a bridge port from the start), a
    /// look-up of the host end, its alias and up in one.
    fn create_veth(&mut self, v: &Veth<'_>) -> Result<Link, Error> {
        let ns = netns::open(v.netns)?;
        link::add_veth(
            self.sock,
            &link::VethSpec {
                host: v.host,
                peer: v.ifname,
                peer_netns: std::os::fd::AsFd::as_fd(&ns),
                peer_mac: v.mac,
                mtu: v.mtu,
                master: Some(v.bridge),
            },
        )?;
        let mut host_link = link::require(self.sock, v.host)?;
        if v.ipv6_off {
            self.disable_ipv6(v.host)?;
        }
        let alias = (v.alias.len() < MAX_ALIAS).then_some(v.alias.as_str());
        link::set_up_with_alias(self.sock, &host_link, alias)?;
        host_link.up = true;
        host_link.alias = alias.map(str::to_string);
        if v.hairpin {
            link::set_hairpin(v.host)?;
        }
        Ok(host_link)
    }

    /// On a thread inside the pod's namespace: its socket opened, the container end looked
    /// up, and `arp_notify` set (`/proc/sys` shows the namespace of the thread that opens it,
    /// so it is done here).
    fn enter(&mut self, netns: &Path, ifname: &str, arp_notify: bool) -> Result<Container, Error> {
        netns::run_in(netns, || -> Result<Container, Error> {
            let mut sock = Socket::open()?;
            let link = link::require(&mut sock, ifname)?;
            if arp_notify {
                sysctl::write(&format!("net/ipv4/conf/{ifname}/arp_notify"), "1")?;
            }
            Ok(Container { sock, link })
        })?
    }

    fn configure(&mut self, container: Container, s: &Setup<'_>) -> Result<Link, Error> {
        let Container { mut sock, mut link } = container;
        if let Some(mac) = s.mac.filter(|m| link.mac != Some(*m)) {
            link::set_mac(&mut sock, &link, mac)?;
            link.mac = Some(mac);
        }
        for net in s.addresses {
            addr::add(&mut sock, link.index, *net)?;
        }
        if !s.up {
            return Ok(link);
        }
        link::set_up(&mut sock, &link)?;
        link.up = true;
        for r in s.routes {
            nlroute::replace(
                &mut sock,
                &nlroute::Route {
                    dst: r.dst.trunc(),
                    gateway: r.gw,
                    oif: Some(link.index),
                    onlink: false,
                    metric: 0,
                    protocol: RTPROT_BOOT,
                },
            )?;
        }
        Ok(link)
    }

    fn delete_veth(&mut self, host: &str) -> Result<(), Error> {
        Ok(link::delete(self.sock, host)?)
    }
}

/// [`Live`] on a socket of its own, opened where it is first used: DEL removes the veth on a
/// thread of its own, and a socket that cannot be opened is that removal's error.
#[derive(Default)]
pub struct LiveOnDemand {
    sock: Option<Socket>,
}

impl LiveOnDemand {
    fn live(&mut self) -> Result<Live<'_>, Error> {
        let sock = match &mut self.sock {
            Some(sock) => sock,
            none => none.insert(Socket::open()?),
        };
        Ok(Live { sock })
    }
}

impl Pods for LiveOnDemand {
    type Container = Container;

    fn create_veth(&mut self, v: &Veth<'_>) -> Result<Link, Error> {
        self.live()?.create_veth(v)
    }
    fn enter(&mut self, netns: &Path, ifname: &str, arp_notify: bool) -> Result<Container, Error> {
        self.live()?.enter(netns, ifname, arp_notify)
    }
    fn configure(&mut self, container: Container, s: &Setup<'_>) -> Result<Link, Error> {
        self.live()?.configure(container, s)
    }
    fn delete_veth(&mut self, host: &str) -> Result<(), Error> {
        self.live()?.delete_veth(host)
    }
}

/// What ADD does once IPAM has answered and the node and the veth are ready (or failed).
#[derive(Debug)]
pub enum AfterIpam<N, E> {
    /// Both worked: attach the pod.
    Attach(N, CniResult),
    /// IPAM may have allocated: give it back (IPAM DEL), then report this error.
    RollBack(E),
    /// IPAM allocated nothing: report this error.
    Fail(E),
}

/// Pure: the node's outcome and IPAM's, to what ADD does next; both modes decide with it (a
/// mode without IPAM for a pod passes its fixed addresses as IPAM's answer). The node's
/// problem, if any, is the one reported (it is the one to fix first).
pub fn after_ipam<N, E: From<Delegate>>(
    node: Result<N, E>,
    ipam: Result<CniResult, Delegate>,
) -> AfterIpam<N, E> {
    match (node, ipam) {
        (Ok(n), Ok(result)) => AfterIpam::Attach(n, result),
        (Err(e), Ok(_)) => AfterIpam::RollBack(e),
        // IPAM exited 0, so it may have allocated, but its answer cannot be used.
        (node, Err(e @ Delegate::Output { .. })) => {
            AfterIpam::RollBack(node.err().unwrap_or_else(|| e.into()))
        }
        (Err(e), Err(_)) => AfterIpam::Fail(e),
        (Ok(_), Err(e)) => AfterIpam::Fail(e.into()),
    }
}

/// Carries out [`after_ipam`]'s decision: `attach`es the pod; when that or anything before it
/// failed, removes the host veth `host` (it may have been made meanwhile) and, when IPAM may
/// have allocated, runs `give_back` (IPAM DEL). What goes wrong while rolling back is logged:
/// the error reported is the one that made ADD fail.
pub fn settle<P: Pods, N, E>(
    p: &mut P,
    host: &str,
    decision: AfterIpam<N, E>,
    attach: impl FnOnce(&mut P, N, CniResult) -> Result<CniResult, E>,
    give_back: impl FnOnce() -> Result<(), Error>,
) -> Result<CniResult, E> {
    let remove_veth = |p: &mut P| {
        if let Err(err) = p.delete_veth(host) {
            eprintln!("sticky-vxlan: rollback: removing {host}: {err}");
        }
    };
    let roll_back = |p: &mut P, e: E| {
        remove_veth(p);
        if let Err(err) = give_back() {
            eprintln!("sticky-vxlan: rollback: IPAM DEL: {err}");
        }
        e
    };
    match decision {
        AfterIpam::Attach(node, result) => attach(p, node, result).map_err(|e| roll_back(p, e)),
        AfterIpam::RollBack(e) => Err(roll_back(p, e)),
        // IPAM allocated nothing, but the veth may have been made meanwhile.
        AfterIpam::Fail(e) => {
            remove_veth(p);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn output() -> Delegate {
        Delegate::Output {
            plugin: PathBuf::from("/x"),
            reason: "garbage".into(),
        }
    }

    fn failed() -> Delegate {
        Delegate::Failed {
            plugin: PathBuf::from("/x"),
            code: 100,
            msg: "full".into(),
            details: String::new(),
        }
    }

    #[test]
    fn rollback_only_when_ipam_may_have_allocated() {
        let ok = || Ok(CniResult::default());
        let node_err = || Err::<(), Error>(Error::NoRemotePeer);
        let after = after_ipam::<(), Error>;
        assert!(matches!(after(Ok(()), ok()), AfterIpam::Attach((), _)));
        assert!(matches!(
            after(node_err(), ok()),
            AfterIpam::RollBack(Error::NoRemotePeer)
        ));
        assert!(matches!(
            after(Ok(()), Err(output())),
            AfterIpam::RollBack(Error::Ipam(Delegate::Output { .. }))
        ));
        assert!(
            matches!(
                after(node_err(), Err(output())),
                AfterIpam::RollBack(Error::NoRemotePeer)
            ),
            "the node's problem is the one reported"
        );
        assert!(matches!(
            after(Ok(()), Err(failed())),
            AfterIpam::Fail(Error::Ipam(Delegate::Failed { code: 100, .. }))
        ));
        assert!(matches!(
            after(node_err(), Err(failed())),
            AfterIpam::Fail(Error::NoRemotePeer)
        ));
    }
}
