//! What the agent knows about itself, shared between its threads: served as Prometheus
//! metrics, and written to a small status file that `sticky-vxlan show` reads.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The status file's content (also what `show` prints from).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub network: String,
    pub peers_file: PathBuf,
    /// "kubernetes API `<url>`" or "peers file only (--no-api)".
    pub source: String,
    pub api_reachable: bool,
    /// Unix seconds of the API's last answer (a list, a watch opened, an event; to within 10 s).
    pub last_api_answer: Option<u64>,
    /// Unix seconds of the last complete list.
    pub last_sync: Option<u64>,
    /// Unix seconds since which the peers may miss changes made in the API: from the first
    /// failure until the next complete list. Absent from older agents' files.
    #[serde(default)]
    pub stale_since: Option<u64>,
    /// The last failure talking to the API.
    #[serde(default)]
    pub last_error: Option<String>,
    pub peers: usize,
    /// Set while the removal guard keeps the old peers.
    pub refused: Option<String>,
    /// The last change the operator accepted with `accept-changes`. Absent from older
    /// agents' files.
    #[serde(default)]
    pub accepted: Option<Accepted>,
    /// Nodes left out of the peers (each logged with why when it happens).
    #[serde(default)]
    pub left_out: usize,
    pub pid: u32,
    /// Every `--segment-config` reconciled so far, in order, with its last outcome. Absent
    /// from the files of agents older than this field: then no segment is known.
    #[serde(default)]
    pub segments: Vec<SegmentStatus>,
}

/// A change the guard refused that the operator accepted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Accepted {
    /// Unix seconds of the acceptance.
    pub at: u64,
    /// What the change does ([`super::guard::Refused::what`]).
    pub change: String,
}

/// The last reconcile of one segment network the agent keeps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SegmentStatus {
    pub config: PathBuf,
    /// Why the last reconcile failed; `None` when it succeeded.
    pub error: Option<String>,
}

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

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

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

/// Where the agent of network `network` writes its status.
pub fn status_path(state_dir: &Path, network: &str) -> PathBuf {
    state_dir.join(format!("{network}.agent.json"))
}

fn ago(t: Option<u64>) -> String {
    match t {
        None => "never".into(),
        Some(t) => format!("{}s ago", now_unix().saturating_sub(t)),
    }
}

/// One paragraph per agent status file in `state_dir`, for `sticky-vxlan show`.
pub fn describe(state_dir: &Path) -> String {
    let mut out = String::new();
    let Ok(dir) = std::fs::read_dir(state_dir) else {
        return out;
    };
    let mut files: Vec<PathBuf> = dir
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".agent.json"))
        .collect();
    files.sort();
    for f in files {
        // Regular files only, never through a link, never blocking on a FIFO.
        let Some(s) = crate::nofollow::read(&f)
            .ok()
            .flatten()
            .and_then(|t| serde_json::from_slice::<Status>(&t).ok())
        else {
            continue;
        };
        let running = Path::new(&format!("/proc/{}", s.pid)).exists();
        let _ = writeln!(
            out,
            "agent for network {} (pid {}{}): {} peers in {} from {}; API {}, last answered {}, last complete list {}",
            s.network,
            s.pid,
            if running { "" } else { ", not running" },
            s.peers,
            s.peers_file.display(),
            s.source,
            if s.api_reachable {
                "reachable"
            } else {
                "unreachable"
            },
            ago(s.last_api_answer),
            ago(s.last_sync),
        );
        if let Some(t) = s.stale_since {
            let _ = writeln!(
                out,
                "  STALE since {} (no complete node list since then): {}",
                ago(Some(t)),
                s.last_error.as_deref().unwrap_or("the API does not answer")
            );
        }
        if s.left_out > 0 {
            let _ = writeln!(
                out,
                "  {} node(s) left out of the peers (the agent's log names each and why)",
                s.left_out
            );
        }
        if let Some(r) = &s.refused {
            let _ = writeln!(out, "  REFUSED: {r}");
        }
        if let Some(a) = &s.accepted {
            let _ = writeln!(
                out,
                "  ACCEPTED by the operator {} (accept-changes): {}",
                ago(Some(a.at)),
                a.change
            );
        }
        for seg in &s.segments {
            let _ = match &seg.error {
                None => writeln!(out, "  segment {}: reconciled", seg.config.display()),
                Some(e) => writeln!(
                    out,
                    "  segment {}: FAILING, retrying: {e}",
                    seg.config.display()
                ),
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `show` reads the agents' status files: a FIFO or a link planted at such a name in
    /// stateDir must neither block it nor be followed.
    #[test]
    fn a_fifo_or_link_at_a_status_name_is_skipped_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("a.agent.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let secret = dir.path().join("secret");
        let status = |network: &str| {
            serde_json::to_vec(&Status {
                network: network.into(),
                ..Status::default()
            })
            .unwrap()
        };
        std::fs::write(&secret, status("leaked")).unwrap();
        std::os::unix::fs::symlink(&secret, dir.path().join("b.agent.json")).unwrap();
        std::fs::write(dir.path().join("c.agent.json"), status("shown")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || tx.send(describe(&path)).unwrap());
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        if got.is_err() {
            // Unblock the reader before failing, so no thread is left waiting.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        let out = got.expect("describe blocked on a FIFO at a status file name");
        assert!(!out.contains("leaked"), "a link was followed: {out}");
        assert!(out.contains("agent for network shown"), "{out}");
    }

    /// `show` says how each segment the agent keeps fared, and reads an older agent's file,
    /// which has no `segments`.
    #[test]
    fn show_lists_the_segments_and_reads_files_without_them() {
        let dir = tempfile::tempdir().unwrap();
        let status = Status {
            network: "main".into(),
            segments: vec![
                SegmentStatus {
                    config: "/etc/cni/net.d/20-seg-a.conflist".into(),
                    error: None,
                },
                SegmentStatus {
                    config: "/etc/cni/net.d/21-seg-b.conflist".into(),
                    error: Some("vni 0 is not a VNI".into()),
                },
            ],
            ..Status::default()
        };
        std::fs::write(
            dir.path().join("main.agent.json"),
            serde_json::to_vec(&status).unwrap(),
        )
        .unwrap();
        let mut old = serde_json::to_value(Status {
            network: "old".into(),
            ..Status::default()
        })
        .unwrap();
        old.as_object_mut().unwrap().remove("segments");
        std::fs::write(
            dir.path().join("old.agent.json"),
            serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        let out = describe(dir.path());
        assert!(
            out.contains("  segment /etc/cni/net.d/20-seg-a.conflist: reconciled\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "  segment /etc/cni/net.d/21-seg-b.conflist: FAILING, retrying: vni 0 is not a VNI"
            ),
            "{out}"
        );
        assert!(out.contains("agent for network old"), "{out}");
    }
}
