//! The node agent's status file (`<stateDir>/<network>.agent.json`): the agent
//! (`sticky-vxlan-agent`) writes it, `sticky-vxlan show` reads it ([`describe`]). Here, below
//! both programs, so that each imports the one type and neither the other.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

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
    /// Sites (docs/sites.md), when the network has a `sites` object. Absent from older
    /// agents' files. Shared: a hub's is thousands of sites, and the agent compares its status
    /// with the one it wrote at every pass of its loop (the same allocation compares at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sites: Option<Arc<SitesStatus>>,
}

/// This node's view of the sites.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SitesStatus {
    /// This node's site.
    pub site: String,
    /// "active gateway", "member, through gateway <name>", or why neither.
    pub role: String,
    /// Every other site, by name.
    pub remotes: Vec<RemoteSite>,
    /// Nodes whose site part was refused (each logged with why).
    pub left_out: usize,
    /// What keeps the tunnel from being as planned, if anything.
    pub error: Option<String>,
}

/// One remote site as this node sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSite {
    pub site: String,
    /// Its active gateway, if it has one.
    pub gateway: Option<String>,
    /// "direct", "relayed via <site>", or "unreachable: <why>".
    pub path: String,
    /// On the active gateway only: the tunnel that carries this site's traffic.
    pub tunnel: Option<TunnelStatus>,
}

/// The WireGuard peer carrying a remote site's traffic, as the device reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelStatus {
    /// The peer (the carrier's gateway).
    pub peer: String,
    /// Unix seconds of the latest handshake; `None`: never.
    pub last_handshake: Option<u64>,
    /// A handshake within the last 180 s (WireGuard rekeys every 120 s while traffic flows,
    /// and keepalives keep it so where configured).
    pub up: bool,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// A change the guard refused that the operator accepted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Accepted {
    /// Unix seconds of the acceptance.
    pub at: u64,
    /// What the change does (the agent's guard says it).
    pub change: String,
}

/// The last reconcile of one segment network the agent keeps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SegmentStatus {
    pub config: PathBuf,
    /// Why the last reconcile failed; `None` when it succeeded.
    pub error: Option<String>,
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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
        let Some(s) = sticky_primitives::nofollow::read(&f)
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
        if let Some(sites) = &s.sites {
            describe_sites(&mut out, sites);
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

/// The sites part of `show`: one line for this node, one per remote site.
fn describe_sites(out: &mut String, sites: &SitesStatus) {
    let _ = writeln!(out, "  site {}: {}", sites.site, sites.role);
    if let Some(e) = &sites.error {
        let _ = writeln!(out, "  sites: FAILING, retrying: {e}");
    }
    if sites.left_out > 0 {
        let _ = writeln!(
            out,
            "  {} node(s) left out of the sites (the agent's log names each and why)",
            sites.left_out
        );
    }
    for r in &sites.remotes {
        let tunnel = match &r.tunnel {
            None => String::new(),
            Some(t) => format!(
                "; tunnel to {} {}, last handshake {}, {} B received, {} B sent",
                t.peer,
                if t.up { "UP" } else { "DOWN" },
                ago(t.last_handshake),
                t.rx_bytes,
                t.tx_bytes
            ),
        };
        let _ = writeln!(
            out,
            "  remote site {}: gateway {}, {}{tunnel}",
            r.site,
            r.gateway.as_deref().unwrap_or("NONE"),
            r.path
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_says_each_remote_sites_gateway_path_and_tunnel() {
        let mut out = String::new();
        describe_sites(
            &mut out,
            &SitesStatus {
                site: "site-a".into(),
                role: "active gateway".into(),
                remotes: vec![
                    RemoteSite {
                        site: "cloud".into(),
                        gateway: Some("c1".into()),
                        path: "direct".into(),
                        tunnel: Some(TunnelStatus {
                            peer: "c1".into(),
                            last_handshake: Some(now_unix() - 5),
                            up: true,
                            rx_bytes: 10,
                            tx_bytes: 20,
                        }),
                    },
                    RemoteSite {
                        site: "site-b".into(),
                        gateway: Some("b1".into()),
                        path: "relayed via cloud".into(),
                        tunnel: None,
                    },
                ],
                left_out: 1,
                error: None,
            },
        );
        assert!(out.contains("site site-a: active gateway"), "{out}");
        assert!(
            out.contains("remote site cloud: gateway c1, direct; tunnel to c1 UP, last handshake 5s ago, 10 B received, 20 B sent"),
            "{out}"
        );
        assert!(
            out.contains("remote site site-b: gateway b1, relayed via cloud\n"),
            "{out}"
        );
        assert!(out.contains("1 node(s) left out of the sites"), "{out}");
    }

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
