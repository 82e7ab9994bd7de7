//! The reflector's [`Sink`]: keeps the nodes seen, and writes the peers file when the peers
//! they stand for change.
//!
//! Offline is normal: an error, a refused connection or a list cut half-way changes nothing
//! on disk (the [`reflector`](super::reflector) backs off and tries again). Only a complete
//! list (and the watch that follows it) may remove a peer, and never more than
//! `--max-remove-fraction` of them at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::Sender;

use super::files;
use super::kube::Kube;
use super::mapping;
use super::objects::Node;
use super::publish::Publisher;
use super::reflector::{Sink, SyncState};
use super::state::Shared;

/// The reflector's nodes, turned into the peers file.
pub struct NodeSync {
    pub peers_file: PathBuf,
    pub max_remove_fraction: f64,
    pub shared: Shared,
    pub notify: Sender<()>,
    /// `--publish-flannel-annotations`: the publisher and its own connection to the API.
    pub publisher: Option<(Publisher, Kube)>,
    nodes: BTreeMap<String, Node>,
    skipped: BTreeMap<String, String>,
    refused: Option<String>,
    reachable: Option<bool>,
}

fn log(msg: &str) {
    eprintln!("sticky-vxlan-agent: {msg}");
}

impl Sink for NodeSync {
    fn replace(&mut self, nodes: Vec<Node>) {
        self.nodes = nodes
            .into_iter()
            .map(|n| (n.metadata.name.clone(), n))
            .collect();
        self.apply();
        self.publish();
    }

    fn upsert(&mut self, n: Node) {
        let own = self
            .publisher
            .as_ref()
            .is_some_and(|(p, _)| p.node_name == n.metadata.name);
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

    fn delete(&mut self, name: &str) {
        if self.nodes.remove(name).is_some() {
            log(&format!("node {name} was deleted"));
            self.apply();
        }
    }

    fn state(&mut self, state: &SyncState) {
        if self.reachable != Some(state.api_reachable) || state.last_error.is_some() {
            match (&state.last_error, state.api_reachable) {
                (Some(e), _) => log(&format!(
                    "{e}; keeping the peers file as it is and retrying"
                )),
                (None, true) if self.reachable == Some(false) => log("the API answers again"),
                _ => {}
            }
        }
        self.reachable = Some(state.api_reachable);
        let mut s = self.shared.lock();
        s.status.api_reachable = state.api_reachable;
        s.status.last_sync = state.last_list;
        s.status.stale_since = state.stale_since;
        s.status.last_error.clone_from(&state.last_error);
        if state.api_reachable {
            s.status.last_api_answer = Some(super::state::now_unix());
        }
        s.counters.lists = state.lists;
        s.counters.list_failures = state.list_failures;
        s.counters.watch_failures = state.watch_failures;
    }
}

impl NodeSync {
    pub fn new(
        peers_file: PathBuf,
        max_remove_fraction: f64,
        shared: Shared,
        notify: Sender<()>,
        publisher: Option<(Publisher, Kube)>,
    ) -> NodeSync {
        NodeSync {
            peers_file,
            max_remove_fraction,
            shared,
            notify,
            publisher,
            nodes: BTreeMap::new(),
            skipped: BTreeMap::new(),
            refused: None,
            reachable: None,
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
        let Some((p, kube)) = &mut self.publisher else {
            return;
        };
        let Some(own) = self.nodes.get(&p.node_name) else {
            log(&format!(
                "cannot publish flannel annotations: no Node named {:?}",
                p.node_name
            ));
            return;
        };
        match p.publish(kube, own) {
            Ok(false) => {}
            Ok(true) => log(&format!(
                "published flannel annotations on Node {}",
                p.node_name
            )),
            Err(e) => log(&format!("publishing flannel annotations: {e}")),
        }
    }
}
