//! The decisions behind sticky-cni's sites (issues 28 and 29): pods in different sites (sets
//! of nodes that reach each other directly, each perhaps behind its own NAT) reach each other
//! through one active gateway per site over WireGuard.
//!
//! This crate is the decision room, pure and tested without root, so every node computes the
//! same answers from the same cached Node objects, with no API and no election:
//! [`model`] (Nodes to sites and gateway candidates), [`gateway`] (the active gateway, no
//! flapping), [`paths`] (direct, hole-punched, relayed, unreachable), [`plan`] (what this node
//! routes and, on the active gateway, the WireGuard peers), [`discovery`] (NAT discovery: where
//! the reachable gateways see the NATed ones come from), [`punch`] (hole punching: when to try,
//! the backoff, the peers meanwhile), [`heal`] and [`probe`] (liveness and step-down inside a
//! site), [`remote`] (which candidate of a remote site to send to), [`relay`] (what a forwarding
//! relay passes on, and to whom: it never decrypts), [`tunnel`] (what a
//! WireGuard device holds and the changes that move it), [`round`] (one round of the active
//! gateway: what its device must do), [`keys`] (the gateway's key pair).
//! It does no I/O and links no async runtime, HTTP or netlink: every function takes the time
//! it needs, and the agent reads, decides with this crate, and acts.

pub mod discovery;
pub mod gateway;
pub mod heal;
pub mod keys;
pub mod model;
pub mod paths;
pub mod plan;
pub mod probe;
pub mod punch;
pub mod relay;
pub mod remote;
pub mod round;
pub mod tunnel;
