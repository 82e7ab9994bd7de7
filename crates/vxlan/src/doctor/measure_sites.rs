//! Measuring the sites (docs/sites.md) from this node, without linking the sites crates: the
//! agent's status file (`<stateDir>/<network>.agent.json`: role, each remote site's path and,
//! on the active gateway, the carrying tunnel), the agent's sites cache
//! (`<stateDir>/<network>.sites.json`, read loosely: each gateway's pod subnet, to probe it, and
//! the NAT mappings the reachable gateways observed), and echoes through the tunnel to each
//! remote site's active gateway. What cannot be read is said in `unchecked`, never passed.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use sticky_overlay::config::Config;
use sticky_overlay::sites::{Sites, tunnel_overhead};

use super::super::decide::sites::{Mapped, RemoteFacts, SitesFacts, TunnelFacts, WanProbe};
use super::super::probe::{Probe, Prober};
use super::{Error, LADDER_STEP, LADDER_STEPS, SMALL};
use crate::status::{SitesStatus, Status, now_unix, status_path};

/// The largest status file or sites cache read (the cache holds every Node of the cluster).
const MAX_FILE: u64 = 256 * 1024 * 1024;
/// The annotation in which a reachable gateway publishes where gateways behind NAT come from.
const OBSERVED: &str = "sticky-cni.io/observed-endpoints";

/// What the sites cache tells doctor.
#[derive(Debug, Default)]
struct Cache {
    /// Node name → the first address of its first IPv4 pod subnet (its VTEP's address).
    vtep: BTreeMap<String, Ipv4Addr>,
    /// Underlay address → Node name.
    by_underlay: BTreeMap<IpAddr, String>,
    /// Gateway name → its NAT mapping, as a reachable gateway saw it.
    observed: BTreeMap<String, SocketAddr>,
}

/// The sites facts of network `cfg` seen from this node (`local_ip`, its VTEP at `vtep`, which
/// `prober` sends from); `None`, with why in `unchecked`, when the agent's status cannot be
/// read.
pub fn measure(
    cfg: &Config,
    sites: &Sites,
    local_ip: IpAddr,
    vtep: Option<Ipv4Addr>,
    prober: &mut impl Prober,
    config_path: &str,
    unchecked: &mut Vec<String>,
) -> Result<Option<SitesFacts>, Error> {
    let status = match read_status(cfg) {
        Ok(s) => s,
        Err(why) => {
            unchecked.push(format!("sites: {why}"));
            return Ok(None);
        }
    };
    let cache_path = cfg.state_dir.join(format!("{}.sites.json", cfg.name));
    let cache = read_cache(&cache_path).unwrap_or_else(|why| {
        unchecked.push(format!("sites cache: {why}"));
        Cache::default()
    });
    let overhead = tunnel_overhead(local_ip);
    let mut facts = SitesFacts {
        site: status.site.clone(),
        role: status.role.clone(),
        gateway: status.role.starts_with("active gateway"),
        interface: sites.interface.clone(),
        listen_port: sites.listen_port,
        wan_mtu: sites.wan_mtu,
        overhead,
        config: config_path.to_string(),
        remotes: remotes(&status, &cache, local_ip),
    };
    match vtep {
        Some(_) => probe(prober, &mut facts, &cache)?,
        None => unchecked.push("sites: this node has no IPv4 pod subnet to probe from".into()),
    }
    Ok(Some(facts))
}

/// The status's sites part, from a running agent.
fn read_status(cfg: &Config) -> Result<SitesStatus, String> {
    let path = status_path(&cfg.state_dir, &cfg.name);
    let shown = path.display();
    let bytes = match sticky_primitives::nofollow::read_bounded(&path, MAX_FILE) {
        Ok(Some(b)) => b,
        Ok(None) => {
            return Err(format!(
                "no agent status at {shown}: is sticky-vxlan-agent running for this network?"
            ));
        }
        Err(e) => return Err(format!("reading {shown}: {e}")),
    };
    let status: Status =
        serde_json::from_slice(&bytes).map_err(|e| format!("reading {shown}: {e}"))?;
    if !Path::new(&format!("/proc/{}", status.pid)).exists() {
        return Err(format!(
            "the agent (pid {}) that wrote {shown} is not running: its status is stale",
            status.pid
        ));
    }
    status.sites.map(Arc::unwrap_or_clone).ok_or_else(|| {
        format!("{shown} has no sites part (the agent has not placed this node yet)")
    })
}

/// The sites cache at `path`, read as plain JSON (its owner is the agent: docs/sites.md,
/// "Offline").
fn read_cache(path: &Path) -> Result<Cache, String> {
    let shown = path.display();
    let bytes = sticky_primitives::nofollow::read_bounded(path, MAX_FILE)
        .map_err(|e| format!("reading {shown}: {e}"))?
        .ok_or_else(|| format!("no {shown} yet"))?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| format!("reading {shown}: {e}"))?;
    let mut cache = Cache::default();
    for node in v["nodes"].as_array().into_iter().flatten() {
        let Some(name) = node["name"].as_str() else {
            continue;
        };
        let first_v4 = node["pod_cidrs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str()?.parse::<ipnet::IpNet>().ok())
            .find_map(|n| match n {
                ipnet::IpNet::V4(n) => Some(n.network()),
                ipnet::IpNet::V6(_) => None,
            });
        if let Some(a) = first_v4 {
            cache.vtep.insert(name.to_string(), a);
        }
        if let Some(u) = node["underlay"].as_str().and_then(|u| u.parse().ok()) {
            cache.by_underlay.insert(u, name.to_string());
        }
        let observed = node["annotations"][OBSERVED].as_str().unwrap_or_default();
        if let Ok(Value::Object(seen)) = serde_json::from_str::<Value>(observed) {
            for (gw, at) in seen {
                if let Some(at) = at.as_str().and_then(|a| a.parse().ok()) {
                    cache.observed.entry(gw).or_insert(at);
                }
            }
        }
    }
    Ok(cache)
}

