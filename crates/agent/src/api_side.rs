//! The API's half of the agent's main loop ([`ApiSide`]): the Nodes as the reflector sends
//! them, turned into the peers file by the [`Keeper`] behind the guard; the publisher of this
//! node's annotations; and the operator's `accept-changes` file.

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sticky_overlay::config::Config;
use sticky_overlay::peers::Peer;
use sticky_vxlan::status;

use crate::files;
use crate::guard;
use crate::kube::Kube;
use crate::log;
use crate::objects::Node;
use crate::publish::{self, Publishing};
use crate::sites;
use crate::sites::shape::Shaper;
use crate::state::Shared;
use crate::sync::{self, Keeper};
use crate::table;
use sticky_vxlan::main_mode::change::FileChange;

/// A refused change is tried again this often (the window may have passed).
pub const RETRY: Duration = Duration::from_secs(5);

/// The API's half of the main loop: the Nodes as the reflector sends them, turned into the
/// peers file; and the publisher of this node's flannel (and sites) annotations.
pub struct ApiSide {
    pub keeper: Keeper,
    /// This node's own Node as last seen (for what it publishes).
    own: Option<Node>,
    publisher: Option<(Publishing, Kube)>,
    /// When the guard last refused (the change is tried again every [`RETRY`]).
    refused_at: Option<Instant>,
    /// The plugin's last-good copy of the peers file, read again only when it changed.
    last_good: files::PeersCache,
    /// What this node observes of its site changed: the plan is made again.
    pub observed: bool,
    /// This node's sites annotations, as its key file and tunnel say.
    sites: sites::publish::Annotations,
    /// The last write's change of the peers file, until the main loop programs it.
    pub change: Option<Box<FileChange>>,
}

impl ApiSide {
    /// The keeper of `peers_file` and the publisher, if any (with no own Node name, nothing
    /// is published).
    pub fn new(keeper: Keeper, publisher: Option<(Publishing, Kube)>) -> Self {
        Self {
            keeper,
            own: None,
            publisher,
            refused_at: None,
            last_good: files::PeersCache::default(),
            observed: false,
            sites: sites::publish::Annotations::default(),
            change: None,
        }
    }

    /// Applies a burst of updates; writes the peers file when the peers changed (or a
    /// refused change is due to be tried again). True when the file was written.
    /// With sites, `shaper` is the sites run's (see [`sync::Keeper::write`]).
    pub fn apply(
        &mut self,
        updates: Vec<sync::Update>,
        cfg: &Config,
        shared: &Shared,
        shaper: Option<&Shaper>,
    ) -> bool {
        let (dirty, own) = self.take_updates(updates, shared);
        self.publish(own, shared);
        let accepted = self.take_accept_file(cfg, shared);
        let retry = self.refused_at.is_some_and(|t| t.elapsed() >= RETRY);
        let dirty = dirty | std::mem::take(&mut self.observed);
        if !dirty && !retry && !accepted {
            return false;
        }
        self.write(cfg, shared, shaper)
    }

    /// Hands the Nodes of `updates` to the keeper and records the API's state; keeps the own
    /// Node. Returns whether the keeper's Nodes changed, and the own Node if it came.
    fn take_updates(
        &mut self,
        updates: Vec<sync::Update>,
        shared: &Shared,
    ) -> (bool, Option<Box<Node>>) {
        let mut dirty = false;
        let mut own = None;
        for u in updates {
            match u {
                sync::Update::State(s) => {
                    if let Some(line) = sync::record_state(shared, &s) {
                        log(&line);
                    }
                }
                sync::Update::Own(n) => own = Some(n),
                u => dirty |= self.keeper.apply(u),
            }
        }
        if let Some(n) = &own {
            self.own = Some((**n).clone());
        }
        (dirty, own)
    }

    /// Offers the own Node `own` (when it came) to the publisher and lets it publish when due.
    fn publish(&mut self, own: Option<Box<Node>>, shared: &Shared) {
        let Some((p, kube)) = &mut self.publisher else {
            return;
        };
        if let Some(n) = own {
            p.offer(*n);
        }
        let attempt = p.run(kube, Instant::now());
        let node = &p.publisher.node_name;
        match attempt {
            publish::Attempt::Idle => {}
            publish::Attempt::Published => {
                log(&format!("published flannel annotations on Node {node}"));
            }
            publish::Attempt::Unknown(e) => {
                log(&format!(
                    "publishing flannel annotations: {e}; tried again when the Node changes"
                ));
            }
            publish::Attempt::Failed { error, retry_in } => {
                shared.lock().counters.publish_failures += 1;
                log(&format!(
                    "publishing flannel annotations on Node {node}: {error}; trying again in {:.1} s",
                    retry_in.as_secs_f64()
                ));
            }
        }
    }

    /// Keeps this node's sites annotations as its key file and tunnel say (once a round);
    /// nothing before the own Node is seen or without a publisher.
    pub fn publish_sites(&mut self, run: &mut sites::run::SitesRun) {
        let (Some(own), Some((p, _))) = (&self.own, &mut self.publisher) else {
            return;
        };
        for line in self.sites.keep(p, own, run) {
            log(&line);
        }
    }

