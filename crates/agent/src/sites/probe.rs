//! The probes' sockets (issue 29): a thread that answers the probes of this node's site
//! members on its underlay address (`sites.probePort`) and probes them every
//! [`probe::INTERVAL`]; the main loop reads the liveness view it keeps
//! ([`sticky_sites::probe::Tracker`]).
//!
//! Only members reach the decision (issue 34): every member has a socket of its own, bound to
//! this node's probe address with `SO_REUSEPORT` and connected to that member's, so the kernel
//! queues on it only what comes from that member's address and port. Nothing is bound for
//! anyone else: a flood from the internet, a pod or another LAN host lands in no queue of ours
//! (the kernel answers it with a rate-limited ICMP error), so it can neither fill the queue
//! that a member's probes and replies wait in nor take the thread's time. A packet that is not
//! a well-formed probe, or comes from another address than the socket's member, is dropped;
//! a reply counts only for the random nonce of the probe in flight.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrStorage, bind, connect, setsockopt, socket, sockopt,
};
use sticky_primitives::nofollow::unpredictable;
use sticky_sites::gateway::Liveness;
use sticky_sites::probe::{self, Message, Tracker};

/// The longest wait for a packet before the round's clock is looked at again.
const POLL_AT_MOST: Duration = Duration::from_millis(100);

/// What the main loop tells the thread and reads back.
#[derive(Debug, Default)]
struct Inner {
    /// Whom to probe, at which address.
    targets: BTreeMap<String, SocketAddr>,
    /// This node's active gateway for its site, said in replies.
    active: Option<String>,
    liveness: Liveness,
    choices: BTreeMap<String, String>,
    /// Why a member's socket could not be made, by member (said once by the main loop).
    failed: BTreeMap<String, String>,
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
    /// `underlay` the first time.
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
        let local = SocketAddr::new(ip, self.port);
        self.bound = Some(ip);
        let inner = self.inner.clone();
        let me = self.me.clone();
        std::thread::spawn(move || serve(local, &me, &inner));
        Some(format!(
            "sites: answering the site members' probes on {local}, probing every {} ms",
            probe::INTERVAL.as_millis()
        ))
    }

    /// The liveness view of the targets and the active gateway each target seen alive named.
    pub fn view(&self) -> (Liveness, BTreeMap<String, String>) {
        let i = self.lock();
        (i.liveness.clone(), i.choices.clone())
    }

    /// Members whose socket could not be made, with why (retried every round).
    pub fn failed(&self) -> BTreeMap<String, String> {
        self.lock().failed.clone()
    }
}

/// One member's socket.
struct Member {
    name: String,
    addr: SocketAddr,
    socket: UdpSocket,
}

/// A UDP socket on `local` that receives only what `peer` sends (see the module doc).
fn member_socket(local: SocketAddr, peer: SocketAddr) -> io::Result<UdpSocket> {
    let family = match local {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
    let fd = socket(family, SockType::Datagram, flags, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(local))?;
    connect(fd.as_raw_fd(), &SockaddrStorage::from(peer))?;
    Ok(UdpSocket::from(fd))
}

/// The members' sockets for `targets`: kept where the address is the same, made anew where
/// it is new or moved, closed where the member is gone. Failures by member.
fn keep_sockets(
    members: Vec<Member>,
    targets: &BTreeMap<String, SocketAddr>,
    local: SocketAddr,
) -> (Vec<Member>, BTreeMap<String, String>) {
    let mut by_name: BTreeMap<String, Member> =
        members.into_iter().map(|m| (m.name.clone(), m)).collect();
    let mut kept = Vec::new();
    let mut failed = BTreeMap::new();
    for (name, addr) in targets {
        if let Some(m) = by_name.remove(name).filter(|m| m.addr == *addr) {
            kept.push(m);
            continue;
        }
        match member_socket(local, *addr) {
            Ok(socket) => kept.push(Member {
                name: name.clone(),
                addr: *addr,
                socket,
            }),
            Err(e) => {
                failed.insert(name.clone(), format!("probes {local} -> {addr}: {e}"));
            }
        }
    }
    (kept, failed)
}

fn serve(local: SocketAddr, me: &str, inner: &Mutex<Inner>) {
    let lock = || inner.lock().unwrap_or_else(PoisonError::into_inner);
    let mut tracker = Tracker::new();
    let mut members: Vec<Member> = Vec::new();
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            next += probe::INTERVAL;
            if next < Instant::now() {
                next = Instant::now() + probe::INTERVAL;
            }
            let targets = lock().targets.clone();
            let failed;
            (members, failed) = keep_sockets(members, &targets, local);
            // Replies already queued count for this round's probes, not as missed.
            for m in &members {
                drain(m, me, &mut tracker, inner);
            }
            tracker.set_peers(targets.keys().map(String::as_str));
            for (name, nonce) in tracker.round(Instant::now(), unpredictable) {
                let Some(m) = members.iter().find(|m| m.name == name) else {
                    continue;
                };
                send(m, false, nonce, me, None);
            }
            let mut i = lock();
            i.failed = failed;
            publish(&tracker, &mut i);
        }
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(POLL_AT_MOST);
        let ready = wait_readable(&members, wait);
        for m in members
            .iter()
            .zip(ready)
            .filter_map(|(m, r)| r.then_some(m))
        {
            drain(m, me, &mut tracker, inner);
        }
    }
}

