//! The forwarding relay (issue 34): two gateways that cannot reach each other hold a WireGuard
//! session with each other end to end, and the relay gateway only forwards their encrypted
//! datagrams, as Tailscale's DERP, NetBird's relay and Nebula's relays do. The relay holds no
//! key that decrypts them: it can drop them, not read or alter them (each side's WireGuard
//! refuses anything it did not encrypt).
//!
//! How a datagram travels, from gateway A to gateway B through relay R (each a WireGuard peer
//! of R, as today):
//! - A's peer for B has a **relayed endpoint** ([`endpoint`]`(R, B)`): an address in `100::/32`
//!   (reserved, never routed, never sent to: the transport under WireGuard catches it) that
//!   names R and B. WireGuard sends to it as to any endpoint; the transport sends the datagram
//!   to R's endpoint instead, behind a 12-byte header naming B ([`Table::outbound`]).
//! - R forwards only between its own peers, at the endpoints its WireGuard authenticated (where
//!   each peer's last authenticated datagram came from): the sender must be one of them, the
//!   destination another. It rewrites the header to name A and sends the datagram on to B's
//!   endpoint ([`Table::inbound`], [`Inbound::Forward`]). Nothing else is learned: a forged
//!   source address gets ciphertext that B's WireGuard refuses to B, nothing more.
//! - B's transport takes a relayed datagram only from the endpoint of one of its peers (the
//!   relay) and naming another, strips the header, and hands WireGuard the datagram as coming
//!   from [`endpoint`]`(R, A)` ([`Inbound::Deliver`]): WireGuard's peer for A roams there on
//!   an authenticated datagram, and answers through R.
//!
//! Direct and relayed paths are the same peer with the same keys: moving between them is a
//! change of endpoint. A relayed endpoint may also ask for **punching** ([`endpoint`]'s
//! `punch`): the relay names, on each handshake it forwards, where it sees the sender come from
//! (what NAT discovery publishes), and the receiving transport keeps it as the sender's
//! candidate. While punching, handshakes also go to the candidate directly and keepalives only
//! there: once both NATs hold a mapping, a direct datagram arrives, WireGuard roams the peer to
//! it (an authenticated datagram), and the pair is direct with no change of key.
//!
//! Pure: the caller builds a [`Table`] from its device's peers, their current endpoints and the
//! candidates it has learned, and asks it about each datagram.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::keys::PublicKey;

/// The bytes a relayed datagram carries before WireGuard's own message (the pod MTU leaves room
/// for them: `sticky_overlay::sites::tunnel_overhead`).
pub const HEADER: usize = sticky_overlay::sites::RELAY_HEADER as usize;

/// A gateway's name on the relay: the first 8 bytes of its public key (keys are random: two of
/// 10,000 gateways share them with a chance of about 3 in 10^12; making a key that shares
/// another's costs 2^64 tries, and gets the maker only ciphertext it cannot read).
pub type Id = [u8; 8];

/// The id of `key`.
pub fn id(key: &PublicKey) -> Id {
    let mut out = [0; 8];
    out.copy_from_slice(&key.0[..8]);
    out
}

/// The first 4 bytes of the relayed endpoints' addresses: `100::/32`, inside the block the
/// IETF reserves (`::/8`), next to RFC 6666's discard prefix `100::/64`: never a real address.
const PREFIX: [u8; 4] = [0x01, 0x00, 0x00, 0x00];
/// The port of a relayed endpoint: relayed only, or relayed and punching.
const PORT_RELAYED: u16 = 1;
const PORT_PUNCHING: u16 = 2;

/// The relayed endpoint of gateway `to` through relay `via` (see the module doc), punching or
/// not: what a gateway sets as the endpoint of its peer for `to`. It names the relay by its
/// id's first 4 bytes (a gateway's own peers share them with a chance of about 1 in 10^5 at
/// 10,000 sites: the datagram is then dropped, not misdelivered).
pub fn endpoint(via: &PublicKey, to: &PublicKey, punch: bool) -> SocketAddr {
    relayed(&id(via), &id(to), punch)
}