/// The remote sites with their tunnel and the NAT mappings of the pair's gateways.
fn remotes(status: &SitesStatus, cache: &Cache, local_ip: IpAddr) -> Vec<RemoteFacts> {
    let own = if status.role.starts_with("active gateway") {
        cache.by_underlay.get(&local_ip).cloned()
    } else {
        status
            .role
            .split("through gateway ")
            .nth(1)
            .and_then(|r| r.split([' ', ';', ',']).next())
            .map(str::to_string)
    };
    let now = now_unix();
    status
        .remotes
        .iter()
        .map(|r| {
            let nat = [own.as_deref(), r.gateway.as_deref()]
                .into_iter()
                .flatten()
                .filter_map(|g| {
                    let seen = *cache.observed.get(g)?;
                    Some(Mapped {
                        gateway: g.to_string(),
                        seen,
                    })
                })
                .collect();
            RemoteFacts {
                site: r.site.clone(),
                gateway: r.gateway.clone(),
                path: r.path.clone(),
                tunnel: r.tunnel.as_ref().map(|t| TunnelFacts {
                    peer: t.peer.clone(),
                    up: t.up,
                    handshake_age: t.last_handshake.map(|h| now.saturating_sub(h)),
                }),
                probe: None,
                nat,
            }
        })
        .collect()
}

/// Echoes to each reachable remote site's gateway: small, the full inner size, and the ladder
/// below it.
fn probe(prober: &mut impl Prober, facts: &mut SitesFacts, cache: &Cache) -> Result<(), Error> {
    let full = sticky_overlay::sites::tunnel_mtu(facts.wan_mtu, facts.overhead);
    let ladder: Vec<u32> = (1..=LADDER_STEPS)
        .filter_map(|i| full.checked_sub(i * LADDER_STEP))
        .filter(|s| *s > u32::from(SMALL))
        .collect();
    let size = |s: u32| u16::try_from(s).unwrap_or(u16::MAX);
    let mut probes = Vec::new();
    let mut planned = Vec::new();
    for (i, r) in facts.remotes.iter().enumerate() {
        let target = r.gateway.as_ref().and_then(|g| cache.vtep.get(g));
        let (Some(&dst), false) = (target, r.path.starts_with("unreachable")) else {
            continue;
        };
        planned.push((i, dst, probes.len()));
        probes.push(Probe {
            dst: dst.into(),
            size: SMALL,
        });
        probes.extend(
            std::iter::once(full)
                .chain(ladder.iter().copied())
                .map(|s| Probe {
                    dst: dst.into(),
                    size: size(s),
                }),
        );
    }
    if probes.is_empty() {
        return Ok(());
    }
    let answered = prober.run(&probes)?;
    let got = |k: usize| answered.get(k).copied().unwrap_or(false);
    for (i, target, first) in planned {
        let full_ok = got(first + 1);
        let largest = (!full_ok)
            .then(|| {
                ladder
                    .iter()
                    .enumerate()
                    .find(|(j, _)| got(first + 2 + j))
                    .map(|(_, s)| *s)
            })
            .flatten();
        facts.remotes[i].probe = Some(WanProbe {
            target,
            small: got(first),
            full: full_ok,
            largest,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::RemoteSite;
    use serde_json::json;

    /// The cache as the agent writes it: each Node's pod subnets, underlay and annotations; the
    /// cloud gateway's observations of the gateways behind NAT.
    #[test]
    fn the_cache_gives_each_gateways_address_and_the_pairs_nat_mappings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("net.sites.json");
        let observed = json!({"a1": "203.0.113.10:51820", "b1": "203.0.113.20:40123"});
        let cache = json!({"version": 1, "current": {}, "nodes": [
            {"name": "a1", "pod_cidrs": ["fd00::/64", "198.18.11.0/24"], "underlay": "192.0.2.1"},
            {"name": "b1", "pod_cidrs": ["198.18.21.0/24"], "underlay": "192.0.2.129"},
            {"name": "c1", "pod_cidrs": ["198.18.1.0/24"], "underlay": "198.51.100.1",
             "annotations": {OBSERVED: observed.to_string()}},
        ]});
        std::fs::write(&path, cache.to_string()).unwrap();
        let cache = read_cache(&path).unwrap();
        assert_eq!(
            cache.vtep["a1"],
            Ipv4Addr::new(198, 18, 11, 0),
            "the first IPv4 subnet"
        );
        assert_eq!(cache.vtep["b1"], Ipv4Addr::new(198, 18, 21, 0));
        let status = SitesStatus {
            site: "site-a".into(),
            role: "active gateway".into(),
            remotes: ["b1", "c1"]
                .iter()
                .map(|g| RemoteSite {
                    site: format!("site-of-{g}"),
                    gateway: Some(g.to_string()),
                    path: "relayed via cloud (punch paused: next try in 60 s)".into(),
                    tunnel: None,
                })
                .collect(),
            ..SitesStatus::default()
        };
        let remotes = remotes(&status, &cache, "192.0.2.1".parse().unwrap());
        let seen: Vec<(&str, u16)> = remotes[0]
            .nat
            .iter()
            .map(|m| (m.gateway.as_str(), m.seen.port()))
            .collect();
        assert_eq!(
            seen,
            [("a1", 51820), ("b1", 40123)],
            "this gateway's and b1's"
        );
        assert_eq!(
            remotes[1].nat.len(),
            1,
            "c1 has an endpoint: only a1's mapping"
        );
        assert!(read_cache(&dir.path().join("none.json")).is_err());
    }
}
