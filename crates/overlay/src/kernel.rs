//! The node's kernel as the overlay needs it: a few reads, a few writes, nothing else.
//!
//! [`Kernel`] is the seam between deciding and doing (as youki's `Syscall` trait): the plan
//! ([`super::plan`]) is computed from what [`Kernel`] reads and applied through what it
//! writes. [`Live`] is the real thing (one rtnetlink socket, `/proc/sys`, `nft`); the tests
//! use a recording fake (`super::fake`), so every decision is tested without root.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{Error, nft};
use netlink_packet_route::link::InfoKind;

use sticky_netlink::link::{self, Link, VxlanSpec};
use sticky_netlink::neigh::{self, Fdb, Neighbour};
use sticky_netlink::route::{self, Route};
use sticky_netlink::{Socket, addr, socket, sysctl};

/// One change to a link, by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkChange {
    Mac([u8; 6]),
    Mtu(u32),
    Alias(String),
    /// Enslave to the bridge of this index.
    Master(u32),
    Up,
}

/// One write of a VTEP's entries or of a route, as [`Kernel::write_entries`] takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryWrite {
    AddFdb(Fdb),
    DeleteFdb(Fdb),
    ReplaceNeighbour(Neighbour),
    DeleteNeighbour(Neighbour),
    ReplaceRoute(Route),
    DeleteRoute(Route),
}

impl EntryWrite {
    fn request(&self) -> socket::Request {
        match self {
            EntryWrite::AddFdb(f) => neigh::Write::AddFdb(f).request(),
            EntryWrite::DeleteFdb(f) => neigh::Write::DeleteFdb(f).request(),
            EntryWrite::ReplaceNeighbour(n) => neigh::Write::ReplaceNeighbour(n).request(),
            EntryWrite::DeleteNeighbour(n) => neigh::Write::DeleteNeighbour(n).request(),
            EntryWrite::ReplaceRoute(r) => route::Write::Replace(r).request(),
            EntryWrite::DeleteRoute(r) => route::Write::Delete(r).request(),
        }
    }

    /// The outcome of the write from the kernel's answer, as the write alone returns it.
    fn answer(&self, answer: Result<(), socket::Error>) -> Result<(), Error> {
        match self {
            EntryWrite::AddFdb(f) => neigh::Write::AddFdb(f).answer(answer)?,
            EntryWrite::DeleteFdb(f) => neigh::Write::DeleteFdb(f).answer(answer)?,
            EntryWrite::ReplaceNeighbour(n) => neigh::Write::ReplaceNeighbour(n).answer(answer)?,
            EntryWrite::DeleteNeighbour(n) => neigh::Write::DeleteNeighbour(n).answer(answer)?,
            EntryWrite::ReplaceRoute(r) => route::Write::Replace(r).answer(answer)?,
            EntryWrite::DeleteRoute(r) => route::Write::Delete(r).answer(answer)?,
        }
        Ok(())
    }
}

/// The writes, in order, one method call each, stopping at the first error: what
/// [`Kernel::write_entries`] does unless a kernel does better.
pub(crate) fn write_each<K: Kernel + ?Sized>(
    k: &mut K,
    writes: &[EntryWrite],
) -> Result<(), Error> {
    for write in writes {
        match write {
            EntryWrite::AddFdb(f) => k.add_fdb(f)?,
            EntryWrite::DeleteFdb(f) => k.delete_fdb(f)?,
            EntryWrite::ReplaceNeighbour(n) => k.replace_neighbour(n)?,
            EntryWrite::DeleteNeighbour(n) => k.delete_neighbour(n)?,
            EntryWrite::ReplaceRoute(r) => k.replace_route(r)?,
            EntryWrite::DeleteRoute(r) => k.delete_route(r)?,
        }
    }
    Ok(())
}