fn relayed(via: &Id, to: &Id, punch: bool) -> SocketAddr {
    let mut octets = [0; 16];
    octets[..4].copy_from_slice(&PREFIX);
    octets[4..8].copy_from_slice(&via[..4]);
    octets[8..].copy_from_slice(to);
    let port = if punch { PORT_PUNCHING } else { PORT_RELAYED };
    SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port)
}

/// Whether `addr` is a relayed endpoint.
pub fn is_relayed(addr: &SocketAddr) -> bool {
    decode(addr).is_some()
}

/// The relay's 4-byte prefix, the destination's id and the punching flag of a relayed
/// endpoint.
fn decode(addr: &SocketAddr) -> Option<([u8; 4], Id, bool)> {
    let IpAddr::V6(ip) = addr.ip() else {
        return None;
    };
    let o = ip.octets();
    let punch = match addr.port() {
        PORT_RELAYED => false,
        PORT_PUNCHING => true,
        _ => return None,
    };
    if o[..4] != PREFIX {
        return None;
    }
    let mut via = [0; 4];
    via.copy_from_slice(&o[4..8]);
    let mut to = [0; 8];
    to.copy_from_slice(&o[8..]);
    Some((via, to, punch))
}

/// The header's first 4 bytes: a datagram for the relay to forward (naming its destination),
/// one the relay forwarded (naming its source), and one the relay forwarded with where it saw
/// the source come from (a handshake: [`SEEN`] more bytes). WireGuard's own messages start with
/// type 1 to 4 and three zero bytes, so none is ever taken for one.
const TO_RELAY: [u8; 4] = [0xf1, b's', b'r', 1];
const FROM_RELAY: [u8; 4] = [0xf2, b's', b'r', 1];
const FROM_RELAY_SEEN: [u8; 4] = [0xf3, b's', b'r', 1];

/// The longest header: [`HEADER`] and an IPv6 address seen (19 bytes).
pub const MAX_HEADER: usize = HEADER + SEEN;
/// Where the relay saw a source come from: a family byte (4 or 6), the port, 16 address bytes
/// (an IPv4 address in the first 4).
const SEEN: usize = 1 + 2 + 16;

/// A relay header, as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    bytes: [u8; MAX_HEADER],
    len: usize,
}

impl Header {
    fn new(kind: [u8; 4], id: &Id) -> Header {
        let mut bytes = [0; MAX_HEADER];
        bytes[..4].copy_from_slice(&kind);
        bytes[4..HEADER].copy_from_slice(id);
        Header { bytes, len: HEADER }
    }

