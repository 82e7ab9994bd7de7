//! Sites (docs/sites.md): the agent's part of pods in different sites reaching each other
//! through one WireGuard gateway per site. The decisions are `sticky_sites`'; this room wires
//! them to the agent's Nodes and files, and on the active gateway to the tunnel:
//!
//! - [`facts`]: what sites read of a Node (its kept labels and annotations) and, for the
//!   placed Nodes, the inputs of `sticky_sites::model::build`;
//! - [`shape`]: the plan of this node from those inputs, and the peers file it calls for (its
//!   site's members only; the remote sites' pod subnets carried by its active gateway's entry);
//! - [`keys`]: the gateway's WireGuard key file (made once, rotated, never followed through a
//!   link);
//! - [`cache`]: the inputs and the current active gateways kept on the node, so a restart with
//!   the API away brings the tunnel and routes back;
//! - [`device`]: the tunnel device as the kernel holds it (netlink: link MTU and up, the routes
//!   into it), behind a small trait;
//! - [`probe`]: the probes inside the site (a thread on the underlay address answering and
//!   probing), read by [`run`] for the liveness view and the step-down rule;
//! - [`publish`]: this node's sites annotations (its gateway public key, where its peers
//!   behind NAT come from) kept as the key file and the tunnel say, and what the probes saw
//!   handed to the one place that makes the plan again;
//! - [`side`]: each round on the node: the tunnel of the active gateway (key, port, peers as a
//!   diff, routes), the per-site status, and the log lines for tunnels up and down.

pub mod cache;
pub mod core;
pub mod device;
pub mod facts;
pub mod keys;
pub mod probe;
pub mod publish;
pub mod run;
pub mod shape;
pub mod side;
#[cfg(test)]
mod simulation;
pub mod uapi;