/// What sticky-vxlan reads from and writes to the node's kernel.
pub trait Kernel {
    fn links(&mut self) -> Result<Vec<Link>, Error>;
    /// Every VXLAN device of the namespace (and no other link).
    fn vxlan_links(&mut self) -> Result<Vec<Link>, Error>;
    /// Every veth of the namespace (and no other link): the pods' host ends among them.
    fn veth_links(&mut self) -> Result<Vec<Link>, Error>;
    fn link(&mut self, name: &str) -> Result<Option<Link>, Error>;
    fn link_at(&mut self, index: u32) -> Result<Option<Link>, Error>;
    /// Every address of the namespace, with the index of the interface holding it.
    fn addresses(&mut self) -> Result<Vec<(u32, IpNet)>, Error>;
    /// The addresses on interface `index` (the kernel filters them: no dump of the others).
    fn addresses_of(&mut self, index: u32) -> Result<Vec<IpNet>, Error>;
    /// Every unicast route of the main table.
    fn routes(&mut self) -> Result<Vec<Route>, Error>;
    fn neighbours(&mut self, index: u32) -> Result<Vec<Neighbour>, Error>;
    /// Every FDB entry of the VXLAN device `index` (a dump: the kernel's cost grows with the
    /// square of the entries).
    fn fdb(&mut self, index: u32) -> Result<Vec<Fdb>, Error>;
    /// The FDB entries of `macs` on the VXLAN device `index`, one lookup each (a MAC with
    /// several destinations shows its first).
    fn fdb_of(&mut self, index: u32, macs: &[[u8; 6]]) -> Result<Vec<Fdb>, Error>;
    /// `ip route get`: the outgoing interface and source address towards `ip`.
    fn route_to(&mut self, ip: IpAddr) -> Result<(Option<u32>, Option<IpAddr>), Error>;
    /// The main table's route of exactly `dst`, if there is one (one lookup, not a dump).
    fn route_on(&mut self, dst: IpNet) -> Result<Option<Route>, Error>;

    fn create_vxlan(&mut self, spec: &VxlanSpec) -> Result<(), Error>;
    fn create_bridge(&mut self, name: &str, mtu: u32, mac: Option<[u8; 6]>) -> Result<(), Error>;
    fn delete_link(&mut self, name: &str) -> Result<(), Error>;
    fn change_link(&mut self, link: &Link, change: &LinkChange) -> Result<(), Error>;
    fn add_address(&mut self, index: u32, net: IpNet) -> Result<(), Error>;
    fn delete_address(&mut self, index: u32, net: IpNet) -> Result<(), Error>;
    fn add_fdb(&mut self, fdb: &Fdb) -> Result<(), Error>;
    fn delete_fdb(&mut self, fdb: &Fdb) -> Result<(), Error>;
    fn replace_neighbour(&mut self, n: &Neighbour) -> Result<(), Error>;
    fn delete_neighbour(&mut self, n: &Neighbour) -> Result<(), Error>;
    fn replace_route(&mut self, r: &Route) -> Result<(), Error>;
    fn delete_route(&mut self, r: &Route) -> Result<(), Error>;
    /// The writes, in order, each as its own method would do it; the error is the first
    /// write's the kernel refused. One by one here, stopping there; [`Live`] sends them as
    /// one batch, where the writes after a refused one may have been made as well.
    fn write_entries(&mut self, writes: &[EntryWrite]) -> Result<(), Error> {
        write_each(self, writes)
    }
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), Error>;
    /// The value of `/proc/sys/<key>`, trimmed; `None` when it cannot be read.
    fn read_sysctl(&mut self, key: &str) -> Result<Option<String>, Error>;
    /// Hairpin mode on for the bridge port `name`.
    fn set_hairpin(&mut self, name: &str) -> Result<(), Error>;
    /// No IPv6 on device `name` (no link-local address, router solicitation or MLD report
    /// from it); nothing to do when the kernel keeps no IPv6 settings for it.
    fn disable_ipv6(&mut self, name: &str) -> Result<(), Error>;
    /// Runs an `nft -f -` script.
    fn nft(&mut self, script: &str) -> Result<(), Error>;
    /// Deletes those of `tables` that exist ([`nft::remove_present`]).
    fn nft_remove(&mut self, tables: &[nft::Table]) -> Result<(), Error>;
}

/// The real kernel of the namespace the socket was opened in.
pub struct Live<'a> {
    pub sock: &'a mut Socket,
}

