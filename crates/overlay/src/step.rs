//! One change to the node's shared devices ([`Step`]): what a mode's plan is made of and its
//! apply carries out. [`crate::devices`] adds the steps that make and repair the VTEP and the
//! bridge; the main mode adds the rest.

use std::net::IpAddr;

use ipnet::IpNet;
use sticky_netlink::link::{Link, VxlanSpec};
use sticky_netlink::route::Route;

use crate::kernel::LinkChange;
use crate::nft::Table;

/// The node's two shared devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dev {
    Vtep,
    Bridge,
}

/// One change to the node. Entries without a device are on the VTEP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Delete our VTEP whose parameters no longer match (it is created again next).
    DeleteLink {
        name: String,
    },
    CreateVtep(VxlanSpec),
    CreateBridge {
        name: String,
        mtu: u32,
        mac: Option<[u8; 6]>,
    },
    Change {
        dev: Dev,
        change: LinkChange,
    },
    AddAddress {
        dev: Dev,
        net: IpNet,
    },
    DeleteAddress {
        dev: Dev,
        net: IpNet,
    },
    AddFdb {
        mac: [u8; 6],
        dst: IpAddr,
    },
    DeleteFdb {
        mac: [u8; 6],
        dst: IpAddr,
    },
    ReplaceNeighbour {
        ip: IpAddr,
        mac: [u8; 6],
    },
    DeleteNeighbour {
        ip: IpAddr,
        mac: [u8; 6],
    },
    /// `<dst> via <via> dev <VTEP> onlink proto 118`: `via` is the network address of the
    /// peer's own subnet of `dst`'s family (`dst`'s own for a peer's own subnet).
    ReplaceRoute {
        dst: IpNet,
        via: std::net::IpAddr,
    },
    DeleteRoute(Route),
    /// A pod's host end of this network back on the bridge (made again: deleting a bridge
    /// releases its ports, and the pods behind them are still there), hairpin mode on when
    /// the config asks for it.
    Reattach {
        link: Link,
        hairpin: bool,
    },
    Sysctl {
        key: String,
        value: String,
    },
    Firewall {
        script: String,
    },
    /// No nftables rule is wanted: those of these tables (all the network owns) that exist
    /// are deleted.
    RemoveTables {
        tables: Vec<Table>,
    },
}

impl Step {
    /// A step that writes one entry (FDB, neighbour, route): consecutive ones go out as one
    /// batch.
    pub fn is_entry(&self) -> bool {
        matches!(
            self,
            Step::AddFdb { .. }
                | Step::DeleteFdb { .. }
                | Step::ReplaceNeighbour { .. }
                | Step::DeleteNeighbour { .. }
                | Step::ReplaceRoute { .. }
                | Step::DeleteRoute(_)
        )
    }
}
