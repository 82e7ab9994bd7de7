//! The decisions behind sticky-cni's sites (issues 28 and 29): pods in different sites (sets
//! of nodes that reach each other directly, each perhaps behind its own NAT) reach each other
//! through one active gateway per site over WireGuard.
//!
//! This crate is the decision room, pure and tested without root, so every node computes the
//! same answers from the same cached Node objects, with no API and no election:
//! [`model`] (Nodes to sites and gateway candidates), [`gateway`] (the active gateway, no
//! flapping), [`paths`] (direct, hole-punched, relayed, unreachable), [`plan`] (what this node
//! routes and, on the active gateway, the WireGuard peers), [`observed`] (NAT discovery: where
//! the reachable gateways see the NATed ones come from), [`punch`] (hole punching: when to try,
//! the backoff, the peers meanwhile), [`mtu`] (the pod MTU with a tunnel). Two modules touch the outside, each narrowly: [`keys`] (the gateway's key file)
//! and [`tunnel`]/[`uapi`] (the seam to the data path and WireGuard's userspace API client).
//! It links no async runtime, HTTP or netlink: the agent wires it in.

pub mod gateway;
pub mod heal;
pub mod keys;
pub mod model;
pub mod observed;
pub mod paths;
pub mod punch;

pub mod plan;
pub mod probe;
pub mod remote;
pub mod tunnel;
pub mod uapi;