impl Kernel for Live<'_> {
    fn links(&mut self) -> Result<Vec<Link>, Error> {
        Ok(link::list(self.sock)?)
    }
    fn vxlan_links(&mut self) -> Result<Vec<Link>, Error> {
        Ok(link::list_kind(self.sock, InfoKind::Vxlan)?)
    }
    fn veth_links(&mut self) -> Result<Vec<Link>, Error> {
        Ok(link::list_kind(self.sock, InfoKind::Veth)?)
    }
    fn link(&mut self, name: &str) -> Result<Option<Link>, Error> {
        Ok(link::get(self.sock, name)?)
    }
    fn link_at(&mut self, index: u32) -> Result<Option<Link>, Error> {
        Ok(link::get_at(self.sock, index)?)
    }
    fn addresses(&mut self) -> Result<Vec<(u32, IpNet)>, Error> {
        Ok(addr::list_all(self.sock)?)
    }
    fn addresses_of(&mut self, index: u32) -> Result<Vec<IpNet>, Error> {
        Ok(addr::list(self.sock, index)?)
    }
    fn routes(&mut self) -> Result<Vec<Route>, Error> {
        Ok(route::list(self.sock)?)
    }
    fn neighbours(&mut self, index: u32) -> Result<Vec<Neighbour>, Error> {
        Ok(neigh::list(self.sock, index)?)
    }
    fn fdb(&mut self, index: u32) -> Result<Vec<Fdb>, Error> {
        Ok(neigh::list_fdb(self.sock, index)?)
    }
    fn fdb_of(&mut self, index: u32, macs: &[[u8; 6]]) -> Result<Vec<Fdb>, Error> {
        Ok(neigh::fdb_of(self.sock, index, macs)?)
    }
    fn route_to(&mut self, ip: IpAddr) -> Result<(Option<u32>, Option<IpAddr>), Error> {
        Ok(route::lookup(self.sock, ip)?)
    }
    fn route_on(&mut self, dst: IpNet) -> Result<Option<Route>, Error> {
        Ok(route::exactly(self.sock, dst)?)
    }
    fn create_vxlan(&mut self, spec: &VxlanSpec) -> Result<(), Error> {
        Ok(link::add_vxlan(self.sock, spec)?)
    }
    fn create_bridge(&mut self, name: &str, mtu: u32, mac: Option<[u8; 6]>) -> Result<(), Error> {
        Ok(link::add_bridge(self.sock, name, Some(mtu), mac)?)
    }
    fn delete_link(&mut self, name: &str) -> Result<(), Error> {
        Ok(link::delete(self.sock, name)?)
    }
    fn change_link(&mut self, l: &Link, change: &LinkChange) -> Result<(), Error> {
        match change {
            LinkChange::Mac(mac) => link::set_mac(self.sock, l, *mac)?,
            LinkChange::Mtu(mtu) => link::set_mtu(self.sock, l, *mtu)?,
            LinkChange::Alias(alias) => link::set_alias(self.sock, l, alias)?,
            LinkChange::Master(index) => link::set_master(self.sock, l, *index)?,
            LinkChange::Up => link::set_up(self.sock, l)?,
        }
        Ok(())
    }
    fn add_address(&mut self, index: u32, net: IpNet) -> Result<(), Error> {
        Ok(addr::add(self.sock, index, net)?)
    }
    fn delete_address(&mut self, index: u32, net: IpNet) -> Result<(), Error> {
        Ok(addr::delete(self.sock, index, net)?)
    }
    fn add_fdb(&mut self, fdb: &Fdb) -> Result<(), Error> {
        Ok(neigh::add_fdb(self.sock, fdb)?)
    }
    fn delete_fdb(&mut self, fdb: &Fdb) -> Result<(), Error> {
        Ok(neigh::delete_fdb(self.sock, fdb)?)
    }
    fn replace_neighbour(&mut self, n: &Neighbour) -> Result<(), Error> {
        Ok(neigh::replace(self.sock, n)?)
    }
    fn delete_neighbour(&mut self, n: &Neighbour) -> Result<(), Error> {
        Ok(neigh::delete(self.sock, n)?)
    }
    fn replace_route(&mut self, r: &Route) -> Result<(), Error> {
        Ok(route::replace(self.sock, r)?)
    }
    fn delete_route(&mut self, r: &Route) -> Result<(), Error> {
        Ok(route::delete(self.sock, r)?)
    }
    /// Many requests per `send`, their ACKs read together ([`Socket::request_batch`]): the
    /// kernel works through them in order, as it would one by one.
    fn write_entries(&mut self, writes: &[EntryWrite]) -> Result<(), Error> {
        let requests = writes.iter().map(EntryWrite::request).collect();
        let answers = self.sock.request_batch(requests)?;
        for (write, answer) in writes.iter().zip(answers) {
            write.answer(answer)?;
        }
        Ok(())
    }
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), Error> {
        Ok(sysctl::write(key, value)?)
    }
    fn read_sysctl(&mut self, key: &str) -> Result<Option<String>, Error> {
        Ok(sysctl::read(key).ok())
    }
    fn set_hairpin(&mut self, name: &str) -> Result<(), Error> {
        Ok(link::set_hairpin(name)?)
    }
    fn disable_ipv6(&mut self, name: &str) -> Result<(), Error> {
        let key = format!("net/ipv6/conf/{name}/disable_ipv6");
        Ok(sysctl::write_if_present(&key, "1")?)
    }
    fn nft(&mut self, script: &str) -> Result<(), Error> {
        Ok(nft::run(script)?)
    }
    fn nft_remove(&mut self, tables: &[nft::Table]) -> Result<(), Error> {
        Ok(nft::remove_present(tables)?)
    }
}
