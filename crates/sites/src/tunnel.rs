//! What a WireGuard data path holds and how the agent changes it (docs/sites-tunnel-choice.md
//! section 5): the agent computes the desired peers; its device seam only gets and sets. Both
//! the userspace API (the `sticky-wg` daemon) and the kernel's generic netlink family
//! "wireguard" carry exactly these fields. [`apply`] is how a device takes a change (for the
//! agent's fakes and its simulation).
//!
//! Re-applying an unchanged peer costs packets (4–12 measured on gotatun), so the agent applies
//! only what [`diff`] returns: nothing when the device already holds the desired state.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::SystemTime;

use ipnet::IpNet;

use crate::keys::PublicKey;

/// A peer as the agent wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    pub public_key: PublicKey,
    /// None: a dial-in-only peer (it is behind NAT); an existing (roamed) endpoint is kept.
    pub endpoint: Option<SocketAddr>,
    /// Sorted, without repeats.
    pub allowed_ips: Vec<IpNet>,
    /// Set where this side is behind NAT (or punching).
    pub keepalive_secs: Option<u16>,
    /// Where a dial-in peer was last seen coming from (this side's own NAT discovery, kept in
    /// the cache): given only to a device that has no endpoint for it (made anew: a restart),
    /// so this side can handshake first through the mapping the peer's keepalives hold open,
    /// instead of waiting for the peer's stale session to time out. A roamed endpoint is kept.
    pub last_seen: Option<SocketAddr>,
}

/// A peer as the device reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    pub public_key: PublicKey,
    /// Current, after roaming.
    pub endpoint: Option<SocketAddr>,
    pub allowed_ips: Vec<IpNet>,
    pub keepalive_secs: Option<u16>,
    /// None: never.
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

impl PeerState {
    /// A peer the device has just been told of: no endpoint, allowed IPs, handshake or bytes.
    pub fn new(public_key: PublicKey) -> Self {
        Self {
            public_key,
            endpoint: None,
            allowed_ips: Vec::new(),
            keepalive_secs: None,
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }
}

/// A device as it reports itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceState {
    /// Derived from the device's private key; None when it has none.
    pub public_key: Option<PublicKey>,
    pub listen_port: u16,
    pub peers: Vec<PeerState>,
}

impl DeviceState {
    /// Its peers by key: a round looks up thousands of them (a hub's sites).
    pub fn by_key(&self) -> HashMap<PublicKey, &PeerState> {
        self.peers.iter().map(|p| (p.public_key, p)).collect()
    }
}

/// One change to a device's peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerChange {
    /// Add or update the peer; `replace_allowed_ips`: its allowed IPs become exactly the
    /// given ones (false: they are left as they are and none are sent).
    Upsert {
        peer: PeerConfig,
        replace_allowed_ips: bool,
    },
    /// Remove the peer with this key.
    Remove(PublicKey),
}

/// Sorted, without repeats, host bits cleared (as a device reports them back).
fn sorted(ips: &[IpNet]) -> Vec<IpNet> {
    let mut v: Vec<IpNet> = ips.iter().map(IpNet::trunc).collect();
    v.sort();
    v.dedup();
    v
}

/// Whether `a` and `b` hold the same networks (host bits cleared). Without copying when both
/// are already so, as a device reports them and the plan makes them: a hub compares
/// thousands every round.
fn same_set(a: &[IpNet], b: &[IpNet]) -> bool {
    let canonical =
        |v: &[IpNet]| v.windows(2).all(|w| w[0] < w[1]) && v.iter().all(|n| *n == n.trunc());
    if canonical(a) && canonical(b) {
        return a == b;
    }
    sorted(a) == sorted(b)
}

/// The changes that turn `actual` into `desired`: removals of peers not desired first, then
/// upserts of peers that are new or differ, each in key order. A desired peer without an
/// endpoint leaves the device's (roamed) endpoint alone, or gives it `last_seen` when the
/// device has none; allowed IPs are compared as sets.
/// Empty when nothing differs. Linear in desired + actual (a hub's round diffs 10,000 peers),
/// and the changes sorted.
pub fn diff<'a>(
    desired: impl IntoIterator<Item = &'a PeerConfig>,
    actual: &DeviceState,
) -> Vec<PeerChange> {
    diff_keyed(desired, &actual.by_key())
}

