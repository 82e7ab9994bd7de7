//! The probes' socket (issue 29): a thread that answers probes on this node's underlay
//! address (`sites.probePort`) and probes its targets every [`probe::INTERVAL`]; the main loop
//! reads the liveness view it keeps ([`sticky_sites::probe::Tracker`]). A packet that is not a
//! well-formed probe, or a reply from an address other than the probed one's, is dropped.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sticky_sites::gateway::Liveness;
use sticky_sites::probe::{self, Message, Tracker};

/// What the main loop tells the thread and reads back.
#[derive(Debug, Default)]
struct Inner {
    /// Whom to probe, at which address.
    targets: BTreeMap<String, SocketAddr>,
    /// This node's active gateway for its site, said in replies.
    active: Option<String>,
    liveness: Liveness,
    choices: BTreeMap<String, String>,
}

/// See the module doc.
pub struct Probes {
    me: String,
    port: u16,
    inner: Arc<Mutex<Inner>>,
    /// The address the thread serves on, once started.
    bound: Option<IpAddr>,
}

impl Probes {
    pub fn new(me: &str, port: u16) -> Probes {
        Probes {
            me: me.to_string(),
            port,
            inner: Arc::default(),
            bound: None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the targets and the active gateway said in replies; starts the thread on
    /// `underlay` the first time (the log line if that failed: tried again at the next call).
    pub fn set(
        &mut self,
        underlay: Option<IpAddr>,
        targets: BTreeMap<String, SocketAddr>,
        active: Option<String>,
    ) -> Option<String> {
        {
            let mut i = self.lock();
            i.targets = targets;
            i.active = active;
        }
        let (None, Some(ip)) = (self.bound, underlay) else {
            return None;
        };
        let addr = SocketAddr::new(ip, self.port);
        let socket = match UdpSocket::bind(addr) {
            Ok(s) => s,
            Err(e) => return Some(format!("sites: probes on {addr}: {e}; tried again")),
        };
        if let Err(e) = socket.set_read_timeout(Some(Duration::from_millis(100))) {
            return Some(format!("sites: probes on {addr}: {e}; tried again"));
        }
        self.bound = Some(ip);
        let inner = self.inner.clone();
        let me = self.me.clone();
        let seed = u64::from(std::process::id()) << 32
            ^ u64::from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos()),
            );
        std::thread::spawn(move || serve(&socket, &me, &inner, Tracker::new(seed)));
        Some(format!(
            "sites: answering probes on {addr}, probing every {} s",
            probe::INTERVAL.as_secs()
        ))
    }

    /// The liveness view of the targets and the active gateway each target seen alive named.
    pub fn view(&self) -> (Liveness, BTreeMap<String, String>) {
        let i = self.lock();
        (i.liveness.clone(), i.choices.clone())
    }
}

fn serve(socket: &UdpSocket, me: &str, inner: &Mutex<Inner>, mut tracker: Tracker) {
    let lock = || inner.lock().unwrap_or_else(PoisonError::into_inner);
    let mut next = Instant::now();
    let mut buf = [0u8; 600];
    let mut targets = BTreeMap::new();
    loop {
        if Instant::now() >= next {
            next += probe::INTERVAL;
            if next < Instant::now() {
                next = Instant::now() + probe::INTERVAL;
            }
            targets.clone_from(&lock().targets);
            tracker.set_peers(targets.keys().map(String::as_str));
            for (name, nonce) in tracker.round(Instant::now()) {
                let Some(to) = targets.get(&name) else {
                    continue;
                };
                let msg = Message {
                    reply: false,
                    nonce,
                    name: me.to_string(),
                    active: None,
                };
                if let Ok(b) = msg.encode() {
                    // A send error (no route while a link is down) is a missed probe.
                    let _ = socket.send_to(&b, to);
                }
            }
            publish(&tracker, &mut lock());
        }
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let Ok(msg) = probe::decode(&buf[..n]) else {
            continue;
        };
        if !msg.reply {
            let active = lock().active.clone();
            let reply = Message {
                reply: true,
                nonce: msg.nonce,
                name: me.to_string(),
                active,
            };
            if let Ok(b) = reply.encode() {
                let _ = socket.send_to(&b, from);
            }
        } else if targets.get(&msg.name).map(SocketAddr::ip) == Some(from.ip())
            && tracker.answered(&msg)
        {
            publish(&tracker, &mut lock());
        }
    }
}

fn publish(tracker: &Tracker, i: &mut Inner) {
    i.liveness = tracker.liveness();
    i.choices = tracker.choices();
}