/// Which members' sockets have something to read, waiting at most `wait`.
fn wait_readable(members: &[Member], wait: Duration) -> Vec<bool> {
    if members.is_empty() {
        std::thread::sleep(wait);
        return Vec::new();
    }
    let mut fds: Vec<PollFd<'_>> = members
        .iter()
        .map(|m| PollFd::new(m.socket.as_fd(), PollFlags::POLLIN))
        .collect();
    let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::ZERO);
    if poll(&mut fds, timeout).is_err() {
        return vec![false; members.len()];
    }
    fds.iter()
        .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
        .collect()
}

/// Reads all that waits on `m`'s socket: answers its probes, counts its replies.
fn drain(m: &Member, me: &str, tracker: &mut Tracker, inner: &Mutex<Inner>) {
    let mut buf = [0u8; 600];
    loop {
        let (n, from) = match m.socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            // ECONNREFUSED (the member's port was closed) and the like: the probe is missed.
            Err(_) => continue,
        };
        // What the socket queued between its bind and its connect may be anyone's.
        if from != m.addr {
            continue;
        }
        let Ok(msg) = probe::decode(&buf[..n]) else {
            continue;
        };
        let mut i = inner.lock().unwrap_or_else(PoisonError::into_inner);
        if !msg.reply {
            send(m, true, msg.nonce, me, i.active.clone());
        } else if msg.name == m.name && tracker.answered(&msg) {
            publish(tracker, &mut i);
        }
    }
}

fn send(m: &Member, reply: bool, nonce: u64, me: &str, active: Option<String>) {
    let msg = Message {
        reply,
        nonce,
        name: me.to_string(),
        active,
    };
    if let Ok(b) = msg.encode() {
        // A send error (no route while a link is down) is a missed probe.
        let _ = m.socket.send(&b);
    }
}

fn publish(tracker: &Tracker, i: &mut Inner) {
    i.liveness = tracker.liveness();
    i.choices = tracker.choices();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel queues on a member's socket only that member's datagrams: another source
    /// sending to the same port reaches no socket of ours (loopback addresses, no root).
    #[test]
    fn a_member_socket_hears_only_its_member() {
        let member = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let probe_port = UdpSocket::bind("127.0.0.1:0").unwrap();
        let local = probe_port.local_addr().unwrap();
        drop(probe_port);
        let mine = member_socket(local, member.local_addr().unwrap()).unwrap();
        for _ in 0..100 {
            stranger.send_to(b"flood", local).unwrap();
        }
        member.send_to(b"hello", local).unwrap();
        mine.set_nonblocking(false).unwrap();
        mine.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        let (n, from) = mine.recv_from(&mut buf).unwrap();
        assert_eq!(
            (&buf[..n], from),
            (&b"hello"[..], member.local_addr().unwrap())
        );
        mine.set_nonblocking(true).unwrap();
        assert!(
            mine.recv_from(&mut buf).is_err(),
            "nothing of the stranger's"
        );
    }

    /// A probe from the member is answered on its socket, with this node's active gateway;
    /// a reply with the nonce in flight makes it count.
    #[test]
    fn a_probe_is_answered_and_a_reply_counted() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let local = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let m = Member {
            name: "a1".into(),
            addr: peer.local_addr().unwrap(),
            socket: member_socket(local, peer.local_addr().unwrap()).unwrap(),
        };
        let inner = Mutex::new(Inner {
            active: Some("a1".into()),
            ..Inner::default()
        });
        let mut tracker = Tracker::new();
        tracker.set_peers(["a1"]);
        let sent = tracker.round(Instant::now(), || 42);
        let ask = Message {
            reply: false,
            nonce: 7,
            name: "a1".into(),
            active: None,
        };
        peer.send_to(&ask.encode().unwrap(), local).unwrap();
        let answer = Message {
            reply: true,
            nonce: sent[0].1,
            name: "a1".into(),
            active: Some("a1".into()),
        };
        peer.send_to(&answer.encode().unwrap(), local).unwrap();
        // Alive after two answered rounds: the reply to 42 now, then one to 43.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut next_nonce = 43;
        while tracker.choices().is_empty() && Instant::now() < deadline {
            wait_readable(std::slice::from_ref(&m), Duration::from_millis(100));
            drain(&m, "a2", &mut tracker, &inner);
            if tracker.liveness()["a1"] != sticky_sites::gateway::Seen::Alive {
                let sent = tracker.round(Instant::now(), || next_nonce);
                next_nonce += 1;
                let again = Message {
                    nonce: sent[0].1,
                    ..answer.clone()
                };
                peer.send_to(&again.encode().unwrap(), local).unwrap();
            }
        }
        assert_eq!(tracker.choices().get("a1").map(String::as_str), Some("a1"));
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 600];
        let (n, _) = peer.recv_from(&mut buf).unwrap();
        let got = probe::decode(&buf[..n]).unwrap();
        assert!(got.reply && got.nonce == 7 && got.name == "a2");
        assert_eq!(got.active.as_deref(), Some("a1"));
    }
}
