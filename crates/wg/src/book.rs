//! What sticky-wg knows of the device beside gotatun, and how a checked `set` becomes the one
//! gotatun gets. Pure: each request is planned against the book, sent, and the book moves on
//! only when gotatun said errno=0.
//!
//! Why a book at all: gotatun builds a peer's noise state from the device's private key when
//! the peer is added, and has no peer without one: `set=1` with a peer before any
//! `private_key=` panics inside gotatun ("Private key must be set first", issue 36), which
//! killed its configuration task and left the daemon deaf. wireguard-go and the kernel take a
//! peer before the key (a fresh daemon, a node that is not a gateway, a restart before the
//! agent's round all see that order). So while the device has no key, sticky-wg keeps the
//! peers itself, as plain configuration, shows them in `get`, and hands them all to gotatun in
//! the request that brings the key (gotatun applies the key before the peers of one request).
//! Once keyed, requests go through as they are; the book keeps only the set of peer keys, to
//! bound the peer count before gotatun is asked. The one exception is a new key, port or
//! fwmark, which a running gotatun device cannot take: [`replay`] turns the running
//! configuration and the request into the first request of a fresh device, with the same rules
//! as peers held before a key.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;

use crate::uapi::{AllowedIp, Key, MAX_PEERS, PeerChange, Set};

/// A peer known only to sticky-wg (the device has no key yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingPeer {
    pub preshared_key: Option<Key>,
    pub endpoint: Option<SocketAddr>,
    pub persistent_keepalive: Option<u16>,
    pub allowed_ips: Vec<AllowedIp>,
}

/// The device as sticky-wg knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Book {
    /// No private key yet: gotatun holds no peer; these are the peers, in key order.
    Keyless { peers: BTreeMap<Key, PendingPeer> },
    /// gotatun has a key and holds the peers; these are their public keys.
    Keyed { peers: HashSet<Key> },
}

impl Default for Book {
    fn default() -> Book {
        Book::Keyless {
            peers: BTreeMap::new(),
        }
    }
}

/// A request the book cannot take (nothing is sent, nothing changes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the device would hold {peers} peers, more than {MAX_PEERS}")]
    TooManyPeers { peers: usize },
    /// Not an answer: the request is done on a fresh device ([`replay`]).
    #[error(
        "{what} changes while the tunnel is up (gotatun 0.10.2 cannot rebind a running device)"
    )]
    Running { what: &'static str },
}

impl Error {
    /// The `errno=` of the answer.
    pub fn errno(&self) -> i32 {
        match self {
            Error::TooManyPeers { .. } => crate::uapi::errno::ENOSPC,
            // Never an answer: the request is done on a fresh device instead.
            Error::Running { .. } => crate::uapi::errno::EIO,
        }
    }
}

/// The device settings of a keyed device, as gotatun reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Running {
    pub private_key: Option<Key>,
    pub listen_port: u16,
    pub fwmark: u32,
}

/// On a keyed device (its tunnel up), drops the device settings `set` gives their current value
/// (the agent sends key and port every time), and says which one changes: in gotatun 0.10.2 a
/// change rebinds the running device, which leaves the old port busy (errno 22 with the change
/// applied and the tunnel down) or stops the device (measured on main with `fwmark=7` and
/// `listen_port=51821` after the key, issue 36). Such a request is done on a fresh device
/// instead ([`replay`]).
pub fn unchanged_settings(set: &mut Set, running: &Running) -> Result<(), Error> {
    if let Some(key) = set.private_key {
        if running.private_key != Some(key) {
            return Err(Error::Running {
                what: "the private key",
            });
        }
        set.private_key = None;
    }
    if let Some(port) = set.listen_port {
        if port != running.listen_port {
            return Err(Error::Running {
                what: "the listen port",
            });
        }
        set.listen_port = None;
    }
    if let Some(mark) = set.fwmark {
        if mark != running.fwmark {
            return Err(Error::Running { what: "the fwmark" });
        }
        set.fwmark = None;
    }
    Ok(())
}

