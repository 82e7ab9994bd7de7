//! The probes: ICMP echoes this node sends and the peer's kernel answers (no agent, no
//! listener on the peer). To the peer's underlay address they go around the overlay (ICMPv6 on
//! an IPv6 underlay); to the peer's VTEP address (its pod subnet's network address, which its
//! VTEP holds as a /32) they go through it, from this node's VTEP address, with DF set, so the
//! size that crosses is the size sent.
//!
//! Every probe of every peer goes out at once from one socket of each family, and is sent
//! again for those not yet answered until the window closes: the time taken is the window's,
//! whatever the number of peers. Sending an echo changes nothing on the node.
//!
//! The socket is a raw one (root, `CAP_NET_RAW`), else the kernel's ping socket, which needs
//! no capability when the process's group is in `net.ipv4.ping_group_range` (systemd sets it
//! to every group): so the agent's periodic checks run under its unit's bounding set, which
//! leaves `CAP_NET_RAW` out. A ping socket's echoes carry the kernel's identifier, and only
//! the answers to them reach it.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, SockaddrIn6, bind,
    recvfrom, sendto, socket,
};

/// One echo to send: where, and how large the IP packet is (header included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub dst: IpAddr,
    pub size: u16,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "opening a raw {0} socket: {1}, and a ping socket: {2} (doctor needs CAP_NET_RAW, or its group in net.ipv4.ping_group_range)"
    )]
    Socket(&'static str, Errno, Errno),
    #[error("setting DF on the probe socket: {0}")]
    Df(Errno),
    #[error("binding the probe socket to {0}: {1}")]
    Bind(Ipv4Addr, Errno),
    #[error("waiting for answers: {0}")]
    Poll(Errno),
    #[error("{0} probes are more than one round can tell apart (at most 65536)")]
    TooMany(usize),
}

/// Sends probes and says which were answered.
pub trait Prober {
    /// One `bool` per probe, in order: whether it was answered within the window.
    fn run(&mut self, probes: &[Probe]) -> Result<Vec<bool>, Error>;
}

/// The probes as ICMP echoes on raw sockets of the current network namespace.
pub struct Icmp {
    /// How long answers are waited for.
    pub window: Duration,
    /// Unanswered probes are sent again this often within the window.
    pub resend: Duration,
    /// The source address of the IPv4 echoes; `None`: the route's. The sites probes leave
    /// from the node's VTEP address, which remote sites route back through their tunnels (the
    /// route into the tunnel device has no source of its own).
    pub source: Option<Ipv4Addr>,
}

impl Default for Icmp {
    fn default() -> Icmp {
        Icmp {
            window: Duration::from_millis(2500),
            resend: Duration::from_millis(600),
            source: None,
        }
    }
}

/// An ICMP echo header's size.
const ECHO_HEADER: u16 = 8;

/// What differs between the two families' echoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn of(ip: IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    fn ip_header(self) -> u16 {
        match self {
            Family::V4 => 20,
            Family::V6 => 40,
        }
    }

    /// The echo request's type (ICMP 8, ICMPv6 128).
    fn request(self) -> u8 {
        match self {
            Family::V4 => 8,
            Family::V6 => 128,
        }
    }

    /// The echo reply's type (ICMP 0, ICMPv6 129).
    fn reply(self) -> u8 {
        match self {
            Family::V4 => 0,
            Family::V6 => 129,
        }
    }
}

/// One family's socket and the probes that go out of it.
struct Lane {
    family: Family,
    fd: OwnedFd,
    /// A raw socket (our identifier on the echoes, IPv4 headers on what is read), not a ping
    /// socket.
    raw: bool,
}

impl Prober for Icmp {
    fn run(&mut self, probes: &[Probe]) -> Result<Vec<bool>, Error> {
        if probes.len() > usize::from(u16::MAX) + 1 {
            return Err(Error::TooMany(probes.len()));
        }
        let mut lanes = Vec::new();
        for family in [Family::V4, Family::V6] {
            if probes.iter().any(|p| Family::of(p.dst) == family) {
                lanes.push(open(family, self.source)?);
            }
        }
        // The low bits of the pid tell this run's answers from another ping's.
        let id = (std::process::id() & 0xffff) as u16;
        let mut answered = vec![false; probes.len()];
        let start = Instant::now();
        let mut next_send = start;
        let mut buf = vec![0u8; 65536];
        while start.elapsed() < self.window {
            if Instant::now() >= next_send {
                for lane in &lanes {
                    send_unanswered(lane, id, probes, &answered);
                }
                next_send += self.resend;
            }
            let until = next_send.min(start + self.window);
            let wait = until.saturating_duration_since(Instant::now());
            let ms = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
            let mut fds: Vec<PollFd> = lanes
                .iter()
                .map(|l| PollFd::new(l.fd.as_fd(), PollFlags::POLLIN))
                .collect();
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(Error::Poll(e)),
            }
            for lane in &lanes {
                read_answers(lane, id, probes, &mut answered, &mut buf);
            }
        }
        Ok(answered)
    }
}