    /// The same, with where the relay saw the source.
    fn seen(kind: [u8; 4], id: &Id, at: SocketAddr) -> Header {
        let mut h = Header::new(kind, id);
        let b = &mut h.bytes[HEADER..];
        b[0] = if at.is_ipv4() { 4 } else { 6 };
        b[1..3].copy_from_slice(&at.port().to_be_bytes());
        match at.ip() {
            IpAddr::V4(ip) => b[3..7].copy_from_slice(&ip.octets()),
            IpAddr::V6(ip) => b[3..19].copy_from_slice(&ip.octets()),
        }
        h.len = MAX_HEADER;
        h
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The address a [`FROM_RELAY_SEEN`] header carries after its first [`HEADER`] bytes.
fn read_seen(b: &[u8]) -> Option<SocketAddr> {
    let port = u16::from_be_bytes([b[1], b[2]]);
    let ip = match b[0] {
        4 => IpAddr::from([b[3], b[4], b[5], b[6]]),
        6 => {
            let mut o = [0; 16];
            o.copy_from_slice(&b[3..19]);
            IpAddr::from(o)
        }
        _ => return None,
    };
    let at = SocketAddr::new(ip, port);
    (port != 0 && !ip.is_unspecified() && !ip.is_multicast() && !is_relayed(&at)).then_some(at)
}

/// Whether `m` is a handshake (initiation or response): what the relay names the source's
/// address on, and what a punching transport also sends directly.
fn is_handshake(m: &[u8]) -> bool {
    matches!(m.first(), Some(1 | 2))
}

/// Whether `m` is a keepalive (a data message with nothing in it).
fn is_keepalive(m: &[u8]) -> bool {
    m.first() == Some(&4) && m.len() == MIN_MESSAGE
}

/// The shortest WireGuard message (a keepalive: a 16-byte header and a 16-byte tag).
const MIN_MESSAGE: usize = 32;

/// Whether `m` starts like a WireGuard message (type 1 to 4, three zero bytes) and is long
/// enough to be one: the relay forwards nothing else.
fn is_wireguard(m: &[u8]) -> bool {
    m.len() >= MIN_MESSAGE && (1..=4).contains(&m[0]) && m[1..4] == [0, 0, 0]
}

/// Why a datagram is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Drop {
    /// A relay header from an address that is no peer's authenticated endpoint.
    NotAPeer,
    /// It names a gateway that is no peer of this device.
    UnknownPeer,
    /// Its destination has no endpoint here (it has not been heard from), or a relayed one.
    NoEndpoint,
    /// Its source and destination are the same gateway.
    ToItself,
    /// What follows the header is no WireGuard message, or the address it names is none.
    NotWireGuard,
    /// A relayed endpoint whose relay is none of this device's peers with an endpoint (or two
    /// of them share its prefix).
    NoRelay,
}

impl Drop {
    /// How the counters and the log name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Drop::NotAPeer => "not from a peer",
            Drop::UnknownPeer => "names no peer",
            Drop::NoEndpoint => "destination has no endpoint",
            Drop::ToItself => "to itself",
            Drop::NotWireGuard => "not WireGuard",
            Drop::NoRelay => "no such relay",
        }
    }
}

/// What to do with a datagram that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// Not relayed: WireGuard's, as it came.
    Pass,
    /// Relayed to this gateway: strip `strip` bytes and give WireGuard the rest as coming from
    /// `from` (a relayed endpoint: the one the device has for that peer, when it has one through
    /// this relay). `seen`: where the relay saw the source (a handshake), with the source's id:
    /// its candidate for punching.
    Deliver {
        from: SocketAddr,
        strip: usize,
        seen: Option<(Id, SocketAddr)>,
    },
    /// This gateway relays it: replace the first [`HEADER`] bytes with `header` and send it to
    /// `to` (the destination peer's authenticated endpoint).
    Forward {
        to: SocketAddr,
        header: Header,
    },
    Drop(Drop),
}

/// Where a datagram WireGuard sends to a relayed endpoint goes: through the relay behind a
/// header, directly to the destination's candidate (punching), or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outbound {
    pub relay: Option<(SocketAddr, Header)>,
    pub direct: Option<SocketAddr>,
}

/// The device's peers as the relay rules need them, built from the device's view of each
/// peer's key and current endpoint (authenticated: WireGuard moves an endpoint only to where an
/// authenticated datagram came from). O(peers) to build, O(1) per datagram.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// Every peer's current endpoint, if it has one.
    by_id: HashMap<Id, Option<SocketAddr>>,
    /// Where the relay saw each peer come from (its punching candidate), by id.
    candidates: HashMap<Id, SocketAddr>,
    /// Real (not relayed) endpoints, each of exactly one peer.
    by_endpoint: HashMap<SocketAddr, Id>,
    /// Peers with a real endpoint by their id's first 4 bytes; `None`: two share them.
    relays: HashMap<[u8; 4], Option<SocketAddr>>,
}

