//! `sticky-vxlan reconcile --config <file>` for a segment network: its bridge, VXLAN device
//! and flood entries brought to what the peers say, without a pod (at boot, before kubelet
//! starts pods, or after the peers file changed). The mode is chosen by
//! [`crate::vxlan::cli`], which loads the file once.

use serde_json::Value;

use super::config::Config;
use super::{Error, datapath, node};
use crate::netlink::Socket;
use crate::vxlan::kernel::Live;

/// Brings the segment network `name` (its config entry `entry`) to what the peers say and
/// says what it did. `sticky-vxlan reconcile` calls it for a file whose entry has
/// `"mode": "segment"`.
pub fn network(name: &str, entry: &Value) -> Result<String, Error> {
    let cfg = Config::from_json(name, entry)?;
    let mut sock = Socket::open()?;
    let node = node::resolve(&mut Live { sock: &mut sock }, &cfg)?;
    let bridge = datapath::ensure(&mut Live { sock: &mut sock }, &cfg, &node)?;
    Ok(format!(
        "segment {} vni {} port {}: {} and {} up, flood to {} node(s)\n",
        cfg.name,
        cfg.vni,
        cfg.port,
        bridge.name,
        cfg.vxlan(),
        node.remote.len()
    ))
}
