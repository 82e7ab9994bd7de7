//! Peers without a control plane: from the network config and/or a peers file, merged by union.
//!
//! One cluster-wide list can be installed identically on every node: the entry whose `ip` is
//! one of this node's addresses is the node itself and names its local subnet(s); every other
//! entry is a remote VTEP.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::mac::vtep_mac;
use crate::netlink::link::{format_mac, parse_mac};

/// One entry as written in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeerEntry {
    pub ip: IpAddr,
    pub subnets: Vec<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// A checked peer: underlay IPv4, pod subnets (one IPv4, optionally one IPv6) and an explicit
/// VTEP MAC for nodes that do not use the kept-MAC scheme (e.g. flannel nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub ip: Ipv4Addr,
    pub subnets: Vec<IpNet>,
    pub mac: Option<[u8; 6]>,
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("peers file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "peers file {path} is owned by uid {uid} with mode {mode:o}: it must be owned by root and not writable by group or others (anyone who can write it can redirect pod traffic)"
    )]
    Unsafe { path: PathBuf, uid: u32, mode: u32 },
    #[error("peers file {path} is not a valid peer list: {reason}")]
    Parse { path: PathBuf, reason: String },
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Checks entries one by one; `source` names where they came from in errors.
pub fn check_entries(entries: &[PeerEntry], source: &str) -> Result<Vec<Peer>, String> {
    let mut peers = Vec::new();
    for e in entries {
        let ip = match e.ip {
            IpAddr::V4(a) if !a.is_unspecified() && !a.is_multicast() && !a.is_broadcast() => a,
            IpAddr::V4(a) => return Err(format!("{source}: peer ip {a} is not a unicast address")),
            IpAddr::V6(a) => {
                return Err(format!(
                    "{source}: peer ip {a} is IPv6: an IPv6 underlay is not supported yet (IPv6 pod subnets over an IPv4 underlay are)"
                ));
            }
        };
        let v4 = e.subnets.iter().filter(|s| s.addr().is_ipv4()).count();
        let v6 = e.subnets.len() - v4;
        if v4 != 1 || v6 > 1 {
            return Err(format!(
                "{source}: peer {ip} has subnets {:?}: expected one IPv4 subnet and at most one IPv6 subnet",
                e.subnets
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
            ));
        }
        for s in &e.subnets {
            if s.trunc() != *s {
                return Err(format!(
                    "{source}: peer {ip} subnet {s} has host bits set (did you mean {}?)",
                    s.trunc()
                ));
            }
            if s.prefix_len() >= s.max_prefix_len() - 1 {
                return Err(format!(
                    "{source}: peer {ip} subnet {s} is too small for pods"
                ));
            }
        }
        let mac = match &e.mac {
            None => None,
            Some(text) => match parse_mac(text) {
                Some(m) if m[0] & 1 == 0 && m != [0; 6] => Some(m),
                _ => {
                    return Err(format!(
                        "{source}: peer {ip} mac {text:?} is not a unicast MAC like 0a:01:c0:00:02:01"
                    ));
                }
            },
        };
        peers.push(Peer {
            ip,
            subnets: e.subnets.clone(),
            mac,
        });
    }
    merge(&[], &peers)
}

