//! What the agent knows about itself, shared between its threads: served as Prometheus
//! metrics, and written to a small status file ([`sticky_vxlan::status`]) that `sticky-vxlan show` reads.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use sticky_vxlan::status::Status;

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
        out
    }
}
