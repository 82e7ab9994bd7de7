//! The range sets sticky-vxlan fills into an `ipam` section that names none (the cluster
//! conflist the DaemonSet installs): one per subnet of this node's own peer entry, found as
//! the plugin finds it (`localIp` if set, else the entry whose `ip` is an address of this
//! host), from the config's peers and the peers file (with the same ownership checks; the
//! last good copy when the file is unusable). Worked out without writing anything: the
//! plugin's resolution also keeps the last good copy, which an operator's look must not do.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde_json::Value;

use sticky_netlink::{Socket, addr};
use sticky_overlay::{config, peers};

#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeRangesError {
    #[error("the sticky-vxlan entry: {0}")]
    Config(#[from] config::Error),
    #[error("invalid peer list: {0}")]
    Peers(#[from] peers::Error),
    #[error("listing this host's addresses: {0}")]
    Addresses(String),
    #[error(
        "no peer entry names this node (none of the peers' ips is {which}): the ranges of this node cannot be known"
    )]
    NoLocalEntry { which: String },
    #[error("peers file {path}: {reason}; and no last good copy to fall back on")]
    PeersFile { path: PathBuf, reason: String },
}

/// `entry` (a sticky-vxlan plugin entry, name injected) with `ipam.ranges` filled in as the
/// plugin would, when its ipam section is host-local's schema without any range. `None`
/// when nothing needs filling in.
pub fn fill(entry: &Value, name: &str) -> Result<Option<Value>, NodeRangesError> {
    let cfg = config::Config::from_json(name, entry)?;
    if !cfg.ranges_from_peers {
        return Ok(None);
    }
    let from_file = match &cfg.peers_file {
        None => Vec::new(),
        Some(path) => match peers::read_file(path) {
            Ok((list, _)) => list,
            Err(e) => {
                let last = peers::last_good(&cfg.last_good_peers_path());
                if last.is_empty() {
                    return Err(NodeRangesError::PeersFile {
                        path: path.clone(),
                        reason: e.to_string(),
                    });
                }
                eprintln!("warning: {e}; using the last good copy, as the plugin does");
                last
            }
        },
    };
    let all = peers::merge(&cfg.peers, &from_file)?;
    let (local_addrs, which) = match cfg.local_ip {
        Some(ip) => (vec![ip], ip.to_string()),
        None => {
            let addrs = Socket::open()
                .map_err(|e| NodeRangesError::Addresses(e.to_string()))
                .and_then(|mut s| {
                    addr::list_all(&mut s).map_err(|e| NodeRangesError::Addresses(e.to_string()))
                })?;
            let ips: Vec<IpAddr> = addrs.iter().map(|(_, n)| n.addr()).collect();
            (ips, "an address of this host".to_string())
        }
    };
    let (local, _) = peers::split_local(&all, &local_addrs)?;
    let local = local.ok_or(NodeRangesError::NoLocalEntry { which })?;
    let mut filled = entry.clone();
    filled["ipam"]["ranges"] = Value::Array(
        local
            .subnets
            .iter()
            .map(|net: &IpNet| serde_json::json!([{ "subnet": net.trunc().to_string() }]))
            .collect(),
    );
    Ok(Some(filled))
}
