//! sticky-vxlan-agent's process-level tests, one binary: the agent run against a fake
//! Kubernetes API (`sticky_testkit::kube_support`), alone or on a netns cluster of nodes with
//! the plugin (`sticky_testkit::agent_support`). Root-only tests are marked as such.

mod cluster;
mod cluster_ipv6;
mod health;
mod hostile;
mod kubectl;
mod proxy;
mod sites;
mod sites_doctor;
mod sites_failover;
mod sites_hub;
mod sites_nat;
mod sites_trust;
