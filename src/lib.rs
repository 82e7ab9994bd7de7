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
//! [`cni`] is the protocol both share (its own errors mapped to CNI codes; each plugin maps its
//! own in its `codes` module);
//! [`cli`] is the operator tools' shared argument parser and conflist loader; [`netlink`] the
//! synchronous kernel layer; [`nofollow`] the one way files are opened and written;
//! [`program`] the one way every program runs and exits.

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