    /// Writes the peers file from the keeper's Nodes (checked against the peers the plugin
    /// holds now), and records the outcome. True when the file was written.
    fn write(&mut self, cfg: &Config, shared: &Shared, shaper: Option<&Shaper>) -> bool {
        let held = Self::held_peers(&mut self.last_good, &mut self.keeper, cfg);
        let accepts = |list: &[Peer]| plugin_accepts(cfg, list);
        let (outcome, lines) = self.keeper.write(Instant::now(), &held, accepts, shaper);
        for l in lines {
            log(&l);
        }
        self.record(outcome, shared)
    }

    /// The peers this node's plugin holds: its last-good copy (borrowed from the cache: at
    /// 100,000 peers a copy at every write was a part of a change), else the peers file.
    fn held_peers<'a>(
        last_good: &'a mut files::PeersCache,
        keeper: &mut Keeper,
        cfg: &Config,
    ) -> Cow<'a, [Peer]> {
        let copy = last_good
            .get(&cfg.last_good_peers_path(), |p| {
                // Once the plugin programmed the agent's last write, its copy is that very
                // file: its peers are the keeper's, and a hash (5 ms at 100,000 peers) spares
                // parsing it again (50 ms).
                if let Some((peers, hash)) = keeper.current()
                    && sticky_overlay::stamp::content(p)
                        .is_some_and(|text| sticky_overlay::stamp::hash(&text) == hash)
                {
                    return Some(peers.to_vec());
                }
                Some(sticky_overlay::peers::last_good(p))
            })
            .unwrap_or_default();
        if copy.is_empty() {
            Cow::Owned(files::current_peers(&keeper.peers_file).unwrap_or_default())
        } else {
            Cow::Borrowed(copy)
        }
    }

    /// The outcome of a write in the status, the counters and the log (a standing refusal
    /// once). True when the file was written.
    fn record(&mut self, outcome: sync::Outcome, shared: &Shared) -> bool {
        let mut s = shared.lock();
        s.status.left_out = self.keeper.left_out().len();
        let refused = match outcome {
            sync::Outcome::Written {
                lines,
                peers,
                change,
            } => {
                for l in lines {
                    log(&l);
                }
                self.change = change;
                s.status.peers = peers;
                s.counters.file_writes += 1;
                s.own_write = files::fingerprint(&self.keeper.peers_file);
                self.refused_at = None;
                s.status.refused = None;
                return true;
            }
            sync::Outcome::Unchanged => None,
            sync::Outcome::Refused(r) => {
                s.counters.removals_refused += 1;
                Some(r)
            }
            sync::Outcome::Unusable(why) => Some(format!(
                "no peer list this node's plugin accepts can be made from the Nodes: {why}; keeping the peers file as it is"
            )),
            sync::Outcome::Failed(why) => {
                log(&why);
                None
            }
        };
        self.refused_at = refused.as_ref().map(|_| Instant::now());
        if refused != s.status.refused {
            if let Some(r) = &refused {
                log(&format!("REFUSED: {r}"));
            }
            s.status.refused = refused;
        }
        false
    }

    /// The operator's `accept-changes` file, if it appeared: removed, and the change the
    /// guard refuses now accepted (said in the log and the status); with no refusal of the
    /// guard standing it accepts nothing, and the log says so. True when a change was
    /// accepted.
    fn take_accept_file(&mut self, cfg: &Config, shared: &Shared) -> bool {
        let path = accept_changes_path(cfg);
        if std::fs::symlink_metadata(&path).is_err() {
            return false;
        }
        if let Err(e) = std::fs::remove_file(&path) {
            log(&format!("{}: {e}; it is not taken", path.display()));
            return false;
        }
        let Some(refused) = self.keeper.guard.accept(Instant::now()) else {
            log(&format!(
                "{}: the guard refuses no change, so the file accepts nothing; removed",
                path.display()
            ));
            return false;
        };
        let what = refused.what();
        log(&format!(
            "{}: the operator accepts the change the guard refused: {what}; it is written once if it comes within {} minutes",
            path.display(),
            guard::ACCEPT_FOR.as_secs() / 60
        ));
        let mut s = shared.lock();
        s.status.accepted = Some(status::Accepted {
            at: status::now_unix(),
            change: what,
        });
        true
    }
}

/// This node's plugin's own check of a peer list ([`sticky_overlay::node::accepts_here`]).
fn plugin_accepts(
    cfg: &Config,
    list: &[sticky_overlay::peers::Peer],
) -> Result<sticky_overlay::node::Observed, table::Refusal> {
    sticky_overlay::node::accepts_here(cfg, list).map_err(|e| match e {
        sticky_overlay::Error::Peers(p) => table::Refusal::Peers(p),
        sticky_overlay::Error::Socket(e) => table::Refusal::Other(format!("netlink: {e}")),
        other => table::Refusal::Other(other.to_string()),
    })
}

/// The file whose existence accepts the change the guard refuses, once.
fn accept_changes_path(cfg: &Config) -> PathBuf {
    cfg.state_dir.join(format!("{}.accept-changes", cfg.name))
}
