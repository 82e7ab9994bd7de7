//! What the agent knows about itself, shared between its threads: served as Prometheus
//! metrics, and written to a small status file ([`sticky_vxlan::status`]) that `sticky-vxlan show` reads.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use sticky_vxlan::status::{SitesStatus, Status, TunnelStatus, now_unix};

#[derive(Debug, Default)]
pub struct Counters {
    pub reconciles: u64,
    pub reconcile_errors: u64,
    pub segment_reconciles: u64,
    pub segment_reconcile_errors: u64,
    pub file_writes: u64,
    pub removals_refused: u64,
    pub lists: u64,
    pub list_failures: u64,
    pub watch_failures: u64,
    pub publish_failures: u64,
}

#[derive(Debug)]
pub struct Inner {
    pub status: Status,
    pub counters: Counters,
    /// When the main loop last went round (for /healthz).
    pub alive: Instant,
    /// The peers file as the agent last wrote it (to tell its own writes from hand edits).
    pub own_write: Option<super::files::Fingerprint>,
    /// The last periodic doctor run (`--doctor-every`).
    pub paths: Option<super::doctor::Paths>,
}

/// Shared by the threads.
#[derive(Clone, Debug)]
pub struct Shared(Arc<Mutex<Inner>>);

impl Shared {
    pub fn new(status: Status) -> Shared {
        Shared(Arc::new(Mutex::new(Inner {
            status,
            counters: Counters::default(),
            alive: Instant::now(),
            own_write: None,
            paths: None,
        })))
    }

    /// The state; a thread that panicked while holding it left plain data, still usable.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Prometheus text format.
    pub fn metrics(&self) -> String {
        let s = self.lock();
        let metrics: [(&str, &str, &str, f64); 16] = [
            (
                "nodes_left_out",
                "gauge",
                "Nodes left out of the peers: not a valid peer, or in conflict with another (the log names each and why).",
                s.status.left_out as f64,
            ),
            (
                "stale",
                "gauge",
                "1 while the peers may miss changes made in the API (no complete list since the last failure).",
                f64::from(u8::from(s.status.stale_since.is_some())),
            ),
            (
                "lists_total",
                "counter",
                "Complete node lists.",
                s.counters.lists as f64,
            ),
            (
                "list_failures_total",
                "counter",
                "Node lists that failed (each followed by a backoff).",
                s.counters.list_failures as f64,
            ),
            (
                "watch_failures_total",
                "counter",
                "Node watches that failed (each followed by a backoff, then a relist unless the connection broke).",
                s.counters.watch_failures as f64,
            ),
            (
                "peers",
                "gauge",
                "Peers in the peers file the agent keeps.",
                s.status.peers as f64,
            ),
            (
                "last_sync_timestamp_seconds",
                "gauge",
                "Unix time of the last complete node list from the API (0: never).",
                s.status.last_sync.unwrap_or(0) as f64,
            ),
            (
                "last_api_answer_timestamp_seconds",
                "gauge",
                "Unix time the API last answered (0: never).",
                s.status.last_api_answer.unwrap_or(0) as f64,
            ),
            (
                "api_reachable",
                "gauge",
                "1 while the API answers, 0 while it does not.",
                f64::from(u8::from(s.status.api_reachable)),
            ),
            (
                "reconciles_total",
                "counter",
                "Node reconciles run.",
                s.counters.reconciles as f64,
            ),
            (
                "reconcile_errors_total",
                "counter",
                "Node reconciles that failed.",
                s.counters.reconcile_errors as f64,
            ),
            (
                "segment_reconciles_total",
                "counter",
                "Segment network reconciles run (one per --segment-config and round).",
                s.counters.segment_reconciles as f64,
            ),
            (
                "segment_reconcile_errors_total",
                "counter",
                "Segment network reconciles that failed.",
                s.counters.segment_reconcile_errors as f64,
            ),
            (
                "peers_file_writes_total",
                "counter",
                "Times the agent rewrote the peers file.",
                s.counters.file_writes as f64,
            ),
            (
                "publish_failures_total",
                "counter",
                "Flannel-annotation PATCHes of this node's Node that failed (each logged, and tried again after a capped backoff).",
                s.counters.publish_failures as f64,
            ),
            (
                "removals_refused_total",
                "counter",
                "Node lists refused because they would remove too many peers at once.",
                s.counters.removals_refused as f64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in metrics {
            let name = format!("sticky_vxlan_agent_{name}");
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        if let Some(sites) = &s.status.sites {
            site_metrics(&mut out, sites);
        }
        if let Some(paths) = &s.paths {
            super::doctor::metrics(&mut out, paths);
        }
        out
    }
}

/// The per-site metrics, labelled by remote site (docs/sites.md, "Observing").
fn site_metrics(out: &mut String, sites: &SitesStatus) {
    let head = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(
            out,
            "# HELP sticky_vxlan_agent_{name} {help}\n# TYPE sticky_vxlan_agent_{name} {kind}"
        );
    };
    head(
        out,
        "sites_left_out",
        "gauge",
        "Nodes whose site part was refused: a bad site label, or a gateway with a bad key or endpoint (the log names each and why).",
    );
    let _ = writeln!(out, "sticky_vxlan_agent_sites_left_out {}", sites.left_out);
    head(
        out,
        "site_relayed",
        "gauge",
        "Per remote site: 1 when its traffic goes through a relay site's gateway, 0 when direct, -1 when it is unreachable.",
    );
    for r in &sites.remotes {
        let v = if r.path.starts_with("relayed") {
            1
        } else if r.path.starts_with("unreachable") {
            -1
        } else {
            0
        };
        let _ = writeln!(
            out,
            "sticky_vxlan_agent_site_relayed{{site=\"{}\",gateway=\"{}\"}} {v}",
            r.site,
            r.gateway.as_deref().unwrap_or("")
        );
    }
    let tunnels: Vec<_> = sites
        .remotes
        .iter()
        .filter_map(|r| r.tunnel.as_ref().map(|t| (&r.site, t)))
        .collect();
    if tunnels.is_empty() {
        return;
    }
    let now = now_unix();
    for (name, kind, help, value) in [
        (
            "site_tunnel_up",
            "gauge",
            "On the active gateway, per remote site: 1 when the tunnel carrying its traffic had a handshake within 180 s.",
            &(|t: &TunnelStatus| f64::from(u8::from(t.up))) as &dyn Fn(&TunnelStatus) -> f64,
        ),
        (
            "site_handshake_age_seconds",
            "gauge",
            "On the active gateway, per remote site: seconds since the carrying tunnel's latest handshake (-1: never).",
            &|t: &TunnelStatus| {
                t.last_handshake
                    .map_or(-1.0, |h| now.saturating_sub(h) as f64)
            },
        ),
        (
            "site_receive_bytes_total",
            "counter",
            "On the active gateway, per remote site: bytes received on the carrying tunnel (the device's count).",
            &|t: &TunnelStatus| t.rx_bytes as f64,
        ),
        (
            "site_transmit_bytes_total",
            "counter",
            "On the active gateway, per remote site: bytes sent on the carrying tunnel (the device's count).",
            &|t: &TunnelStatus| t.tx_bytes as f64,
        ),
    ] {
        head(out, name, kind, help);
        for (site, t) in &tunnels {
            let _ = writeln!(
                out,
                "sticky_vxlan_agent_{name}{{site=\"{site}\",peer=\"{}\"}} {}",
                t.peer,
                value(t)
            );
        }
    }
}
