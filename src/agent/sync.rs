//! The API side: list, then watch from the list's resourceVersion; keep the nodes seen, and
//! write the peers file when the peers they stand for change.
//!
//! Offline is normal: an error, a refused connection or a list cut half-way changes nothing
//! on disk; the agent backs off (with jitter) and tries again. A watch that ends is resumed
//! from the last resourceVersion; `410 Gone` means list again. Only a complete list (and the
//! watch that follows it) may remove a peer, and never more than `--max-remove-fraction` of
//! them at once.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use super::client::{Client, Error};
use super::files;
use super::mapping;
use super::objects::{Event, Node};
use super::publish::Publisher;
use super::state::{Shared, now_unix};

/// Exponential backoff from 1 s to 30 s with ±25% jitter, so a fleet of agents does not
/// reconnect in step after an outage.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const MIN: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);

    fn new() -> Backoff {
        Backoff { next: Self::MIN }
    }
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
    fn sleep(&mut self) {
        std::thread::sleep(jitter(self.next, 0.25));
        self.next = (self.next * 2).min(Self::MAX);
    }
}

/// `d` ± `fraction`, from a per-call random seed of the standard library's hasher.
fn jitter(d: Duration, fraction: f64) -> Duration {
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let unit = (r % 10_000) as f64 / 10_000.0; // [0, 1)
    d.mul_f64(1.0 - fraction + 2.0 * fraction * unit)
}

pub struct NodeSync {
    pub client: Client,
    pub peers_file: PathBuf,
    pub max_remove_fraction: f64,
    pub shared: Shared,
    pub notify: Sender<()>,
    pub publisher: Option<Publisher>,
    nodes: BTreeMap<String, Node>,
    skipped: BTreeMap<String, String>,
    refused: Option<String>,
    offline_logged: bool,
}

enum WatchEnd {
    /// The server ended the stream: resume from the last resourceVersion.
    Closed,
    Gone,
    Failed(String),
}

fn log(msg: &str) {
    eprintln!("sticky-vxlan agent: {msg}");
}

impl NodeSync {
    pub fn new(
        client: Client,
        peers_file: PathBuf,
        max_remove_fraction: f64,
        shared: Shared,
        notify: Sender<()>,
        publisher: Option<Publisher>,
    ) -> NodeSync {
        NodeSync {
            client,
            peers_file,
            max_remove_fraction,
            shared,
            notify,
            publisher,
            nodes: BTreeMap::new(),
            skipped: BTreeMap::new(),
            refused: None,
            offline_logged: false,
        }
    }

    /// Runs forever.
    pub fn run(mut self) {
        let mut backoff = Backoff::new();
        loop {
            let listed = match self.client.list_nodes() {
                Ok(l) => l,
                Err(e) => {
                    self.offline(&format!("listing nodes: {e}"));
                    backoff.sleep();
                    continue;
                }
            };
            backoff.reset();
            self.online();
            self.shared.lock().status.last_sync = Some(now_unix());
            self.nodes = listed.nodes;
            self.apply();
            self.publish();
            let mut rv = listed.resource_version;
            loop {
                let started = Instant::now();
                match self.watch(&mut rv) {
                    WatchEnd::Gone => {
                        log(&format!(
                            "resourceVersion {rv} is too old (410 Gone): listing again"
                        ));
                        break;
                    }
                    WatchEnd::Closed if started.elapsed() > Duration::from_secs(1) => {
                        backoff.reset();
                    }
                    WatchEnd::Closed => backoff.sleep(),
                    WatchEnd::Failed(e) => {
                        self.offline(&format!("watching nodes: {e}"));
                        backoff.sleep();
                    }
                }
            }
        }
    }

