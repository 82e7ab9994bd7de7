//! The one place the agent programs the node.

use crate::netlink::Socket;
use crate::vxlan::config::Config;
use crate::vxlan::{Error, datapath};

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
    let mut sock = Socket::open()?;
    let (node, _vtep, _bridge) = datapath::ensure_node(&mut sock, cfg)?;
    Ok(Reconciled {
        remote_peers: node.remote.len(),
        peers_file_error: node.peers_file_error,
    })
}
