//! `sticky-vxlan doctor`: why pods on this node cannot talk to pods on a peer, as a stable
//! cause code with one line of detail and one line of fix (issue 35; docs/operations.md lists
//! the codes).
//!
//! Its own room, in three parts: [`measure`] reads the node (links, sysctls, counters, the
//! forward-hook chains) and sends the [`probe`]s; [`decide`] turns those facts into findings
//! and knows nothing of sockets; [`render`] prints them for people or as JSON. It runs on one
//! node and needs nothing on the peer but its kernel: every probe is an ICMP echo the peer's
//! kernel answers. With sites, it also reads the agent's status and sites cache and sends
//! echoes through the tunnel to each remote site's active gateway (from this node's VTEP
//! address), so the sites causes need no agent answering either. It writes nothing (no sysctl, no rule, no route) and its probes are a few
//! echoes per peer, so it is safe while pods run.

pub mod decide;
mod forward;
pub mod measure;
pub mod probe;
pub mod render;

use std::path::Path;
use std::time::{Duration, Instant};

use sticky_netlink::Socket;
use sticky_overlay::kernel::Live;

pub use decide::{Cause, Finding};

/// Why doctor could not run (exit 2): nothing was decided.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] crate::networks::Error),
    #[error(transparent)]
    Netlink(#[from] sticky_netlink::socket::Error),
    #[error(transparent)]
    Measure(#[from] measure::Error),
}

/// What one run found.
#[derive(Debug, Clone)]
pub struct Report {
    pub network: String,
    pub measured: measure::Measured,
    pub findings: Vec<Finding>,
    pub took: Duration,
}

/// Measures the network of the config at `path` from this node and decides.
pub fn run(path: &Path) -> Result<Report, Error> {
    let started = Instant::now();
    let cfg = crate::networks::load(path)?;
    let mut sock = Socket::open()?;
    let shown = path.display().to_string();
    let mut measured = measure::measure(
        &mut Live { sock: &mut sock },
        &mut measure::LiveHost,
        &mut probe::Icmp::default(),
        &cfg,
        &shown,
    )?;
    if let Some(sites) = &cfg.sites {
        let vtep = measured.node.pod_subnet.map(|n| n.network());
        measured.sites = measure::sites::measure(
            &cfg,
            sites,
            measured.local_ip,
            vtep,
            &mut probe::Icmp {
                source: vtep,
                ..probe::Icmp::default()
            },
            &shown,
            &mut measured.unchecked,
        )?;
    }
    let mut findings = decide::decide(&measured.node, &measured.peers);
    if let Some(s) = &measured.sites {
        findings.extend(decide::sites::decide(s));
    }
    Ok(Report {
        network: cfg.name,
        measured,
        findings,
        took: started.elapsed(),
    })
}