/// Union of two peer lists. The same peer may appear in both; the same `ip` with different
/// subnets or MAC, or two peers whose subnets overlap, is an error.
pub fn merge(a: &[Peer], b: &[Peer]) -> Result<Vec<Peer>, String> {
    let mut by_ip: BTreeMap<Ipv4Addr, Peer> = BTreeMap::new();
    for p in a.iter().chain(b) {
        match by_ip.get(&p.ip) {
            Some(existing) if existing == p => {}
            Some(existing) => {
                return Err(format!(
                    "peer {} is listed twice with different settings ({:?} and {:?})",
                    p.ip, existing, p
                ));
            }
            None => {
                by_ip.insert(p.ip, p.clone());
            }
        }
    }
    let all: Vec<Peer> = by_ip.into_values().collect();
    // A pod subnet is routed through the VTEP: one holding an underlay address would take the
    // underlay's own traffic (VXLAN included) with it and cut the node off.
    for p in &all {
        for s in &p.subnets {
            if let Some(q) = all.iter().find(|q| s.contains(&IpAddr::V4(q.ip))) {
                return Err(format!(
                    "peer {} subnet {s} holds the underlay address of peer {}: a pod subnet must not overlap the underlay",
                    p.ip, q.ip
                ));
            }
        }
    }
    for (i, p) in all.iter().enumerate() {
        for q in &all[i + 1..] {
            for s in &p.subnets {
                if let Some(t) = q.subnets.iter().find(|t| overlaps(s, t)) {
                    return Err(format!(
                        "peer {} subnet {s} overlaps peer {} subnet {t}",
                        p.ip, q.ip
                    ));
                }
            }
        }
    }
    Ok(all)
}

/// Reads a peers file: a JSON list of entries, or `{"peers": [...]}`. The file must be owned
/// by root and not writable by group or others.
pub fn load_file(path: &Path) -> Result<Vec<Peer>, FileError> {
    read_checked(path).map(|(peers, _)| peers)
}

/// The file's peers and the exact bytes they were parsed from. The ownership and mode are
/// checked on the open file itself, so the bytes are those of the file that was checked even
/// if the path is replaced meanwhile.
fn read_checked(path: &Path) -> Result<(Vec<Peer>, Vec<u8>), FileError> {
    let read = |source| FileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read)?;
    let meta = file.metadata().map_err(read)?;
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(FileError::Unsafe {
            path: path.to_path_buf(),
            uid: meta.uid(),
            mode: meta.mode() & 0o7777,
        });
    }
    let mut text = Vec::new();
    file.read_to_end(&mut text).map_err(read)?;
    let peers = parse_file(&text).map_err(|reason| FileError::Parse {
        path: path.to_path_buf(),
        reason,
    })?;
    Ok((peers, text))
}

pub fn parse_file(text: &[u8]) -> Result<Vec<Peer>, String> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Doc {
        List(Vec<PeerEntry>),
        Wrapped { peers: Vec<PeerEntry> },
    }
    let doc: Doc = serde_json::from_slice(text).map_err(|e| {
        format!(
            "{e} (expected a list of {{\"ip\", \"subnets\", \"mac\"?}} or {{\"peers\": [...]}})"
        )
    })?;
    let entries = match doc {
        Doc::List(l) => l,
        Doc::Wrapped { peers } => peers,
    };
    check_entries(&entries, "peers file")
}

/// Keeps `text`, a peers file that just parsed, as the last good copy (temp file + rename,
/// so the copy is always whole; the temp name is per process, as DEL, CHECK and STATUS keep it
/// without the peer lock). The temp file is created new (`O_EXCL`), so whatever was left at its
/// name, a symlink included, is never written through. Best effort: failing to keep it only
/// weakens the fallback, so it is logged.
fn save_last_good(copy: &Path, text: &[u8]) {
    if std::fs::read(copy).is_ok_and(|old| old == text) {
        return;
    }
    let tmp = copy.with_extension(format!("json.{}.tmp", std::process::id()));
    let write_new = || {
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::File::options()
            .write(true)
            .create_new(true)
            .open(&tmp)?
            .write_all(text)
    };
    let saved = copy
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| write_new())
        .and_then(|()| std::fs::rename(&tmp, copy));
    if let Err(e) = saved {
        let _ = std::fs::remove_file(&tmp);
        eprintln!(
            "sticky-vxlan: keeping a copy of the peers file in {}: {e}",
            copy.display()
        );
    }
}