impl Table {
    /// The table of a device whose peers are `peers` (key, current endpoint), with the
    /// candidates learned from relays (by id; those of peers no longer there are left out).
    pub fn new(
        peers: impl IntoIterator<Item = (PublicKey, Option<SocketAddr>)>,
        candidates: &HashMap<Id, SocketAddr>,
    ) -> Table {
        let mut t = Table::default();
        let mut shared_endpoints = Vec::new();
        for (key, endpoint) in peers {
            let id = id(&key);
            t.by_id.insert(id, endpoint);
            let Some(e) = endpoint.filter(|e| !is_relayed(e)) else {
                continue;
            };
            if t.by_endpoint.insert(e, id).is_some() {
                shared_endpoints.push(e);
            }
            let mut prefix = [0; 4];
            prefix.copy_from_slice(&id[..4]);
            t.relays
                .entry(prefix)
                .and_modify(|slot| *slot = None)
                .or_insert(Some(e));
        }
        // An endpoint two peers claim names neither.
        for e in shared_endpoints {
            t.by_endpoint.remove(&e);
        }
        t.candidates = candidates
            .iter()
            .filter(|(id, _)| t.by_id.contains_key(*id))
            .map(|(id, at)| (*id, *at))
            .collect();
        t
    }

    /// Whether peer `id` is one of the device's.
    pub fn has(&self, id: &Id) -> bool {
        self.by_id.contains_key(id)
    }

    /// Where `message`, which WireGuard sends to relayed endpoint `to`, goes: `None` when `to`
    /// is no relayed endpoint (sent as it is). Punching with a candidate known: a handshake
    /// goes both ways, a keepalive only directly (it is what opens and holds the NATs' way),
    /// anything else through the relay.
    pub fn outbound(&self, to: &SocketAddr, message: &[u8]) -> Option<Result<Outbound, Drop>> {
        let (via, dest, punch) = decode(to)?;
        let Some(Some(relay)) = self.relays.get(&via) else {
            return Some(Err(Drop::NoRelay));
        };
        let through = Some((*relay, Header::new(TO_RELAY, &dest)));
        let candidate = punch.then(|| self.candidates.get(&dest).copied()).flatten();
        Some(Ok(match candidate {
            Some(c) if is_keepalive(message) => Outbound {
                relay: None,
                direct: Some(c),
            },
            Some(c) if is_handshake(message) => Outbound {
                relay: through,
                direct: Some(c),
            },
            _ => Outbound {
                relay: through,
                direct: None,
            },
        }))
    }

    /// What to do with `datagram`, arrived from `from` (see [`Inbound`]).
    pub fn inbound(&self, datagram: &[u8], from: SocketAddr) -> Inbound {
        let Some((kind, named, rest)) = split(datagram) else {
            return Inbound::Pass;
        };
        let Some(&sender) = self.by_endpoint.get(&from) else {
            return Inbound::Drop(Drop::NotAPeer);
        };
        let (seen, message) = if kind == FROM_RELAY_SEEN {
            match rest.get(..SEEN).and_then(read_seen) {
                Some(at) => (Some((named, at)), &rest[SEEN..]),
                None => return Inbound::Drop(Drop::NotWireGuard),
            }
        } else {
            (None, rest)
        };
        if !is_wireguard(message) {
            return Inbound::Drop(Drop::NotWireGuard);
        }
        if named == sender {
            return Inbound::Drop(Drop::ToItself);
        }
        let Some(&endpoint) = self.by_id.get(&named) else {
            return Inbound::Drop(Drop::UnknownPeer);
        };
        if kind != TO_RELAY {
            // `sender` is the relay, `named` the gateway it forwards from: given to WireGuard
            // as from the endpoint the device has for it through this relay, so that roaming
            // there changes nothing.
            let from = match endpoint.and_then(|e| decode(&e).map(|d| (e, d))) {
                Some((e, (via, _, _))) if via[..] == sender[..4] => e,
                _ => relayed(&sender, &named, false),
            };
            return Inbound::Deliver {
                from,
                strip: datagram.len() - message.len(),
                seen,
            };
        }
        match endpoint.filter(|e| !is_relayed(e)) {
            Some(to) if is_handshake(message) => Inbound::Forward {
                to,
                header: Header::seen(FROM_RELAY_SEEN, &sender, from),
            },
            Some(to) => Inbound::Forward {
                to,
                header: Header::new(FROM_RELAY, &sender),
            },
            None => Inbound::Drop(Drop::NoEndpoint),
        }
    }
}

