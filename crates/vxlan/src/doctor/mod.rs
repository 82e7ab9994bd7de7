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

impl Report {
    /// The finding about the peer at `peer`, if any.
    pub fn peer_finding(&self, peer: std::net::IpAddr) -> Option<&Finding> {
        self.findings.iter().find(|f| f.peer == Some(peer))
    }

    /// The finding about the remote site `site`, if any.
    pub fn site_finding(&self, site: &str) -> Option<&Finding> {
        self.findings
            .iter()
            .find(|f| f.site.as_deref() == Some(site))
    }

    /// What the path to the peer `p` is: its own cause, or the node's when the node's cause
    /// made its probes fail (no VTEP, a full conntrack table: no peer is blamed then), or `ok`.
    pub fn peer_state(&self, p: &decide::PeerFacts) -> &'static str {
        let node = || {
            self.findings
                .iter()
                .find(|f| f.peer.is_none() && f.site.is_none())
        };
        match self.peer_finding(p.peer) {
            Some(f) => f.cause.code(),
            None if !(p.small && p.full) => node().map_or("ok", |f| f.cause.code()),
            None => "ok",
        }
    }

    /// What the path to the remote site `site` is: its cause, or `ok`.
    pub fn site_state(&self, site: &str) -> &'static str {
        self.site_finding(site).map_or("ok", |f| f.cause.code())
    }
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
