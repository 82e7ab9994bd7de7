//! Liveness inside a site (issue 29, "Failover without the API"): every node answers small UDP
//! probes on its underlay address and probes its site's gateway candidates (a candidate also
//! probes every other member, for [`crate::heal`]) every [`INTERVAL`]. Pure here: the message
//! ([`Message::encode`]/[`decode`]) and the per-peer state machine ([`Tracker`]: Dead after
//! [`DEAD_AFTER`] missed in a row, Alive after [`ALIVE_AFTER`] answered in a row), driven by the
//! caller's clock. The socket is the agent's.
//!
//! Blast radius: a packet that is not a well-formed probe of this version is an error from
//! [`decode`] and the caller drops it; a reply counts only for the nonce of the probe it
//! answers, and nonces are the caller's random numbers (not a counter), so a forged reply
//! cannot guess the next one from any it saw. Only members reach the tracker: the agent's
//! socket for each member is connected to that member's underlay address, so the kernel
//! queues nothing else there (docs/sites.md, "Trust").

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::gateway::{Liveness, Seen};

/// How often each peer is probed: twice a second, so that a gateway that went away is seen
/// dead 2.5 to 3 s after its last answer (issue 36's failover budget of 6 s; at once a second
/// and 3 missed it was 3 to 4 s, and failovers took up to 6 s).
pub const INTERVAL: Duration = Duration::from_millis(500);
/// Missed probes in a row after which a peer is [`Seen::Dead`]: 2.5 s without an answer.
pub const DEAD_AFTER: u32 = 5;
/// Answered probes in a row after which a peer is [`Seen::Alive`] (again): 2 s of answers.
pub const ALIVE_AFTER: u32 = 4;

const MAGIC: &[u8; 4] = b"STKP";
const VERSION: u8 = 1;
/// Longest name carried (a Node name is at most 253 bytes).
const MAX_NAME: usize = 253;

/// A probe or its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// A reply (else a probe).
    pub reply: bool,
    /// Chosen by the prober; the reply repeats it.
    pub nonce: u64,
    /// The sender's Node name.
    pub name: String,
    /// The sender's current active gateway of its site (none: empty on the wire).
    pub active: Option<String>,
}

/// Why a packet is not a probe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("not a probe: {len} bytes starting {start:02x?}, expected {MAGIC:?}")]
    Magic { len: usize, start: Vec<u8> },
    #[error("probe version {0} is not {VERSION}")]
    Version(u8),
    #[error("probe kind {0} is neither 0 (probe) nor 1 (reply)")]
    Kind(u8),
    #[error("probe truncated at byte {0}")]
    Truncated(usize),
    #[error("probe has {0} bytes after its end")]
    Trailing(usize),
    #[error("probe name {0:?} is not UTF-8 or is empty")]
    Name(Vec<u8>),
    #[error("probe name of {0} bytes is longer than {MAX_NAME}")]
    TooLong(usize),
}

impl Message {
    /// The wire form: magic, version, kind, nonce (8 bytes, big-endian), then the name and the
    /// active gateway, each one length byte and UTF-8.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let active = self.active.as_deref().unwrap_or("");
        for s in [self.name.as_str(), active] {
            if s.len() > MAX_NAME {
                return Err(Error::TooLong(s.len()));
            }
        }
        let mut out = Vec::with_capacity(16 + self.name.len() + active.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(u8::from(self.reply));
        out.extend_from_slice(&self.nonce.to_be_bytes());
        for s in [self.name.as_str(), active] {
            out.push(s.len() as u8);
            out.extend_from_slice(s.as_bytes());
        }
        Ok(out)
    }
}

/// Reads one packet (see [`Message::encode`]); anything else is an error.
pub fn decode(b: &[u8]) -> Result<Message, Error> {
    if b.len() < 4 || &b[..4] != MAGIC {
        return Err(Error::Magic {
            len: b.len(),
            start: b.iter().take(4).copied().collect(),
        });
    }
    let byte = |i: usize| b.get(i).copied().ok_or(Error::Truncated(i));
    let version = byte(4)?;
    if version != VERSION {
        return Err(Error::Version(version));
    }
    let reply = match byte(5)? {
        0 => false,
        1 => true,
        k => return Err(Error::Kind(k)),
    };
    let nonce_bytes: [u8; 8] = b
        .get(6..14)
        .and_then(|s| s.try_into().ok())
        .ok_or(Error::Truncated(b.len()))?;
    let mut at = 14;
    let mut text = |empty_ok: bool| -> Result<String, Error> {
        let len = usize::from(byte(at)?);
        let raw = b
            .get(at + 1..at + 1 + len)
            .ok_or(Error::Truncated(b.len()))?;
        at += 1 + len;
        match std::str::from_utf8(raw) {
            Ok(s) if empty_ok || !s.is_empty() => Ok(s.to_string()),
            _ => Err(Error::Name(raw.to_vec())),
        }
    };
    let name = text(false)?;
    let active = text(true)?;
    if at != b.len() {
        return Err(Error::Trailing(b.len() - at));
    }
    Ok(Message {
        reply,
        nonce: u64::from_be_bytes(nonce_bytes),
        name,
        active: (!active.is_empty()).then_some(active),
    })
}