    fn watch(&mut self, rv: &mut String) -> WatchEnd {
        // Like client-go: ask the server to end the watch after 5 to 10 minutes.
        let timeout = jitter(Duration::from_secs(450), 1.0 / 3.0);
        let mut w = match self
            .client
            .watch_nodes(rv, Duration::from_secs(timeout.as_secs()))
        {
            Ok(w) => w,
            Err(Error::Gone(_)) => return WatchEnd::Gone,
            Err(e) => return WatchEnd::Failed(e.to_string()),
        };
        self.online();
        loop {
            let event = match w.next_event() {
                Ok(Some(e)) => e,
                Ok(None) => return WatchEnd::Closed,
                Err(e) => return WatchEnd::Failed(e.to_string()),
            };
            self.shared.api_answered();
            match event {
                Event::Added(n) | Event::Modified(n) => {
                    rv.clone_from(&n.metadata.resource_version);
                    let own = self
                        .publisher
                        .as_ref()
                        .is_some_and(|p| p.node_name == n.metadata.name);
                    let before = self.nodes.get(&n.metadata.name).map(mapping::node_entry);
                    let after = mapping::node_entry(&n);
                    self.nodes.insert(n.metadata.name.clone(), n);
                    // Most events are status heartbeats: nothing the peers depend on changed.
                    if before.as_ref() != Some(&after) {
                        self.apply();
                    }
                    if own {
                        self.publish();
                    }
                }
                Event::Deleted(n) => {
                    rv.clone_from(&n.metadata.resource_version);
                    if self.nodes.remove(&n.metadata.name).is_some() {
                        log(&format!("node {} was deleted", n.metadata.name));
                        self.apply();
                    }
                }
                Event::Bookmark(v) => *rv = v,
                Event::Error(s) if s.code == 410 => return WatchEnd::Gone,
                Event::Error(s) => {
                    return WatchEnd::Failed(format!(
                        "ERROR event {} {}: {}",
                        s.code, s.reason, s.message
                    ));
                }
            }
        }
    }

    fn online(&mut self) {
        self.shared.api_answered();
        if self.offline_logged {
            log(&format!(
                "the API at {} answers again",
                self.client.endpoint.url
            ));
            self.offline_logged = false;
        }
    }

    fn offline(&mut self, why: &str) {
        let was = std::mem::replace(&mut self.shared.lock().status.api_reachable, false);
        if was || !self.offline_logged {
            log(&format!(
                "{why}; keeping the peers file as it is and retrying"
            ));
            self.offline_logged = true;
        }
    }

    /// Turns the nodes into peers and writes the file if they differ from what it holds.
    fn apply(&mut self) {
        let (new, skipped) = mapping::peers_from(&self.nodes);
        let skipped: BTreeMap<String, String> = skipped.into_iter().collect();
        for (name, why) in &skipped {
            if self.skipped.get(name) != Some(why) {
                log(&format!("node {name} is not a peer: {why}"));
            }
        }
        self.skipped = skipped;
        let old = files::current_peers(&self.peers_file);
        if old.as_deref() == Some(&new[..]) {
            self.set_refused(None);
            return;
        }
        if let Some(old) = &old
            && let Err(refused) = mapping::guard_removals(old, &new, self.max_remove_fraction)
        {
            self.shared.lock().counters.removals_refused += 1;
            self.set_refused(Some(refused.to_string()));
            return;
        }
        if let Err(e) = files::write_atomic(&self.peers_file, &mapping::file_text(&new)) {
            log(&format!("{e}; the plugin keeps using the file as it was"));
            return;
        }
        self.set_refused(None);
        for line in mapping::describe_changes(old.as_deref().unwrap_or_default(), &new) {
            log(&line);
        }
        {
            let mut s = self.shared.lock();
            s.counters.file_writes += 1;
            s.own_write = files::fingerprint(&self.peers_file);
        }
        let _ = self.notify.send(());
    }

    fn set_refused(&mut self, refused: Option<String>) {
        if refused != self.refused
            && let Some(r) = &refused
        {
            log(&format!("REFUSED: {r}"));
        }
        self.refused.clone_from(&refused);
        self.shared.lock().status.refused = refused;
    }

    fn publish(&mut self) {
        let Some(p) = &self.publisher else { return };
        let Some(own) = self.nodes.get(&p.node_name) else {
            log(&format!(
                "cannot publish flannel annotations: no Node named {:?}",
                p.node_name
            ));
            return;
        };
        match p.publish(&self.client, own) {
            Ok(false) => {}
            Ok(true) => log(&format!(
                "published flannel annotations on Node {}",
                p.node_name
            )),
            Err(e) => log(&format!("publishing flannel annotations: {e}")),
        }
    }
}
