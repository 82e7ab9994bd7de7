//! `sticky-vxlan`: pod networking over a VXLAN overlay whose VTEP MAC never changes.
//!
//! Two modes, sibling rooms over the shared data-path core (`sticky-overlay`): [`main_mode`],
//! flannel's L3 data path (a route, neighbour and FDB entry per peer), and [`segment`], an L2
//! segment (frames only). [`networks`] picks the mode from the config (`"mode"`) and is the
//! CNI plugin; [`delegate`] runs the IPAM plugin (sticky-ipam in process); [`cli`] holds the
//! operator's verbs when the binary runs without `CNI_COMMAND`; [`node_ranges`] fills a
//! rangeless IPAM section from the peers for the operator tools; [`status`] is the node
//! agent's status file, which `show` reads and the agent writes; [`doctor`] names why pods
//! cannot talk (`sticky-vxlan doctor`).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod cli;
mod delegate;
pub mod doctor;
pub mod main_mode;
pub mod networks;
mod node_ranges;
pub mod segment;
pub mod status;
