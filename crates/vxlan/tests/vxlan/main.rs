//! sticky-vxlan's process-level tests, one binary: each module builds network namespaces
//! (an underlay, nodes, pods) and runs the built plugin inside them as a runtime on that node
//! would. Nearly all need root (`#[ignore = "needs root: ..."]`); the topology is
//! `sticky_testkit::vxlan_support`. The crash-point test is a binary of its own
//! (`vxlan_crash`, built only with the `crash-points` feature).

mod connectivity;
mod convergence;
mod datapath;
mod doctor;
mod flannel;
mod hostile;
mod ipv6;
mod lifecycle;
mod mtu;
mod netns;
mod ownership;
mod peers;
mod scale;
mod segment;
mod sticky;