/// Sets an integer socket option.
fn set_int(fd: &OwnedFd, level: i32, name: i32, value: nix::libc::c_int) -> Result<(), Errno> {
    // SAFETY: `fd` is an open socket; the option value is a c_int that lives across the call
    // and its size is passed with it.
    let rc = unsafe {
        nix::libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            std::mem::size_of::<nix::libc::c_int>() as nix::libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(Errno::last()) }
}

/// A raw socket of `family`, else a ping socket (see the module doc).
fn open(family: Family, source: Option<Ipv4Addr>) -> Result<Lane, Error> {
    use nix::libc;
    let (domain, protocol, name) = match family {
        Family::V4 => (AddressFamily::Inet, SockProtocol::Icmp, "ICMP"),
        Family::V6 => (AddressFamily::Inet6, SockProtocol::IcmpV6, "ICMPv6"),
    };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let (fd, raw) = match socket(domain, SockType::Raw, flags, protocol) {
        Ok(fd) => (fd, true),
        Err(raw) => socket(domain, SockType::Datagram, flags, protocol)
            .map(|fd| (fd, false))
            .map_err(|ping| Error::Socket(name, raw, ping))?,
    };
    // DF on every probe and no fragmenting by this node, whatever path MTU it has cached:
    // the size sent is the size that must cross. (The kernel fills in an ICMPv6 checksum.)
    match family {
        Family::V4 => set_int(
            &fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_PROBE,
        ),
        Family::V6 => set_int(
            &fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_PROBE,
        )
        .and_then(|()| set_int(&fd, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1)),
    }
    .map_err(Error::Df)?;
    if let (Family::V4, Some(src)) = (family, source) {
        let at = SockaddrIn::from(SocketAddrV4::new(src, 0));
        bind(fd.as_raw_fd(), &at).map_err(|e| Error::Bind(src, e))?;
    }
    Ok(Lane { family, fd, raw })
}

/// Sends every probe of the lane's family not yet answered. A send the kernel refuses (no
/// route, larger than the device's MTU, a full queue) is a probe not answered: it is tried
/// again at the next round.
fn send_unanswered(lane: &Lane, id: u16, probes: &[Probe], answered: &[bool]) {
    let fd = lane.fd.as_raw_fd();
    for (seq, probe) in probes.iter().enumerate() {
        if answered[seq] || Family::of(probe.dst) != lane.family {
            continue;
        }
        let len = probe.size.saturating_sub(lane.family.ip_header());
        let packet = echo(lane.family.request(), id, seq as u16, len);
        let _ = match probe.dst {
            IpAddr::V4(ip) => sendto(
                fd,
                &packet,
                &SockaddrIn::from(SocketAddrV4::new(ip, 0)),
                MsgFlags::empty(),
            ),
            IpAddr::V6(ip) => sendto(
                fd,
                &packet,
                &SockaddrIn6::from(SocketAddrV6::new(ip, 0, 0, 0)),
                MsgFlags::empty(),
            ),
        };
    }
}

/// Marks the probes whose echo reply has come (from the address it was sent to).
fn read_answers(lane: &Lane, id: u16, probes: &[Probe], answered: &mut [bool], buf: &mut [u8]) {
    let fd = lane.fd.as_raw_fd();
    loop {
        let read = match lane.family {
            Family::V4 => recvfrom::<SockaddrIn>(fd, buf)
                .map(|(n, from)| (n, from.map(|a| IpAddr::V4(a.ip())))),
            Family::V6 => recvfrom::<SockaddrIn6>(fd, buf)
                .map(|(n, from)| (n, from.map(|a| IpAddr::V6(a.ip())))),
        };
        let Ok((n, from)) = read else { break };
        // Only a raw IPv4 socket hands over the IP header; only on a raw socket is the
        // identifier ours (a ping socket's is the kernel's, and it delivers only its answers).
        let message = match (lane.family, lane.raw) {
            (Family::V4, true) => without_ipv4_header(&buf[..n]),
            _ => Some(&buf[..n]),
        };
        let ours = lane.raw.then_some(id);
        if let Some(seq) = message.and_then(|m| reply(m, lane.family.reply(), ours))
            && let Some(p) = probes.get(usize::from(seq))
            && Some(p.dst) == from
        {
            answered[usize::from(seq)] = true;
        }
    }
}