/// Reads the peers file and, when it is usable, keeps exactly what was read as the last good
/// copy.
pub fn load_and_keep(path: &Path, copy: &Path) -> Result<Vec<Peer>, FileError> {
    let (peers, text) = read_checked(path)?;
    save_last_good(copy, &text);
    Ok(peers)
}

/// The last valid peers list, or none.
pub fn load_last_good(copy: &Path) -> Vec<Peer> {
    std::fs::read(copy)
        .ok()
        .and_then(|text| parse_file(&text).ok())
        .unwrap_or_default()
}

/// Every remote peer needs a VTEP MAC of its own (its kept MAC or its explicit `mac`), and none
/// may be this node's (`local`'s kept MAC): the FDB maps a MAC to every node listed behind it,
/// so two peers sharing one would each be sent the other's traffic.
pub fn check_macs(vni: u32, local: Ipv4Addr, remote: &[Peer]) -> Result<(), String> {
    let mut seen: BTreeMap<[u8; 6], Ipv4Addr> = BTreeMap::new();
    seen.insert(vtep_mac(local, vni), local);
    for p in remote {
        let mac = p.mac.unwrap_or_else(|| vtep_mac(p.ip, vni));
        if let Some(other) = seen.insert(mac, p.ip) {
            let whose = if other == local {
                "this node's own VTEP MAC".to_string()
            } else {
                format!("also the VTEP MAC of peer {other}")
            };
            return Err(format!(
                "peer {} has VTEP MAC {}, which is {whose}: every node needs its own (check the peers' \"mac\")",
                p.ip,
                format_mac(&mac)
            ));
        }
    }
    Ok(())
}

