//! sticky-cni: two CNI plugins for nodes that must keep working while cut off from the
//! control plane.
//!
//! - `sticky-ipam` ([`ipam`]) is a drop-in replacement for the reference `host-local` IPAM
//!   plugin that gives a pod recreated under the same namespace and name its previous address
//!   back, with no API server.
//! - `sticky-vxlan` ([`vxlan`]) networks pods across nodes over VXLAN with a VTEP whose MAC is a
//!   pure function of the node's underlay address, and peers known from local config.
//!
//!   [`segment`] is its L2 segment mode; [`agent`] (the `sticky-vxlan-agent` program) keeps its
//!   peers file current from the Kubernetes API.
//!
//! Layers, bottom to top (docs/design.md, "Layers"; every import points down): the primitives
//! [`program`] (how every binary runs and exits), [`crash`], [`args`], [`netlink`] (the
//! synchronous kernel layer) and [`nofollow`] (the one way files are opened and written);
//! [`cni`], the protocol both plugins share; [`ipam`]; [`vxlan`], the data-path core and the
//! main mode; [`segment`]; [`networks`], the mode dispatch; then the programs: [`agent`] and
//! [`cli`], the operator tools.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod agent;
pub mod args;
pub mod cli;
pub mod cni;
pub mod crash;
pub mod ipam;
pub mod netlink;
pub mod networks;
pub mod nofollow;
pub mod program;
pub mod segment;
pub mod vxlan;