/// A relay header's kind, the id it names and the message after it; `None`: no relay header.
fn split(datagram: &[u8]) -> Option<([u8; 4], Id, &[u8])> {
    if datagram.len() < HEADER {
        return None;
    }
    let mut kind = [0; 4];
    kind.copy_from_slice(&datagram[..4]);
    if ![TO_RELAY, FROM_RELAY, FROM_RELAY_SEEN].contains(&kind) {
        return None;
    }
    let mut named = [0; 8];
    named.copy_from_slice(&datagram[4..HEADER]);
    Some((kind, named, &datagram[HEADER..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> PublicKey {
        PublicKey([b; 32])
    }

    fn ep(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// `header` followed by `message`: a datagram as sent.
    fn framed(header: &Header, message: &[u8]) -> Vec<u8> {
        [header.as_bytes(), message].concat()
    }

    /// A WireGuard message of type `t`, 48 bytes (a keepalive when `t` is 4 and 32 bytes).
    fn message(t: u8, len: usize) -> Vec<u8> {
        let mut m = vec![0u8; len];
        m[0] = t;
        m[8] = 0xaa;
        m
    }

    fn data() -> Vec<u8> {
        message(4, 48)
    }

    const A: u8 = 0xa1;
    const B: u8 = 0xb2;
    const R: u8 = 0xc3;
    const A_SEEN: &str = "203.0.113.10:40001";
    const B_SEEN: &str = "203.0.113.20:40002";
    const R_AT: &str = "203.0.113.1:51820";

    fn none() -> HashMap<Id, SocketAddr> {
        HashMap::new()
    }

    /// R's device: peers A and B, behind NAT, at the endpoints R's WireGuard saw them at.
    fn relay() -> Table {
        Table::new(
            [(key(A), Some(ep(A_SEEN))), (key(B), Some(ep(B_SEEN)))],
            &none(),
        )
    }

    /// A's device: peer R at its endpoint, peer B through R (punching or not), with the
    /// candidates A learned.
    fn gateway_a(punch: bool, candidates: &HashMap<Id, SocketAddr>) -> Table {
        Table::new(
            [
                (key(R), Some(ep(R_AT))),
                (key(B), Some(endpoint(&key(R), &key(B), punch))),
            ],
            candidates,
        )
    }

    /// B's device: peer R, and peer A not heard from yet.
    fn gateway_b() -> Table {
        Table::new([(key(R), Some(ep(R_AT))), (key(A), None)], &none())
    }

    #[test]
    fn a_relayed_endpoint_names_relay_destination_and_punching_and_is_no_real_address() {
        let e = endpoint(&key(R), &key(B), false);
        assert!(is_relayed(&e));
        assert_eq!(e.to_string(), "[100:0:c3c3:c3c3:b2b2:b2b2:b2b2:b2b2]:1");
        assert_eq!(endpoint(&key(R), &key(B), true).port(), 2);
        assert!(!is_relayed(&ep(R_AT)));
        assert!(!is_relayed(&ep("[2001:db8::1]:51820")));
        // The prefix with another port is not one (nothing of ours sends there).
        assert!(!is_relayed(&ep(
            "[100:0:c3c3:c3c3:b2b2:b2b2:b2b2:b2b2]:51820"
        )));
    }

    #[test]
    fn a_datagram_a_sends_to_b_through_r_reaches_b_as_from_a_through_r() {
        let m = data();
        // A: WireGuard sends to the relayed endpoint; the transport sends to R, naming B.
        let out = gateway_a(false, &none())
            .outbound(&endpoint(&key(R), &key(B), false), &m)
            .unwrap()
            .unwrap();
        assert_eq!(out.direct, None);
        let (to, h) = out.relay.unwrap();
        assert_eq!(to, ep(R_AT));
        let on_wire = framed(&h, &m);
        assert_eq!(on_wire.len(), m.len() + HEADER);
        // R: from A's authenticated endpoint, for B: forwarded to B's, naming A.
        let Inbound::Forward { to, header } = relay().inbound(&on_wire, ep(A_SEEN)) else {
            panic!("not forwarded")
        };
        assert_eq!(to, ep(B_SEEN));
        assert_eq!(
            header.as_bytes().len(),
            HEADER,
            "data: the header keeps its length"
        );
        let forwarded = framed(&header, &on_wire[HEADER..]);
        // B: from R's endpoint, naming A: WireGuard gets it as from A through R.
        assert_eq!(
            gateway_b().inbound(&forwarded, ep(R_AT)),
            Inbound::Deliver {
                from: endpoint(&key(R), &key(A), false),
                strip: HEADER,
                seen: None,
            }
        );
        assert_eq!(
            &forwarded[HEADER..],
            &m[..],
            "the message itself is untouched"
        );
    }

    #[test]
    fn on_a_handshake_the_relay_names_where_it_saw_the_sender_and_punching_uses_it() {
        let init = message(1, 148);
        let (_, h) = gateway_a(true, &none())
            .outbound(&endpoint(&key(R), &key(B), true), &init)
            .unwrap()
            .unwrap()
            .relay
            .unwrap();
        let Inbound::Forward { header, .. } = relay().inbound(&framed(&h, &init), ep(A_SEEN))
        else {
            panic!("not forwarded")
        };
        assert_eq!(header.as_bytes().len(), MAX_HEADER);
        // B punches towards A: its device has A through R, punching.
        let b = Table::new(
            [
                (key(R), Some(ep(R_AT))),
                (key(A), Some(endpoint(&key(R), &key(A), true))),
            ],
            &none(),
        );
        assert_eq!(
            b.inbound(&framed(&header, &init), ep(R_AT)),
            Inbound::Deliver {
                // The endpoint B has for A, punching flag and all: roaming there moves nothing.
                from: endpoint(&key(R), &key(A), true),
                strip: MAX_HEADER,
                seen: Some((id(&key(A)), ep(A_SEEN))),
            }
        );
        // A, punching, with B's candidate learned the same way: a handshake goes both ways, a
        // keepalive only directly, data only through R.
        let learned = HashMap::from([(id(&key(B)), ep(B_SEEN))]);
        let a = gateway_a(true, &learned);
        let to_b = endpoint(&key(R), &key(B), true);
        let out = |m: &[u8]| a.outbound(&to_b, m).unwrap().unwrap();
        let hs = out(&init);
        assert_eq!(
            (hs.relay.map(|r| r.0), hs.direct),
            (Some(ep(R_AT)), Some(ep(B_SEEN)))
        );
        let ka = out(&message(4, 32));
        assert_eq!((ka.relay, ka.direct), (None, Some(ep(B_SEEN))));
        let d = out(&data());
        assert_eq!((d.relay.map(|r| r.0), d.direct), (Some(ep(R_AT)), None));
        // Not punching: the candidate is not used.
        let quiet = gateway_a(false, &learned)
            .outbound(&endpoint(&key(R), &key(B), false), &message(4, 32))
            .unwrap()
            .unwrap();
        assert_eq!(quiet.direct, None);
    }

    #[test]
    fn wireguard_datagrams_and_real_endpoints_pass_as_they_are() {
        assert_eq!(
            relay().inbound(&data(), ep("198.51.100.9:1234")),
            Inbound::Pass
        );
        assert_eq!(relay().inbound(&[], ep("198.51.100.9:1234")), Inbound::Pass);
        assert_eq!(gateway_a(false, &none()).outbound(&ep(R_AT), &data()), None);
    }

    #[test]
    fn the_relay_forwards_only_between_its_peers_at_their_authenticated_endpoints() {
        let r = relay();
        let to = |k: u8, m: &[u8]| framed(&Header::new(TO_RELAY, &id(&key(k))), m);
        // From anyone else (a spoofed or unknown address, a pod, the internet): dropped.
        assert_eq!(
            r.inbound(&to(B, &data()), ep("198.51.100.9:40001")),
            Inbound::Drop(Drop::NotAPeer)
        );
        // To a gateway that is no peer of the relay.
        assert_eq!(
            r.inbound(&to(0x77, &data()), ep(A_SEEN)),
            Inbound::Drop(Drop::UnknownPeer)
        );
        // Back to its own sender.
        assert_eq!(
            r.inbound(&to(A, &data()), ep(A_SEEN)),
            Inbound::Drop(Drop::ToItself)
        );
        // Not a WireGuard message behind the header.
        assert_eq!(
            r.inbound(&to(B, &[0x45; 60]), ep(A_SEEN)),
            Inbound::Drop(Drop::NotWireGuard)
        );
        // To a peer never heard from (no endpoint), or one itself relayed: never chained.
        let quiet = Table::new(
            [
                (key(A), Some(ep(A_SEEN))),
                (key(B), None),
                (key(0x55), Some(endpoint(&key(0x66), &key(0x55), false))),
            ],
            &none(),
        );
        assert_eq!(
            quiet.inbound(&to(B, &data()), ep(A_SEEN)),
            Inbound::Drop(Drop::NoEndpoint)
        );
        assert_eq!(
            quiet.inbound(&to(0x55, &data()), ep(A_SEEN)),
            Inbound::Drop(Drop::NoEndpoint)
        );
    }

    #[test]
    fn a_gateway_takes_relayed_datagrams_only_from_a_peer_naming_one_and_a_real_address() {
        let b = gateway_b();
        let from = |k: u8| framed(&Header::new(FROM_RELAY, &id(&key(k))), &data());
        assert_eq!(
            b.inbound(&from(A), ep("203.0.113.66:51820")),
            Inbound::Drop(Drop::NotAPeer)
        );
        assert_eq!(
            b.inbound(&from(0x77), ep(R_AT)),
            Inbound::Drop(Drop::UnknownPeer)
        );
        // A relay naming no real address (a relayed one, port 0, or a bad family).
        for at in ["[100:0:c3c3:c3c3:b2b2:b2b2:b2b2:b2b2]:1", "203.0.113.10:0"] {
            let h = Header::seen(FROM_RELAY_SEEN, &id(&key(A)), ep(at));
            assert_eq!(
                b.inbound(&framed(&h, &message(1, 148)), ep(R_AT)),
                Inbound::Drop(Drop::NotWireGuard),
                "{at}"
            );
        }
    }

    #[test]
    fn an_endpoint_two_peers_share_names_neither_and_a_shared_prefix_no_relay() {
        let t = Table::new(
            [(key(A), Some(ep(A_SEEN))), (key(B), Some(ep(A_SEEN)))],
            &none(),
        );
        let to_b = framed(&Header::new(TO_RELAY, &id(&key(B))), &data());
        assert_eq!(t.inbound(&to_b, ep(A_SEEN)), Inbound::Drop(Drop::NotAPeer));
        let mut k1 = key(R);
        let mut k2 = key(R);
        k1.0[7] = 1;
        k2.0[7] = 2;
        let t = Table::new(
            [(k1, Some(ep(R_AT))), (k2, Some(ep("203.0.113.2:51820")))],
            &none(),
        );
        assert_eq!(
            t.outbound(&endpoint(&k1, &key(B), false), &data()),
            Some(Err(Drop::NoRelay))
        );
        assert_eq!(
            gateway_a(false, &none()).outbound(&endpoint(&key(0x99), &key(B), false), &data()),
            Some(Err(Drop::NoRelay))
        );
    }
}