/// A request that changes a running device's key, port or fwmark, as the first request of a
/// fresh device: the running settings and peers (`running`, `peers`: what gotatun reports,
/// endpoints as they roamed) with the request applied on top, all in one request. On the fresh
/// device it goes through [`Book::plan`] as any request: with a key the peers are configured at
/// once; with an all-zero key (wireguard-go's "remove the key") they are held, keyless.
/// Sessions are not carried over: every peer handshakes again.
pub fn replay(
    running: &Running,
    mut peers: BTreeMap<Key, PendingPeer>,
    request: &Set,
) -> Result<Set, Error> {
    apply_pending(&mut peers, request);
    if peers.len() > MAX_PEERS {
        return Err(Error::TooManyPeers { peers: peers.len() });
    }
    Ok(Set {
        private_key: request.private_key.or(running.private_key),
        listen_port: Some(request.listen_port.unwrap_or(running.listen_port)),
        fwmark: Some(request.fwmark.unwrap_or(running.fwmark)),
        replace_peers: false,
        peers: peers.into_iter().map(as_change).collect(),
    })
}

/// What to send to gotatun, and the book once gotatun has said errno=0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub send: Set,
    pub after: Book,
}

impl Book {
    /// Plans `set` (already checked by the parser; on a keyed device, by
    /// [`unchanged_settings`] too).
    pub fn plan(&self, set: &Set) -> Result<Plan, Error> {
        let new_key = set.private_key.filter(|k| *k != [0; 32]);
        match self {
            Book::Keyed { peers } => {
                let after = keyed_after(peers, set)?;
                Ok(Plan {
                    send: set.clone(),
                    after: Book::Keyed { peers: after },
                })
            }
            Book::Keyless { peers } => {
                let mut pending = peers.clone();
                apply_pending(&mut pending, set);
                if pending.len() > MAX_PEERS {
                    return Err(Error::TooManyPeers {
                        peers: pending.len(),
                    });
                }
                let device_only = Set {
                    private_key: None,
                    listen_port: set.listen_port,
                    fwmark: set.fwmark,
                    replace_peers: false,
                    peers: Vec::new(),
                };
                let Some(key) = new_key else {
                    // Still no key (an all-zero one is "no key", as in wireguard-go).
                    return Ok(Plan {
                        send: device_only,
                        after: Book::Keyless { peers: pending },
                    });
                };
                let keys = pending.keys().copied().collect();
                let send = Set {
                    private_key: Some(key),
                    peers: pending.into_iter().map(as_change).collect(),
                    ..device_only
                };
                Ok(Plan {
                    send,
                    after: Book::Keyed { peers: keys },
                })
            }
        }
    }

    /// The peers sticky-wg holds while the device has no key (none once it has one).
    pub fn pending(&self) -> impl Iterator<Item = (&Key, &PendingPeer)> {
        let peers = match self {
            Book::Keyless { peers } => Some(peers),
            Book::Keyed { .. } => None,
        };
        peers.into_iter().flatten()
    }

    /// How many peers the device holds.
    #[cfg(test)]
    pub fn peer_count(&self) -> usize {
        match self {
            Book::Keyless { peers } => peers.len(),
            Book::Keyed { peers } => peers.len(),
        }
    }
}

/// The peer keys gotatun will hold after `set` (its own rules: replace_peers clears, remove
/// removes, update_only touches only present peers, anything else adds or updates).
fn keyed_after(peers: &HashSet<Key>, set: &Set) -> Result<HashSet<Key>, Error> {
    let mut after = if set.replace_peers {
        HashSet::new()
    } else {
        peers.clone()
    };
    for change in &set.peers {
        if change.remove {
            after.remove(&change.public_key);
        } else if !change.update_only || after.contains(&change.public_key) {
            after.insert(change.public_key);
        }
    }
    if after.len() > MAX_PEERS {
        return Err(Error::TooManyPeers { peers: after.len() });
    }
    Ok(after)
}

