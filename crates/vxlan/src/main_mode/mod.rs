//! The main (L3) mode: flannel's data path. [`plan`] decides as pure data what the node
//! needs (with the core's `devices` for the VTEP and bridge), [`apply`] carries it out
//! through the core's `Kernel` seam, and [`reconcile`] ties those together under the state
//! dir's lock: the one entry point for `sticky-vxlan reconcile`, every ADD and the node agent.
//! [`plugin`] ties them to the CNI commands; [`firewall`] holds the optional nftables rules.
//! [`change`] programs a change of the peers file the node agent made as a change.

pub mod apply;
pub mod change;
pub mod firewall;
pub mod plan;
pub mod plugin;
pub mod reconcile;
