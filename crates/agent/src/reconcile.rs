//! The one place the agent programs the node: the main network and every `--segment-config`,
//! in rounds the main loop starts (see [`round`]). The networks are reached through
//! [`Networks`], so the dispatch is tested with a recording fake.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::state::Shared;
use sticky_overlay::config::Config;
use sticky_vxlan::main_mode::change::{Changed, FileChange};
use sticky_vxlan::main_mode::reconcile::Report;
use sticky_vxlan::networks;
use sticky_vxlan::segment::reconcile::Reconciled as SegmentReconciled;
use sticky_vxlan::status::SegmentStatus;

/// Why a network could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Its file could not be used, or (a segment) programming it failed: in the words of
    /// `sticky-vxlan reconcile --config <file>`.
    #[error("{}", .source.about(.config))]
    Network {
        config: PathBuf,
        /// Boxed: the file's error is large and this one is returned on every round.
        #[source]
        source: Box<networks::Error>,
    },
    /// Programming the main network failed.
    #[error(transparent)]
    Node(#[from] sticky_overlay::Error),
}

/// A periodic resync takes at most this share of the node's time: a full reconcile compares
/// every route, neighbour and FDB entry with the peers file, so its cost grows with the cluster
/// (about 0.7 s at 100,000 peers), and at a fixed `--resync` it would be the agent's largest
/// idle cost there. Past that size the resyncs are spaced by their own cost.
pub const RESYNC_SHARE: u32 = 400;

/// How long after the last full round the next periodic resync is due: `--resync`, or
/// [`RESYNC_SHARE`] times what the last periodic resync took, whichever is longer.
pub fn resync_every(resync: Duration, full_took: Duration) -> Duration {
    resync.max(full_took.saturating_mul(RESYNC_SHARE))
}

fn network(config: &Path) -> impl FnOnce(networks::Error) -> Error + '_ {
    |source| Error::Network {
        config: config.to_path_buf(),
        source: Box::new(source),
    }
}

/// What one reconcile of the main network did, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// In full: the remote peers programmed; why the peers file could not be used, if it could
    /// not (programmed peers were then left as they are); why a change the agent wrote could
    /// not be programmed as one, if it was one.
    Full {
        remote_peers: usize,
        peers_file_error: Option<String>,
        not_a_change: Option<&'static str>,
    },
    /// A change of the peers file programmed as one: the peers that changed, the entries
    /// written.
    Change { peers: usize, entries: usize },
}

impl std::fmt::Display for Reconciled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reconciled::Full {
                remote_peers,
                peers_file_error,
                not_a_change,
            } => {
                write!(f, "{remote_peers} remote peer(s)")?;
                if let Some(e) = peers_file_error {
                    write!(f, "; {e}: programmed peers left as they are")?;
                }
                if let Some(why) = not_a_change {
                    write!(f, "; in full: {why}")?;
                }
                Ok(())
            }
            Reconciled::Change { peers, entries } => {
                write!(f, "{peers} peer(s) changed, {entries} entries written")
            }
        }
    }
}

/// Reconciles this node exactly as `sticky-vxlan reconcile` does (VTEP, bridge, peers, under
/// the network's lock, the same lock the plugin's ADD takes).
pub fn reconcile_node(cfg: &Config) -> Result<Reconciled, sticky_overlay::Error> {
    let report = sticky_vxlan::main_mode::reconcile::run(cfg)?;
    Ok(full(&report, None))
}

fn full(report: &Report, not_a_change: Option<&'static str>) -> Reconciled {
    Reconciled::Full {
        remote_peers: report.node.remote.len(),
        peers_file_error: report.node.peers_file_error.clone(),
        not_a_change,
    }
}