/// Applies `set`'s peer changes to peers held without a key, with the protocol's meaning:
/// absent values keep what is there, an all-zero preshared key removes it, and an allowed IP
/// moves to the peer that names it last.
fn apply_pending(pending: &mut BTreeMap<Key, PendingPeer>, set: &Set) {
    if set.replace_peers {
        pending.clear();
    }
    let mut owner: HashMap<AllowedIp, Key> = pending
        .iter()
        .flat_map(|(k, p)| p.allowed_ips.iter().map(move |ip| (*ip, *k)))
        .collect();
    for change in &set.peers {
        let key = change.public_key;
        if change.remove {
            pending.remove(&key);
            continue;
        }
        if change.update_only && !pending.contains_key(&key) {
            continue;
        }
        let peer = pending.entry(key).or_default();
        if let Some(psk) = change.preshared_key {
            peer.preshared_key = (psk != [0; 32]).then_some(psk);
        }
        if change.endpoint.is_some() {
            peer.endpoint = change.endpoint;
        }
        if change.persistent_keepalive.is_some() {
            peer.persistent_keepalive = change.persistent_keepalive;
        }
        if change.replace_allowed_ips {
            peer.allowed_ips.clear();
        }
        for ip in &change.allowed_ips {
            if !peer.allowed_ips.contains(ip) {
                peer.allowed_ips.push(*ip);
            }
        }
        // Taken from whoever held them before.
        for ip in &change.allowed_ips {
            if let Some(previous) = owner.insert(*ip, key)
                && previous != key
                && let Some(p) = pending.get_mut(&previous)
            {
                p.allowed_ips.retain(|a| a != ip);
            }
        }
    }
}