/// One peer's probing state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Peer {
    seen: Seen,
    /// Answered (positive) or missed (negative) in a row.
    streak: i64,
    /// The probe in flight: its nonce and when it was sent.
    pending: Option<(u64, Instant)>,
    /// The active gateway the peer's last reply named.
    active: Option<String>,
}

/// The liveness of the peers this node probes (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    peers: BTreeMap<String, Peer>,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// Sets who is probed: peers not named are forgotten, new ones start [`Seen::Unknown`].
    pub fn set_peers<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let names: std::collections::BTreeSet<&str> = names.into_iter().collect();
        self.peers.retain(|n, _| names.contains(n.as_str()));
        for n in names {
            self.peers.entry(n.to_string()).or_insert(Peer {
                seen: Seen::Unknown,
                streak: 0,
                pending: None,
                active: None,
            });
        }
    }

    /// Starts a probe round at `now`: a probe still unanswered counts as missed, and every
    /// peer gets a new nonce from `nonce` (the caller's random source: unguessable from the
    /// ones before). Returns (peer, nonce) to send.
    pub fn round(&mut self, now: Instant, mut nonce: impl FnMut() -> u64) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (name, p) in &mut self.peers {
            if p.pending.take().is_some() {
                p.streak = p.streak.min(0) - 1;
                if p.streak <= -i64::from(DEAD_AFTER) {
                    p.seen = Seen::Dead;
                    p.active = None;
                }
            }
            let n = nonce();
            p.pending = Some((n, now));
            out.push((name.clone(), n));
        }
        out
    }

    /// A reply arrived: it counts when it answers the probe in flight to its sender (same
    /// nonce); true then.
    pub fn answered(&mut self, reply: &Message) -> bool {
        let Some(p) = self.peers.get_mut(&reply.name) else {
            return false;
        };
        if !reply.reply || p.pending.map(|(n, _)| n) != Some(reply.nonce) {
            return false;
        }
        p.pending = None;
        p.streak = p.streak.max(0) + 1;
        if p.streak >= i64::from(ALIVE_AFTER) {
            p.seen = Seen::Alive;
        }
        p.active.clone_from(&reply.active);
        true
    }

    /// The liveness view of the probed peers (the caller adds itself as alive).
    pub fn liveness(&self) -> Liveness {
        self.peers
            .iter()
            .map(|(n, p)| (n.clone(), p.seen))
            .collect()
    }

    /// The active gateway each peer seen alive named in its last reply.
    pub fn choices(&self) -> BTreeMap<String, String> {
        self.peers
            .iter()
            .filter(|(_, p)| p.seen == Seen::Alive)
            .filter_map(|(n, p)| p.active.clone().map(|a| (n.clone(), a)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(reply: bool, nonce: u64, name: &str, active: Option<&str>) -> Message {
        Message {
            reply,
            nonce,
            name: name.into(),
            active: active.map(Into::into),
        }
    }

    /// Test nonces: a counter (the agent's are random).
    fn counter(from: u64) -> impl FnMut() -> u64 {
        let mut n = from;
        move || {
            n += 1;
            n
        }
    }

    #[test]
    fn codec_round_trips() {
        for m in [
            msg(false, 0, "a2", None),
            msg(true, u64::MAX, "a1", Some("a3")),
            msg(true, 7, &"n".repeat(253), Some(&"g".repeat(253))),
        ] {
            assert_eq!(decode(&m.encode().unwrap()).unwrap(), m);
        }
        assert_eq!(
            msg(false, 1, &"n".repeat(254), None).encode(),
            Err(Error::TooLong(254))
        );
    }

    #[test]
    fn codec_refuses_what_is_not_a_probe() {
        let good = msg(true, 5, "a1", Some("a3")).encode().unwrap();
        let with = |i: usize, v: u8| {
            let mut b = good.clone();
            b[i] = v;
            b
        };
        let mut trailing = good.clone();
        trailing.push(0);
        let mut bad_utf8 = good.clone();
        bad_utf8[15] = 0xff;
        type Case = (Vec<u8>, fn(&Error) -> bool);
        let cases: Vec<Case> = vec![
            (Vec::new(), |e| matches!(e, Error::Magic { .. })),
            (b"GET / HTTP/1.1".to_vec(), |e| {
                matches!(e, Error::Magic { .. })
            }),
            (with(4, 2), |e| *e == Error::Version(2)),
            (with(5, 9), |e| *e == Error::Kind(9)),
            (good[..10].to_vec(), |e| matches!(e, Error::Truncated(_))),
            (good[..good.len() - 1].to_vec(), |e| {
                matches!(e, Error::Truncated(_))
            }),
            (with(14, 0), |e| matches!(e, Error::Name(_))), // empty name
            (with(14, 200), |e| matches!(e, Error::Truncated(_))),
            (trailing, |e| *e == Error::Trailing(1)),
            (bad_utf8, |e| matches!(e, Error::Name(_))),
        ];
        for (bytes, want) in cases {
            let got = decode(&bytes).unwrap_err();
            assert!(want(&got), "{bytes:02x?}: {got:?}");
        }
    }

    #[test]
    fn dead_after_five_missed_alive_after_four_answered() {
        assert_eq!((DEAD_AFTER, ALIVE_AFTER), (5, 4));
        // 2.5 s without an answer is dead; 2 s of answers is alive again.
        assert_eq!(INTERVAL * DEAD_AFTER, Duration::from_millis(2500));
        assert_eq!(INTERVAL * ALIVE_AFTER, Duration::from_secs(2));
        let t0 = Instant::now();
        let mut t = Tracker::new();
        let mut nonces = counter(100);
        t.set_peers(["a1"]);
        let seen = |t: &Tracker| t.liveness()["a1"];
        let (miss, answer) = (false, true);
        // (answer this round?, the view after the next round starts)
        let mut steps = Vec::new();
        steps.extend([(miss, Seen::Unknown); 4]);
        steps.push((miss, Seen::Dead)); // the fifth miss in a row
        steps.extend([(answer, Seen::Dead); 3]); // three answers are not enough
        steps.push((miss, Seen::Dead));
        steps.extend([(answer, Seen::Dead); 3]);
        steps.push((answer, Seen::Alive)); // four in a row
        steps.extend([(miss, Seen::Alive); 4]);
        steps.push((answer, Seen::Alive)); // four misses, then an answer: never dead
        steps.extend([(miss, Seen::Alive); 4]);
        steps.push((miss, Seen::Dead));
        let mut sent = t.round(t0, &mut nonces);
        for (i, (answered, want)) in steps.iter().enumerate() {
            if *answered {
                let (name, nonce) = &sent[0];
                assert!(t.answered(&msg(true, *nonce, name, Some("a1"))));
            }
            sent = t.round(t0 + INTERVAL * (i as u32 + 1), &mut nonces);
            assert_eq!(seen(&t), *want, "after step {i}");
        }
    }

    #[test]
    fn a_stale_forged_or_unknown_reply_counts_for_nothing() {
        let mut t = Tracker::new();
        t.set_peers(["a1", "a3"]);
        let sent = t.round(Instant::now(), counter(0));
        let nonce = sent[0].1;
        assert!(
            !t.answered(&msg(true, nonce + 1000, "a1", None)),
            "wrong nonce"
        );
        assert!(
            !t.answered(&msg(false, nonce, "a1", None)),
            "a probe, not a reply"
        );
        assert!(!t.answered(&msg(true, nonce, "zz", None)), "not probed");
        assert!(t.answered(&msg(true, nonce, "a1", Some("a1"))));
        assert!(
            !t.answered(&msg(true, nonce, "a1", None)),
            "answered once only"
        );
        t.set_peers(["a3"]);
        assert_eq!(t.liveness().keys().collect::<Vec<_>>(), ["a3"]);
    }

    #[test]
    fn choices_are_those_of_peers_seen_alive() {
        let t0 = Instant::now();
        let mut t = Tracker::new();
        let mut nonces = counter(0);
        t.set_peers(["a2", "a3"]);
        for s in 0..ALIVE_AFTER {
            for (name, nonce) in t.round(t0 + INTERVAL * s, &mut nonces) {
                if name == "a2" || s == 0 {
                    t.answered(&msg(true, nonce, &name, Some("a3")));
                }
            }
        }
        t.round(t0 + INTERVAL * ALIVE_AFTER, &mut nonces);
        let c = t.choices();
        assert_eq!(c.get("a2").map(String::as_str), Some("a3"));
        assert!(!c.contains_key("a3"), "a3 answered once: not alive yet");
    }
}