/// Programs `change`, the agent's last write of the peers file, as a change when the plugin
/// can prove it may ([`sticky_vxlan::main_mode::change`]), in full otherwise.
pub fn change_node(cfg: &Config, change: &FileChange) -> Result<Reconciled, sticky_overlay::Error> {
    Ok(
        match sticky_vxlan::main_mode::change::change(cfg, change)? {
            Changed::Entries(entries) => Reconciled::Change {
                peers: change.peers.len(),
                entries,
            },
            Changed::Already => Reconciled::Change {
                peers: change.peers.len(),
                entries: 0,
            },
            Changed::Full(why, report) => full(&report, Some(why)),
        },
    )
}

/// Programs one network from its config file (re-read every time).
pub trait Networks {
    /// The main network; `change`: the agent's write of the peers file since the last round,
    /// to program as a change.
    fn main(&mut self, config: &Path, change: Option<&FileChange>) -> Result<Reconciled, Error>;
    /// What the segment's reconcile did.
    fn segment(&mut self, config: &Path) -> Result<SegmentReconciled, Error>;
}

/// The kernel, through the same code as `sticky-vxlan reconcile --config <file>`.
pub struct LiveNetworks;

impl Networks for LiveNetworks {
    fn main(&mut self, config: &Path, change: Option<&FileChange>) -> Result<Reconciled, Error> {
        let cfg = networks::load(config).map_err(network(config))?;
        Ok(match change {
            Some(change) => change_node(&cfg, change)?,
            None => reconcile_node(&cfg)?,
        })
    }

    fn segment(&mut self, config: &Path) -> Result<SegmentReconciled, Error> {
        networks::reconcile_segment(config).map_err(network(config))
    }
}

/// How a network's last reconcile ended, as logged. A failure is kept by its words: they are
/// what the log and the status file show, and what tells a new failure from the same one
/// again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Last<T> {
    Reconciled(T),
    Failed(String),
}

impl<T> Last<T> {
    fn of(outcome: Result<T, Error>) -> Last<T> {
        match outcome {
            Ok(done) => Last::Reconciled(done),
            Err(e) => Last::Failed(e.to_string()),
        }
    }

    fn failed(last: &Option<Last<T>>) -> bool {
        matches!(last, Some(Last::Failed(_)))
    }
}

/// The last outcome of each network: to log only what changed and retry only what failed.
#[derive(Debug, Default)]
pub struct Outcomes {
    pub main: Option<Last<Reconciled>>,
    /// One per `--segment-config`, in order.
    pub segments: Vec<Option<Last<SegmentReconciled>>>,
}

impl Outcomes {
    pub fn new(segments: usize) -> Outcomes {
        Outcomes {
            main: None,
            segments: vec![None; segments],
        }
    }

    /// True while a network's last reconcile failed.
    pub fn failing(&self) -> bool {
        Last::failed(&self.main) || self.segments.iter().any(Last::failed)
    }
}

/// The main network in a round: its config, and the agent's write of the peers file since the
/// last round, to program as a change.
#[derive(Debug, Clone, Copy)]
pub struct Main<'a> {
    pub config: &'a Path,
    pub change: Option<&'a FileChange>,
}