/// [`diff`] against the device's peers by key ([`DeviceState::by_key`]), for a round that made
/// them already.
pub fn diff_keyed<'a>(
    desired: impl IntoIterator<Item = &'a PeerConfig>,
    have: &HashMap<PublicKey, &PeerState>,
) -> Vec<PeerChange> {
    let want: HashMap<PublicKey, &PeerConfig> =
        desired.into_iter().map(|p| (p.public_key, p)).collect();
    let mut removed: Vec<PublicKey> = have
        .keys()
        .filter(|k| !want.contains_key(k))
        .copied()
        .collect();
    removed.sort_unstable();
    let mut out: Vec<PeerChange> = removed.into_iter().map(PeerChange::Remove).collect();
    let mut upserts = Vec::new();
    for (key, w) in want {
        let Some(h) = have.get(&key) else {
            let upsert = PeerChange::Upsert {
                peer: PeerConfig {
                    allowed_ips: sorted(&w.allowed_ips),
                    endpoint: w.endpoint.or(w.last_seen),
                    ..w.clone()
                },
                replace_allowed_ips: true,
            };
            upserts.push((key, upsert));
            continue;
        };
        let ips_differ = !same_set(&w.allowed_ips, &h.allowed_ips);
        let endpoint = match (w.endpoint, h.endpoint) {
            (None, None) => w.last_seen,
            (want, _) => want,
        };
        let endpoint_differs = endpoint.is_some() && endpoint != h.endpoint;
        let keepalive_differs = w.keepalive_secs.unwrap_or(0) != h.keepalive_secs.unwrap_or(0);
        if ips_differ || endpoint_differs || keepalive_differs {
            let upsert = PeerChange::Upsert {
                peer: PeerConfig {
                    public_key: key,
                    endpoint: if endpoint_differs { endpoint } else { None },
                    allowed_ips: if ips_differ {
                        sorted(&w.allowed_ips)
                    } else {
                        Vec::new()
                    },
                    keepalive_secs: w.keepalive_secs,
                    last_seen: w.last_seen,
                },
                replace_allowed_ips: ips_differ,
            };
            upserts.push((key, upsert));
        }
    }
    upserts.sort_unstable_by_key(|(key, _)| *key);
    out.extend(upserts.into_iter().map(|(_, upsert)| upsert));
    out
}