/// An ICMP or ICMPv6 echo request (`kind`) of `len` bytes (header included, at least 8). Its
/// checksum is the ICMP one; on an ICMPv6 socket the kernel writes its own over it.
pub(crate) fn echo(kind: u8, id: u16, seq: u16, len: u16) -> Vec<u8> {
    let mut p = vec![0u8; usize::from(len.max(ECHO_HEADER))];
    p[0] = kind;
    p[4..6].copy_from_slice(&id.to_be_bytes());
    p[6..8].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in p.iter_mut().enumerate().skip(8) {
        *b = i as u8;
    }
    if kind == Family::V4.request() {
        let sum = checksum(&p);
        p[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    p
}

/// The Internet checksum (RFC 1071).
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// What follows the header of a raw IPv4 packet.
fn without_ipv4_header(packet: &[u8]) -> Option<&[u8]> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    packet.get(ihl..)
}

/// The sequence number of an echo reply (of type `kind`) with the identifier `id` (any when
/// `None`), from an ICMP or ICMPv6 message.
pub(crate) fn reply(icmp: &[u8], kind: u8, id: Option<u16>) -> Option<u16> {
    let icmp = icmp.get(..8)?;
    let is_ours =
        icmp[0] == kind && icmp[1] == 0 && id.is_none_or(|id| icmp[4..6] == id.to_be_bytes());
    is_ours.then(|| u16::from_be_bytes([icmp[6], icmp[7]]))
}

/// A prober that answers as told and remembers what it was asked.
#[cfg(test)]
pub(crate) struct Fake<F: Fn(&Probe) -> bool> {
    pub answers: F,
    pub sent: Vec<Probe>,
}

#[cfg(test)]
impl<F: Fn(&Probe) -> bool> Prober for Fake<F> {
    fn run(&mut self, probes: &[Probe]) -> Result<Vec<bool>, Error> {
        self.sent.extend_from_slice(probes);
        Ok(probes.iter().map(&self.answers).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_has_its_size_id_sequence_and_a_checksum_that_verifies() {
        let p = echo(8, 0x1234, 7, 64);
        assert_eq!(p.len(), 64);
        assert_eq!((p[0], &p[4..8]), (8, &[0x12, 0x34, 0, 7][..]));
        assert_eq!(checksum(&p), 0, "a packet with its checksum sums to zero");
        assert_eq!(echo(8, 1, 1, 3).len(), 8, "never shorter than the header");
    }

    #[test]
    fn only_echo_replies_with_our_id_count() {
        let mut packet = vec![0x45u8; 20];
        packet.extend_from_slice(&echo(8, 0x1234, 5, 8));
        packet[20] = 0; // echo reply
        let icmp = without_ipv4_header(&packet).unwrap();
        assert_eq!(reply(icmp, 0, Some(0x1234)), Some(5));
        assert_eq!(reply(icmp, 0, Some(0x4321)), None, "another ping's");
        assert_eq!(
            reply(icmp, 0, None),
            Some(5),
            "a ping socket's: the kernel's id"
        );
        packet[20] = 8;
        let icmp = without_ipv4_header(&packet).unwrap();
        assert_eq!(reply(icmp, 0, Some(0x1234)), None, "a request");
        assert_eq!(reply(&packet[20..24], 0, Some(0x1234)), None, "cut short");
    }

    #[test]
    fn icmpv6_echoes_and_replies_are_told_apart_by_type_and_id() {
        let p = echo(128, 0x1234, 9, 44);
        assert_eq!(
            (p.len(), p[0], &p[2..4]),
            (44, 128, &[0, 0][..]),
            "the kernel sums it"
        );
        let mut answer = p.clone();
        answer[0] = 129;
        assert_eq!(reply(&answer, 129, Some(0x1234)), Some(9));
        assert_eq!(reply(&answer, 129, Some(0x4321)), None, "another ping's");
        assert_eq!(reply(&p, 129, Some(0x1234)), None, "a request");
        assert_eq!(reply(&answer[..6], 129, Some(0x1234)), None, "cut short");
    }
}