/// A held peer as the change that makes it in gotatun.
fn as_change((public_key, peer): (Key, PendingPeer)) -> PeerChange {
    PeerChange {
        preshared_key: peer.preshared_key,
        endpoint: peer.endpoint,
        persistent_keepalive: peer.persistent_keepalive,
        replace_allowed_ips: true,
        allowed_ips: peer.allowed_ips,
        ..PeerChange::new(public_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uapi::{Request, parse};

    const K1: &str = "0101010101010101010101010101010101010101010101010101010101010101";
    const K2: &str = "0202020202020202020202020202020202020202020202020202020202020202";
    const K3: &str = "0303030303030303030303030303030303030303030303030303030303030303";

    fn set(body: &str) -> Set {
        match parse(&format!("set=1\n{body}\n")).expect("valid request") {
            Request::Set(s) => s,
            Request::Get => panic!("get"),
        }
    }

    fn ip(s: &str) -> AllowedIp {
        let (a, p) = s.split_once('/').unwrap();
        AllowedIp {
            addr: a.parse().unwrap(),
            prefix: p.parse().unwrap(),
        }
    }

    #[test]
    fn a_peer_before_the_key_is_held_and_handed_to_gotatun_with_the_key() {
        let book = Book::default();
        let plan = book
            .plan(&set(&format!(
                "listen_port=51820\npublic_key={K2}\nendpoint=192.0.2.2:51820\n\
                 allowed_ip=192.0.2.2/32\npersistent_keepalive_interval=25\n"
            )))
            .unwrap();
        // gotatun gets the port only: no peer without a key.
        assert_eq!(
            plan.send,
            Set {
                listen_port: Some(51820),
                ..Set::default()
            }
        );
        let held: Vec<_> = plan.after.pending().collect();
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].1.allowed_ips, vec![ip("192.0.2.2/32")]);
        // The key comes: one request with the key and every held peer.
        let plan = plan
            .after
            .plan(&set(&format!("private_key={K1}\n")))
            .unwrap();
        assert_eq!(plan.send.private_key, Some([1; 32]));
        assert_eq!(plan.send.peers.len(), 1);
        let p = &plan.send.peers[0];
        assert_eq!(p.public_key, [2; 32]);
        assert_eq!(p.endpoint, Some("192.0.2.2:51820".parse().unwrap()));
        assert_eq!(p.persistent_keepalive, Some(25));
        assert!(p.replace_allowed_ips);
        assert_eq!(p.allowed_ips, vec![ip("192.0.2.2/32")]);
        assert_eq!(
            plan.after,
            Book::Keyed {
                peers: HashSet::from([[2; 32]])
            }
        );
        assert_eq!(plan.after.pending().count(), 0);
        // Keyed: requests go through unchanged.
        let s = set(&format!("public_key={K3}\nallowed_ip=192.0.2.3/32\n"));
        let plan = plan.after.plan(&s).unwrap();
        assert_eq!(plan.send, s);
        assert_eq!(plan.after.peer_count(), 2);
    }

    #[test]
    fn held_peers_follow_the_protocols_rules() {
        let book = Book::default();
        let step = |book: &Book, body: &str| book.plan(&set(body)).unwrap().after;
        let book = step(
            &book,
            &format!(
                "public_key={K1}\nallowed_ip=192.0.2.1/32\nallowed_ip=198.51.100.0/24\n\
                 public_key={K2}\nallowed_ip=192.0.2.2/32\n"
            ),
        );
        // An allowed IP named by another peer moves to it; replace_allowed_ips replaces.
        let book = step(
            &book,
            &format!(
                "public_key={K2}\nallowed_ip=198.51.100.0/24\n\
                 public_key={K1}\nreplace_allowed_ips=true\nallowed_ip=192.0.2.9/32\n"
            ),
        );
        let held: BTreeMap<_, _> = book.pending().map(|(k, p)| (*k, p.clone())).collect();
        assert_eq!(held[&[1; 32]].allowed_ips, vec![ip("192.0.2.9/32")]);
        assert_eq!(
            held[&[2; 32]].allowed_ips,
            vec![ip("192.0.2.2/32"), ip("198.51.100.0/24")]
        );
        // update_only skips an absent peer, remove removes, an empty psk removes it.
        let book = step(
            &book,
            &format!(
                "public_key={K3}\nupdate_only=true\nendpoint=192.0.2.3:1\n\
                 public_key={K1}\nremove=true\npublic_key={K2}\npreshared_key={K3}\n"
            ),
        );
        let held: Vec<_> = book.pending().map(|(k, p)| (*k, p.clone())).collect();
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].0, [2; 32]);
        assert_eq!(held[0].1.preshared_key, Some([3; 32]));
        let book = step(&book, &format!("public_key={K2}\npreshared_key=\n"));
        assert_eq!(book.pending().next().unwrap().1.preshared_key, None);
        // replace_peers empties; an all-zero private key is "no key" and keeps them held.
        let zero = "0".repeat(64);
        let plan = book.plan(&set(&format!("private_key={zero}\n"))).unwrap();
        assert_eq!(plan.send, Set::default());
        assert_eq!(plan.after.pending().count(), 1);
        let book = step(&plan.after, "replace_peers=true\n");
        assert_eq!(book.peer_count(), 0);
    }

    #[test]
    fn a_keyed_device_counts_peers_by_gotatuns_rules_and_refuses_past_the_cap() {
        let book = Book::Keyed {
            peers: HashSet::from([[1; 32], [2; 32]]),
        };
        let after = |body: &str| book.plan(&set(body)).unwrap().after.peer_count();
        assert_eq!(after(&format!("public_key={K3}\nupdate_only=true\n")), 2);
        assert_eq!(after(&format!("public_key={K3}\n")), 3);
        assert_eq!(after(&format!("public_key={K1}\nremove=true\n")), 1);
        assert_eq!(after(&format!("replace_peers=true\npublic_key={K3}\n")), 1);
        let full = Book::Keyed {
            peers: (0..MAX_PEERS as u32)
                .map(|i| {
                    let mut k = [0u8; 32];
                    k[..4].copy_from_slice(&i.to_be_bytes());
                    k[31] = 0xff;
                    k
                })
                .collect(),
        };
        assert_eq!(
            full.plan(&set(&format!("public_key={K3}\n"))),
            Err(Error::TooManyPeers {
                peers: MAX_PEERS + 1
            })
        );
        // Replacing or updating a full device is fine.
        assert!(
            full.plan(&set(&format!("replace_peers=true\npublic_key={K3}\n")))
                .is_ok()
        );
    }

    #[test]
    fn a_running_device_takes_its_own_settings_again_and_refuses_a_change() {
        let running = Running {
            private_key: Some([1; 32]),
            listen_port: 51820,
            fwmark: 0,
        };
        let mut same = set(&format!(
            "private_key={K1}\nlisten_port=51820\nfwmark=0\npublic_key={K2}\n"
        ));
        assert_eq!(unchanged_settings(&mut same, &running), Ok(()));
        assert_eq!(same.private_key, None);
        assert_eq!(same.listen_port, None);
        assert_eq!(same.fwmark, None);
        assert_eq!(same.peers.len(), 1);
        let zero = "0".repeat(64);
        for (body, what) in [
            ("fwmark=7".to_string(), "the fwmark"),
            ("listen_port=51821".to_string(), "the listen port"),
            (format!("private_key={K2}"), "the private key"),
            (format!("private_key={zero}"), "the private key"),
        ] {
            let err = unchanged_settings(&mut set(&body), &running).unwrap_err();
            assert_eq!(err, Error::Running { what }, "{body}");
        }
    }

    #[test]
    fn a_change_of_a_running_devices_settings_is_replayed_whole_on_a_fresh_device() {
        let running = Running {
            private_key: Some([1; 32]),
            listen_port: 51820,
            fwmark: 0,
        };
        let peers = BTreeMap::from([(
            [2; 32],
            PendingPeer {
                endpoint: Some("198.51.100.2:40000".parse().unwrap()),
                persistent_keepalive: Some(25),
                allowed_ips: vec![ip("192.0.2.2/32")],
                ..PendingPeer::default()
            },
        )]);
        let request = set(&format!(
            "listen_port=51821\npublic_key={K2}\nallowed_ip=192.0.2.22/32\n\
             public_key={K3}\nallowed_ip=192.0.2.3/32\n"
        ));
        let replayed = replay(&running, peers.clone(), &request).unwrap();
        assert_eq!(replayed.private_key, Some([1; 32]));
        assert_eq!(replayed.listen_port, Some(51821));
        assert_eq!(replayed.fwmark, Some(0));
        assert_eq!(replayed.peers.len(), 2);
        let p2 = &replayed.peers[0];
        assert_eq!(p2.public_key, [2; 32]);
        // The roamed endpoint and keepalive stay; the new allowed IP adds to the old.
        assert_eq!(p2.endpoint, Some("198.51.100.2:40000".parse().unwrap()));
        assert_eq!(p2.persistent_keepalive, Some(25));
        assert_eq!(
            p2.allowed_ips,
            vec![ip("192.0.2.2/32"), ip("192.0.2.22/32")]
        );
        assert!(p2.replace_allowed_ips);
        assert_eq!(replayed.peers[1].public_key, [3; 32]);
        // On a fresh device it is one request with the key and both peers.
        let plan = Book::default().plan(&replayed).unwrap();
        assert_eq!(plan.send.peers.len(), 2);
        assert_eq!(plan.after.peer_count(), 2);
        // An all-zero key: the fresh device holds the peers without a key.
        let zero = "0".repeat(64);
        let replayed = replay(&running, peers, &set(&format!("private_key={zero}\n"))).unwrap();
        let plan = Book::default().plan(&replayed).unwrap();
        assert_eq!(plan.send.private_key, None);
        assert_eq!(plan.after.pending().count(), 1);
    }

    #[test]
    fn the_cap_holds_for_peers_held_without_a_key() {
        let mut body = String::new();
        for i in 0..=MAX_PEERS as u32 {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_be_bytes());
            let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
            body.push_str(&format!("public_key={hex}\n"));
        }
        // The parser stops at the cap already; a book near it stops the next request.
        let half: String = body.lines().take(MAX_PEERS).collect::<Vec<_>>().join("\n");
        let book = Book::default().plan(&set(&half)).unwrap().after;
        assert_eq!(book.peer_count(), MAX_PEERS);
        assert_eq!(
            book.plan(&set(&format!("public_key={K1}\n")))
                .unwrap_err()
                .errno(),
            crate::uapi::errno::ENOSPC
        );
    }
}