/// Applies `changes` to `dev` as a WireGuard device does.
pub fn apply(dev: &mut DeviceState, changes: &[PeerChange]) {
    for change in changes {
        match change {
            PeerChange::Remove(key) => dev.peers.retain(|p| p.public_key != *key),
            PeerChange::Upsert {
                peer,
                replace_allowed_ips,
            } => {
                // An allowed IP belongs to one peer: adding it elsewhere moves it.
                for other in dev
                    .peers
                    .iter_mut()
                    .filter(|p| p.public_key != peer.public_key)
                {
                    other
                        .allowed_ips
                        .retain(|ip| !peer.allowed_ips.contains(ip));
                }
                let i = match dev
                    .peers
                    .iter()
                    .position(|p| p.public_key == peer.public_key)
                {
                    Some(i) => i,
                    None => {
                        dev.peers.push(PeerState::new(peer.public_key));
                        dev.peers.len() - 1
                    }
                };
                let Some(p) = dev.peers.get_mut(i) else {
                    continue;
                };
                if peer.endpoint.is_some() {
                    p.endpoint = peer.endpoint;
                }
                p.keepalive_secs = peer.keepalive_secs.filter(|k| *k != 0);
                if *replace_allowed_ips {
                    p.allowed_ips.clear();
                }
                for ip in &peer.allowed_ips {
                    if !p.allowed_ips.contains(ip) {
                        p.allowed_ips.push(*ip);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// A desired peer: key bytes all `k`.
    pub(crate) fn want(k: u8, ep: Option<&str>, ips: &[&str], ka: Option<u16>) -> PeerConfig {
        PeerConfig {
            public_key: PublicKey([k; 32]),
            endpoint: ep.map(|e| e.parse().unwrap()),
            allowed_ips: ips.iter().map(|s| net(s)).collect(),
            keepalive_secs: ka,
            last_seen: None,
        }
    }

    fn have(k: u8, ep: Option<&str>, ips: &[&str], ka: Option<u16>) -> PeerState {
        PeerState {
            public_key: PublicKey([k; 32]),
            endpoint: ep.map(|e| e.parse().unwrap()),
            allowed_ips: ips.iter().map(|s| net(s)).collect(),
            keepalive_secs: ka,
            last_handshake: None,
            rx_bytes: 5,
            tx_bytes: 6,
        }
    }

    fn dev(peers: Vec<PeerState>) -> DeviceState {
        DeviceState {
            public_key: None,
            listen_port: 51820,
            peers,
        }
    }

    #[test]
    fn diff_table() {
        let ep = "203.0.113.1:51820";
        let roamed = "198.51.100.9:3333";
        let cases: Vec<(&str, Vec<PeerConfig>, DeviceState, Vec<PeerChange>)> = vec![
            (
                "equal: nothing",
                vec![want(1, Some(ep), &["10.0.1.0/24"], Some(25))],
                dev(vec![have(1, Some(ep), &["10.0.1.0/24"], Some(25))]),
                vec![],
            ),
            (
                "allowed IPs in another order: nothing",
                vec![want(1, None, &["10.0.2.0/24", "10.0.1.0/24"], None)],
                dev(vec![have(
                    1,
                    Some(roamed),
                    &["10.0.1.0/24", "10.0.2.0/24"],
                    None,
                )]),
                vec![],
            ),
            (
                "new peer",
                vec![want(2, None, &["10.0.2.0/24", "10.0.1.0/24"], None)],
                dev(vec![]),
                vec![PeerChange::Upsert {
                    peer: want(2, None, &["10.0.1.0/24", "10.0.2.0/24"], None),
                    replace_allowed_ips: true,
                }],
            ),
            (
                "gone peer",
                vec![],
                dev(vec![have(3, None, &[], None)]),
                vec![PeerChange::Remove(PublicKey([3; 32]))],
            ),
            (
                "endpoint changed only",
                vec![want(1, Some(ep), &["10.0.1.0/24"], None)],
                dev(vec![have(1, Some(roamed), &["10.0.1.0/24"], None)]),
                vec![PeerChange::Upsert {
                    peer: want(1, Some(ep), &[], None),
                    replace_allowed_ips: false,
                }],
            ),
            (
                "keepalive changed",
                vec![want(1, None, &["10.0.1.0/24"], Some(25))],
                dev(vec![have(1, None, &["10.0.1.0/24"], None)]),
                vec![PeerChange::Upsert {
                    peer: want(1, None, &[], Some(25)),
                    replace_allowed_ips: false,
                }],
            ),
            (
                "keepalive 0 = none",
                vec![want(1, None, &["10.0.1.0/24"], Some(0))],
                dev(vec![have(1, None, &["10.0.1.0/24"], None)]),
                vec![],
            ),
            (
                "allowed IPs changed",
                vec![want(1, None, &["10.0.1.0/24", "10.0.3.0/24"], None)],
                dev(vec![have(1, None, &["10.0.1.0/24"], None)]),
                vec![PeerChange::Upsert {
                    peer: want(1, None, &["10.0.1.0/24", "10.0.3.0/24"], None),
                    replace_allowed_ips: true,
                }],
            ),
        ];
        for (name, desired, actual, expect) in cases {
            assert_eq!(diff(&desired, &actual), expect, "{name}");
        }
    }

    #[test]
    fn removals_come_first_then_key_order() {
        let desired = vec![
            want(9, None, &["10.0.9.0/24"], None),
            want(4, None, &["10.0.4.0/24"], None),
        ];
        let actual = dev(vec![have(7, None, &[], None), have(2, None, &[], None)]);
        let keys: Vec<(bool, u8)> = diff(&desired, &actual)
            .iter()
            .map(|c| match c {
                PeerChange::Remove(k) => (false, k.0[0]),
                PeerChange::Upsert { peer, .. } => (true, peer.public_key.0[0]),
            })
            .collect();
        assert_eq!(keys, [(false, 2), (false, 7), (true, 4), (true, 9)]);
    }

    /// (key, endpoint, allowed IPs, keepalive) as small numbers.
    type Gen = (u8, Option<u8>, Vec<u8>, Option<u16>);

    fn arb_state() -> impl Strategy<Value = Vec<Gen>> {
        proptest::collection::vec(
            (
                0u8..6,
                proptest::option::of(0u8..3),
                proptest::collection::vec(0u8..8, 0..4),
                proptest::option::of(0u16..3),
            ),
            0..6,
        )
    }

    fn peers_of(v: &[Gen]) -> Vec<PeerConfig> {
        let mut seen = std::collections::BTreeSet::new();
        v.iter()
            .filter(|(k, ..)| seen.insert(*k))
            .map(|(k, ep, ips, ka)| PeerConfig {
                public_key: PublicKey([k + 1; 32]),
                endpoint: ep.map(|e| SocketAddr::from(([203, 0, 113, e + 1], 51820))),
                allowed_ips: ips
                    .iter()
                    .map(|i| net(&format!("10.{k}.{i}.0/24")))
                    .collect(),
                keepalive_secs: *ka,
                last_seen: None,
            })
            .collect()
    }

    /// Issue 36: a dial-in peer's `last_seen` goes to a device that has no endpoint for it (a
    /// new peer, or one whose device was made anew); a roamed endpoint is never overwritten by
    /// it, and an unchanged peer is no change.
    #[test]
    fn last_seen_only_where_the_device_has_no_endpoint() {
        let seen: SocketAddr = "203.0.113.20:40001".parse().unwrap();
        let mut w = want(1, None, &["10.1.0.0/24"], None);
        w.last_seen = Some(seen);
        let new = diff(std::slice::from_ref(&w), &DeviceState::default());
        let [PeerChange::Upsert { peer, .. }] = &new[..] else {
            panic!("{new:?}")
        };
        assert_eq!(peer.endpoint, Some(seen));
        let mut dev = DeviceState::default();
        let mut known = PeerState::new(PublicKey([1; 32]));
        known.allowed_ips = vec![net("10.1.0.0/24")];
        dev.peers.push(known.clone());
        let remade = diff(std::slice::from_ref(&w), &dev);
        let [
            PeerChange::Upsert {
                peer,
                replace_allowed_ips: false,
            },
        ] = &remade[..]
        else {
            panic!("{remade:?}")
        };
        assert_eq!(peer.endpoint, Some(seen));
        known.endpoint = Some("203.0.113.20:40999".parse().unwrap());
        dev.peers[0] = known;
        assert_eq!(diff(&[w], &dev), [], "a roamed endpoint is kept");
    }

    proptest! {
        /// Applying the diff to any device state yields the desired peers, and a second diff
        /// is empty (so a loop never re-applies).
        #[test]
        fn diff_converges(start in arb_state(), goal in arb_state()) {
            let mut d = DeviceState::default();
            let first = diff(&peers_of(&start), &d);
            apply(&mut d, &first);
            let desired = peers_of(&goal);
            let changes = diff(&desired, &d);
            apply(&mut d, &changes);
            prop_assert!(diff(&desired, &d).is_empty());
            let mut got: Vec<PublicKey> = d.peers.iter().map(|p| p.public_key).collect();
            got.sort();
            let mut want: Vec<PublicKey> = desired.iter().map(|p| p.public_key).collect();
            want.sort();
            prop_assert_eq!(got, want);
        }
    }
}
