//! A simulated `sticky-wg`: the device the agent's [`Device`] seam drives, and WireGuard's
//! timers as far as the decisions depend on them. A session needs a handshake that went both
//! ways through the network; a peer with an endpoint handshakes when it has something to send
//! (a persistent keepalive, data, a nudge) and no session, retrying every 5 s (REKEY_TIMEOUT);
//! a session is renewed after 120 s and dropped after 180 s; data sent with nothing received
//! for 15 s makes it handshake again; a received packet moves the peer's endpoint to where it
//! came from (roaming). As gotatun does, a peer whose allowed IPs are replaced is made anew:
//! no session, no handshake, no bytes.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use ipnet::IpNet;
use sticky_sites::keys::{PrivateKey, PublicKey};
use sticky_sites::relay::Id;
use sticky_sites::tunnel::{self, DeviceState, PeerChange, PeerState};

use crate::sites::device::{Device, Error};

/// WireGuard's timers.
pub const REKEY_AFTER: Duration = Duration::from_secs(120);
pub const REJECT_AFTER: Duration = Duration::from_secs(180);
pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
/// Data sent and nothing received for this long: handshake again (keepalive + rekey timeout).
pub const NEW_HANDSHAKE: Duration = Duration::from_secs(15);

/// What the simulation keeps of one peer beside what the device reports.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// The session's id and when it was made (simulated time); None: no session.
    pub id: Option<(u64, Duration)>,
    pub last_init: Option<Duration>,
    pub last_sent: Option<Duration>,
    /// Data went out since this time and nothing came back.
    pub unanswered_since: Option<Duration>,
    /// Something waits to be sent (a nudge, pod traffic).
    pub pending: bool,
}

/// One node's `sticky-wg` and its device.
#[derive(Debug, Default)]
pub struct Wg {
    /// The daemon runs (the device exists).
    pub running: bool,
    pub state: DeviceState,
    pub sessions: BTreeMap<PublicKey, Session>,
    pub routes: Vec<IpNet>,
    pub mtu: u32,
    /// Where a relay saw each peer come from (the punching candidates, `sticky_sites::relay`).
    pub candidates: HashMap<Id, SocketAddr>,
}

impl Wg {
    /// The daemon restarted: an empty device, every session gone.
    pub fn restart(&mut self) {
        *self = Wg {
            running: true,
            ..Wg::default()
        };
    }

    /// The peer with `key` and its session.
    pub fn peer(&mut self, key: &PublicKey) -> Option<(&mut PeerState, &mut Session)> {
        let p = self.state.peers.iter_mut().find(|p| p.public_key == *key)?;
        Some((p, self.sessions.entry(*key).or_default()))
    }

    /// The peer whose allowed IPs hold `dst`.
    pub fn route(&self, dst: std::net::IpAddr) -> Option<PublicKey> {
        self.state
            .peers
            .iter()
            .find(|p| p.allowed_ips.iter().any(|n| n.contains(&dst)))
            .map(|p| p.public_key)
    }

    fn take(&mut self, key: Option<&PrivateKey>, port: Option<u16>, changes: &[PeerChange]) {
        if let Some(k) = key
            && self.state.public_key != Some(k.public_key())
        {
            self.state.public_key = Some(k.public_key());
            self.sessions.clear();
        }
        if let Some(p) = port {
            self.state.listen_port = p;
        }
        for change in changes {
            match change {
                PeerChange::Remove(k) => {
                    self.sessions.remove(k);
                }
                PeerChange::Upsert {
                    peer,
                    replace_allowed_ips,
                } => self.upsert(peer, *replace_allowed_ips),
            }
        }
        tunnel::apply(&mut self.state, changes);
    }

    /// The session side of an upsert: a peer made anew loses its session and counters; a new
    /// peer with an endpoint and a keepalive sends one at once.
    fn upsert(&mut self, peer: &tunnel::PeerConfig, replace: bool) {
        let existing = self
            .state
            .peers
            .iter_mut()
            .find(|p| p.public_key == peer.public_key);
        match existing {
            Some(p) if replace => {
                p.last_handshake = None;
                p.rx_bytes = 0;
                p.tx_bytes = 0;
                self.sessions.insert(peer.public_key, Session::default());
            }
            Some(_) => {}
            None => {
                let s = Session {
                    pending: peer.keepalive_secs.is_some(),
                    ..Session::default()
                };
                self.sessions.insert(peer.public_key, s);
            }
        }
    }
}

/// The agent's [`Device`] on a simulated `sticky-wg`. `nudges` collects the datagrams the
/// agent sent into the tunnel, for the world to deliver.
#[derive(Debug, Clone, Default)]
pub struct SimDevice {
    pub wg: Rc<RefCell<Wg>>,
    pub nudges: Rc<RefCell<Vec<SocketAddr>>>,
}

impl SimDevice {
    fn running<T>(&self, ifname: &str, f: impl FnOnce(&mut Wg) -> T) -> Result<T, Error> {
        let mut wg = self.wg.borrow_mut();
        if !wg.running {
            return Err(Error::NoDevice(ifname.into()));
        }
        Ok(f(&mut wg))
    }
}

impl Device for SimDevice {
    fn ensure(&self, ifname: &str, mtu: u32) -> Result<(), Error> {
        self.running(ifname, |wg| wg.mtu = mtu)
    }

    fn get(&self, ifname: &str) -> Result<DeviceState, Error> {
        self.running(ifname, |wg| wg.state.clone())
    }

    fn set(
        &self,
        ifname: &str,
        key: Option<&PrivateKey>,
        port: Option<u16>,
        changes: &[PeerChange],
    ) -> Result<(), Error> {
        self.running(ifname, |wg| wg.take(key, port, changes))
    }

    fn routes(&self, ifname: &str, want: &[IpNet]) -> Result<(), Error> {
        self.running(ifname, |wg| wg.routes = want.to_vec())
    }

    fn nudge(&self, to: SocketAddr) -> Result<(), Error> {
        self.nudges.borrow_mut().push(to);
        Ok(())
    }
}
