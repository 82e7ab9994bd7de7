//! What the process-level tests of the sticky-cni crates share (a dev-dependency only): they
//! drive the built binaries exactly as a runtime does. A library, so each test binary uses
//! what it needs and nothing is compiled into every one of them.
//!
//! - [`support`]: finding the binaries ([`support::bins::built`]), calling a plugin, IPAM
//!   configs and data dirs, network namespaces, scratch dirs;
//! - [`vxlan_support`]: the netns topology of the sticky-vxlan tests (underlay, nodes, pods);
//! - [`kube_support`]: a fake Kubernetes API server and the agent process;
//! - [`kube_proto`]: that server's protobuf encoding;
//! - [`agent_support`]: a cluster of nodes each running the agent;
//! - [`cnitool_support`]: libcni's `cnitool`, as a runtime;
//! - [`conntrack`]: a namespace's conntrack table filled to its maximum;
//! - [`sites_support`]: three sites behind NAT routers joined by an "internet" (issue 28).

pub mod agent_support;
pub mod cnitool_support;
pub mod conntrack;
pub mod kube_proto;
pub mod kube_support;
pub mod sites_standby_support;
pub mod sites_support;
pub mod support;
pub mod vxlan_support;