/// One round: the main network (with `change`, the agent's write since the last round), then
/// each segment in order; with `only_failed` (a retry), only those whose last reconcile
/// failed. A failure is counted and logged and never keeps
/// another network from being reconciled. Returns the log lines: one per network whose
/// outcome differs from its last one.
pub fn round(
    networks: &mut impl Networks,
    main: Main<'_>,
    segment_configs: &[PathBuf],
    only_failed: bool,
    why: &str,
    outcomes: &mut Outcomes,
    shared: &Shared,
) -> Vec<String> {
    let mut log = Vec::new();
    if !only_failed || Last::failed(&outcomes.main) {
        let outcome = Last::of(networks.main(main.config, main.change));
        {
            let mut s = shared.lock();
            s.counters.reconciles += 1;
            s.counters.reconcile_errors += u64::from(matches!(outcome, Last::Failed(_)));
        }
        if outcomes.main.as_ref() != Some(&outcome) {
            log.push(match &outcome {
                Last::Reconciled(r) => format!("reconciled ({why}): {r}"),
                Last::Failed(e) => format!("reconcile ({why}) failed: {e}; retrying"),
            });
            outcomes.main = Some(outcome);
        }
    }
    outcomes.segments.resize(segment_configs.len(), None);
    for (config, last) in segment_configs.iter().zip(&mut outcomes.segments) {
        if only_failed && !Last::failed(last) {
            continue;
        }
        let outcome = Last::of(networks.segment(config));
        {
            let mut s = shared.lock();
            s.counters.segment_reconciles += 1;
            s.counters.segment_reconcile_errors += u64::from(matches!(outcome, Last::Failed(_)));
        }
        if last.as_ref() != Some(&outcome) {
            log.push(match &outcome {
                Last::Reconciled(said) => format!("reconciled ({why}): {said}"),
                Last::Failed(e) => format!("segment reconcile ({why}) failed: {e}; retrying"),
            });
            *last = Some(outcome);
        }
    }
    shared.lock().status.segments = segment_configs
        .iter()
        .zip(&outcomes.segments)
        .filter_map(|(config, last)| {
            last.as_ref().map(|o| SegmentStatus {
                config: config.clone(),
                error: match o {
                    Last::Failed(e) => Some(e.clone()),
                    Last::Reconciled(_) => None,
                },
            })
        })
        .collect();
    log
}

#[cfg(test)]
mod tests {
    use super::*;
    use sticky_vxlan::status::Status;

    #[test]
    fn a_resync_is_spaced_by_its_own_cost_once_that_outgrows_the_flag() {
        let flag = Duration::from_secs(60);
        // 5,000 peers: tens of milliseconds, the flag holds.
        assert_eq!(resync_every(flag, Duration::from_millis(60)), flag);
        assert_eq!(resync_every(flag, Duration::from_millis(150)), flag);
        // 100,000 peers: 0.7 s a round, one every 280 s (a quarter of a percent).
        assert_eq!(
            resync_every(flag, Duration::from_millis(700)),
            Duration::from_secs(280)
        );
        // A shorter flag is stretched the same way; a round that never ends stays bounded.
        assert_eq!(
            resync_every(Duration::from_secs(1), Duration::from_millis(10)),
            Duration::from_secs(4)
        );
        assert_eq!(resync_every(flag, Duration::MAX), Duration::MAX);
    }

    /// A file the operator tools cannot use (here: not a segment's), as they say it.
    fn broken(config: &Path) -> Error {
        network(config)(networks::Error::NotSegment(config.into()))
    }

    /// Records every call; fails the configs named in `broken`.
    #[derive(Default)]
    struct Recording {
        calls: Vec<PathBuf>,
        broken: Vec<PathBuf>,
    }

    impl Networks for Recording {
        fn main(
            &mut self,
            config: &Path,
            change: Option<&FileChange>,
        ) -> Result<Reconciled, Error> {
            self.calls.push(config.into());
            if self.broken.iter().any(|b| b == config) {
                return Err(broken(config));
            }
            Ok(match change {
                Some(c) => Reconciled::Change {
                    peers: c.peers.len(),
                    entries: 4,
                },
                None => Reconciled::Full {
                    remote_peers: 2,
                    peers_file_error: None,
                    not_a_change: None,
                },
            })
        }
        fn segment(&mut self, config: &Path) -> Result<SegmentReconciled, Error> {
            self.calls.push(config.into());
            if self.broken.iter().any(|b| b == config) {
                return Err(broken(config));
            }
            Ok(SegmentReconciled {
                network: config.display().to_string(),
                vni: 1,
                port: 4789,
                bridge: "br".into(),
                vxlan: "vx".into(),
                flood_to: 2,
            })
        }
    }

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    fn counters(shared: &Shared) -> [u64; 4] {
        let c = &shared.lock().counters;
        [
            c.reconciles,
            c.reconcile_errors,
            c.segment_reconciles,
            c.segment_reconcile_errors,
        ]
    }

