//! The one place the agent programs the node.

use crate::vxlan::Error;
use crate::vxlan::config::Config;

/// What one reconcile found, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    pub remote_peers: usize,
    /// Why the peers file could not be used (programmed peers were then left as they are).
    pub peers_file_error: Option<String>,
}

/// Reconciles this node exactly as `sticky-vxlan reconcile` does (VTEP, bridge, peers, under
/// the network's lock, the same lock the plugin's ADD takes).
pub fn reconcile_node(cfg: &Config) -> Result<Reconciled, Error> {
    let report = crate::vxlan::reconcile::node(cfg)?;
    Ok(Reconciled {
        remote_peers: report.node.remote.len(),
        peers_file_error: report.node.peers_file_error,
    })
}