/// Splits peers into this node (the entry whose ip is one of `local_addrs`) and the others.
pub fn split_local(peers: &[Peer], local_addrs: &[IpAddr]) -> (Option<Peer>, Vec<Peer>) {
    let mut local = None;
    let mut remote = Vec::new();
    for p in peers {
        if local.is_none() && local_addrs.contains(&IpAddr::V4(p.ip)) {
            local = Some(p.clone());
        } else {
            remote.push(p.clone());
        }
    }
    (local, remote)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(ip: &str, subnets: &[&str]) -> Peer {
        Peer {
            ip: ip.parse().unwrap(),
            subnets: subnets.iter().map(|s| s.parse().unwrap()).collect(),
            mac: None,
        }
    }

    #[test]
    fn union_dedupes_and_refuses_overlap_and_conflicts() {
        let a = vec![peer("192.0.2.1", &["10.244.1.0/24"])];
        let b = vec![
            peer("192.0.2.1", &["10.244.1.0/24"]),
            peer("192.0.2.2", &["10.244.2.0/24", "fd00:2::/64"]),
        ];
        assert_eq!(merge(&a, &b).unwrap().len(), 2);
        let overlap = vec![peer("192.0.2.3", &["10.244.0.0/16"])];
        assert!(merge(&a, &overlap).unwrap_err().contains("overlaps"));
        let conflict = vec![peer("192.0.2.1", &["10.244.9.0/24"])];
        assert!(merge(&a, &conflict).unwrap_err().contains("twice"));
        let underlay = vec![peer("192.0.2.2", &["192.0.2.0/24"])];
        assert!(
            merge(&a, &underlay)
                .unwrap_err()
                .contains("holds the underlay address of peer 192.0.2.1")
        );
    }

    #[test]
    fn file_forms_and_errors() {
        let list = br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]}]"#;
        let wrapped = br#"{"peers":[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"],"mac":"0a:01:c0:00:02:01"}]}"#;
        assert_eq!(parse_file(list).unwrap().len(), 1);
        assert_eq!(
            parse_file(wrapped).unwrap()[0].mac,
            Some([10, 1, 192, 0, 2, 1])
        );
        for bad in [
            &br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]"#[..],
            br#"[{"ip":"192.0.2.1","subnets":[]}]"#,
            br#"[{"ip":"192.0.2.1","subnets":["10.244.1.1/24"]}]"#,
            br#"[{"ip":"2001:db8::1","subnets":["10.244.1.0/24"]}]"#,
            br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"],"mac":"01:00:00:00:00:01"}]"#,
            br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"],"extra":1}]"#,
            br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24","10.244.2.0/24"]}]"#,
        ] {
            assert!(parse_file(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn every_peer_has_a_vtep_mac_of_its_own() {
        let local: Ipv4Addr = "192.0.2.1".parse().unwrap();
        let flannel = |ip: &str, mac: [u8; 6]| Peer {
            mac: Some(mac),
            ..peer(ip, &["10.244.9.0/24"])
        };
        let two = peer("192.0.2.2", &["10.244.2.0/24"]);
        assert!(check_macs(1, local, std::slice::from_ref(&two)).is_ok());
        let m = [0x6e, 0x3c, 0x8a, 0x11, 0x22, 0x33];
        let err = check_macs(
            1,
            local,
            &[flannel("192.0.2.4", m), flannel("192.0.2.5", m)],
        );
        assert!(err.unwrap_err().contains("6e:3c:8a:11:22:33"));
        let err = check_macs(
            1,
            local,
            &[two.clone(), flannel("192.0.2.5", vtep_mac(two.ip, 1))],
        );
        assert!(err.unwrap_err().contains("peer 192.0.2.2"));
        let err = check_macs(1, local, &[flannel("192.0.2.5", vtep_mac(local, 1))]);
        assert!(err.unwrap_err().contains("own"));
    }

    #[test]
    fn the_local_entry_names_this_node() {
        let all = vec![
            peer("192.0.2.1", &["10.244.1.0/24"]),
            peer("192.0.2.2", &["10.244.2.0/24"]),
        ];
        let (local, remote) = split_local(&all, &["192.0.2.2".parse().unwrap()]);
        assert_eq!(local.unwrap().ip, Ipv4Addr::new(192, 0, 2, 2));
        assert_eq!(remote.len(), 1);
    }

    #[test]
    fn the_kept_copy_is_the_file_that_was_checked_even_while_it_is_being_replaced() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipping: the peers file must be owned by root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers.json");
        let copy = dir.path().join("state").join("net.peers.json");
        let good = br#"[{"ip":"192.0.2.1","subnets":["10.244.1.0/24"]}]"#;
        let broken = br#"[{"ip":"192.0.2.1","subnets":["10.2"#;
        let write = |name: &str, text: &[u8], mode: u32| {
            let tmp = dir.path().join(name);
            std::fs::write(&tmp, text).unwrap();
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        };
        write("first", good, 0o644);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            // Someone keeps replacing the file: with a valid one, a half-written one, and a
            // valid-looking one anyone could have written.
            scope.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    write("a", good, 0o644);
                    write("b", broken, 0o644);
                    write("c", br#"[]"#, 0o666);
                }
            });
            let mut bad = None;
            for _ in 0..3000 {
                if load_and_keep(&path, &copy).is_ok() {
                    let kept = std::fs::read(&copy).unwrap_or_default();
                    if kept != good {
                        bad = Some(String::from_utf8_lossy(&kept).into_owned());
                        break;
                    }
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            bad
        })
        .map_or(Ok(()), |kept| {
            Err(format!("kept a copy that was not checked: {kept}"))
        })
        .unwrap();
    }

    #[test]
    fn keeping_the_copy_never_writes_through_a_planted_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("net.peers.json");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let tmp = copy.with_extension(format!("json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        save_last_good(&copy, b"[]");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read(&copy).unwrap(), b"[]");
    }

    #[test]
    fn unsafe_files_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), br#"[]"#).unwrap();
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(load_file(f.path()), Err(FileError::Unsafe { .. })));
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        let owned_by_root = std::fs::metadata(f.path()).unwrap().uid() == 0;
        assert_eq!(load_file(f.path()).is_ok(), owned_by_root);
    }
}