    #[test]
    fn every_network_is_reconciled_whatever_failed_before_it() {
        let shared = Shared::new(Status::default());
        let segments = paths(&["/s1", "/s2", "/s3"]);
        let mut fake = Recording {
            broken: paths(&["/main", "/s2"]),
            ..Recording::default()
        };
        let mut outcomes = Outcomes::new(segments.len());
        let log = round(
            &mut fake,
            Main {
                config: Path::new("/main"),
                change: None,
            },
            &segments,
            false,
            "start",
            &mut outcomes,
            &shared,
        );
        assert_eq!(fake.calls, paths(&["/main", "/s1", "/s2", "/s3"]));
        assert_eq!(counters(&shared), [1, 1, 3, 1]);
        // The status file (and so `show`) says how each segment fared.
        let errors: Vec<(PathBuf, bool)> = shared
            .lock()
            .status
            .segments
            .iter()
            .map(|s| (s.config.clone(), s.error.is_some()))
            .collect();
        assert_eq!(
            errors,
            [
                ("/s1".into(), false),
                ("/s2".into(), true),
                ("/s3".into(), false)
            ]
        );
        assert!(outcomes.failing());
        assert_eq!(log.len(), 4, "{log:?}");
        assert_eq!(
            log[0],
            "reconcile (start) failed: --config /main: not a segment network (its sticky-vxlan \
             entry has no \"mode\": \"segment\"); retrying"
        );
        assert_eq!(
            log[1],
            "reconciled (start): segment /s1 vni 1 port 4789: br and vx up, flood to 2 node(s)"
        );
        assert!(log[2].contains("--config /s2: not a segment") && log[2].contains("retrying"));

        // A retry reconciles only what failed; the same outcome again is not logged.
        fake.calls.clear();
        let log = round(
            &mut fake,
            Main {
                config: Path::new("/main"),
                change: None,
            },
            &segments,
            true,
            "retry",
            &mut outcomes,
            &shared,
        );
        assert_eq!(fake.calls, paths(&["/main", "/s2"]));
        assert!(log.is_empty(), "{log:?}");
        assert_eq!(counters(&shared), [2, 2, 4, 2]);

        // Fixed: the next full round reconciles all, logs what changed, nothing fails.
        fake.broken.clear();
        fake.calls.clear();
        let log = round(
            &mut fake,
            Main {
                config: Path::new("/main"),
                change: None,
            },
            &segments,
            false,
            "the peers file was changed by hand",
            &mut outcomes,
            &shared,
        );
        assert_eq!(fake.calls, paths(&["/main", "/s1", "/s2", "/s3"]));
        assert_eq!(log.len(), 2, "main and /s2 changed: {log:?}");
        assert!(!outcomes.failing());
        assert!(
            shared
                .lock()
                .status
                .segments
                .iter()
                .all(|s| s.error.is_none())
        );
        assert_eq!(counters(&shared), [3, 2, 7, 2]);
    }

    #[test]
    fn without_segments_a_round_is_the_main_network_alone() {
        let shared = Shared::new(Status::default());
        let mut fake = Recording::default();
        let mut outcomes = Outcomes::new(0);
        let log = round(
            &mut fake,
            Main {
                config: Path::new("/main"),
                change: None,
            },
            &[],
            false,
            "start",
            &mut outcomes,
            &shared,
        );
        assert_eq!(fake.calls, paths(&["/main"]));
        assert_eq!(log, ["reconciled (start): 2 remote peer(s)"]);
        assert_eq!(counters(&shared), [1, 0, 0, 0]);
        // The agent's write reaches the main network as a change, and the log says what it
        // programmed.
        let change = FileChange {
            from_hash: "h".into(),
            text: b"[]".to_vec(),
            id: sticky_overlay::stamp::FileId::of(Path::new("/")).unwrap(),
            peers: vec![(None, None), (None, None)],
        };
        let log = round(
            &mut fake,
            Main {
                config: Path::new("/main"),
                change: Some(&change),
            },
            &[],
            false,
            "the agent wrote the peers file",
            &mut outcomes,
            &shared,
        );
        assert_eq!(
            log,
            ["reconciled (the agent wrote the peers file): 2 peer(s) changed, 4 entries written"]
        );
    }
}
