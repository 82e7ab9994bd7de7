//! A network namespace's conntrack table filled to its maximum, for the `conntrack-full` test.
//!
//! `nf_conntrack_max` is the machine's and read-only inside a namespace, but the count it is
//! compared with is the namespace's own: so the test fills its node's table up to the machine's
//! maximum and touches nothing else. The entries are UDP flows between addresses of
//! 198.18.0.0/15 (no packet is sent) marked assured, which the kernel never evicts to make
//! room: as on a node flooded by real flows, every new flow is then dropped.
//!
//! They are created through ctnetlink, in batches with an acknowledgement each: conntrack-tools
//! is not installed here, and no crate speaks ctnetlink. The entries die with the namespace.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    socket,
};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_TIMEOUT: u16 = 7;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
/// `IPS_SEEN_REPLY | IPS_ASSURED`: an established flow, not evicted when the table is full;
/// and `IPS_CONFIRMED`, which the kernel sets on an entry it creates before it applies the
/// status asked for (any other is a change it refuses: EBUSY).
const STATUS_ASSURED: u32 = 2 | 4 | 8;
const UDP: u8 = 17;
/// Messages a batch: their acknowledgements (a socket buffer each, about 1 KiB of the
/// receive buffer's 208 KiB) fit the socket's receive buffer.
const BATCH: u32 = 100;

/// Fills the conntrack table of the namespace at `netns` until the kernel refuses an entry
/// (the table is full); returns how many were added and the kernel's refusal.
pub fn fill(netns: &Path) -> (u32, std::io::Error) {
    sticky_netlink::netns::run_in(netns, || {
        let sock = open();
        let mut added = 0u32;
        loop {
            let mut batch = Vec::new();
            for i in added..added + BATCH {
                batch.extend(new_flow(i));
            }
            send(sock.as_raw_fd(), &batch, MsgFlags::empty()).expect("send to ctnetlink");
            let (ok, refused) = acks(&sock, BATCH);
            added += ok;
            if let Some(e) = refused {
                return (added, e);
            }
        }
    })
    .expect("enter the node's namespace")
}

/// Empties the conntrack table of the namespace at `netns` (what `conntrack -F` does).
pub fn flush(netns: &Path) {
    sticky_netlink::netns::run_in(netns, || {
        let sock = open();
        let mut m = header(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, 0);
        finish(&mut m);
        send(sock.as_raw_fd(), &m, MsgFlags::empty()).expect("send to ctnetlink");
        let (ok, refused) = acks(&sock, 1);
        assert_eq!((ok, refused.map(|e| e.to_string())), (1, None), "flush");
    })
    .expect("enter the node's namespace");
}

fn open() -> OwnedFd {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .expect("a netfilter netlink socket");
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).expect("bind the netlink socket");
    fd
}

/// Reads `n` acknowledgements: how many said yes, and the first refusal.
fn acks(sock: &OwnedFd, n: u32) -> (u32, Option<std::io::Error>) {
    let (mut seen, mut ok, mut refused) = (0, 0, None);
    let mut buf = vec![0u8; 1 << 20];
    while seen < n {
        let len = recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()).expect("read ctnetlink");
        let mut at = 0;
        while at + 16 <= len {
            let size = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if kind == NLMSG_ERROR {
                seen += 1;
                let code = i32::from_ne_bytes(buf[at + 16..at + 20].try_into().expect("4 bytes"));
                if code == 0 {
                    ok += 1;
                } else if refused.is_none() {
                    refused = Some(std::io::Error::from_raw_os_error(-code));
                }
            }
            at += size.max(16).next_multiple_of(4);
        }
    }
    (ok, refused)
}

/// Flow `i`: 198.18.x.y:1 → 198.19.x.y:2, UDP, both directions seen, an hour to live.
fn new_flow(i: u32) -> Vec<u8> {
    let low = i & 0xffff;
    let high = (i >> 16) & 0x1;
    let src = Ipv4Addr::from(0xc612_0000 | (high << 16) | low);
    let dst = Ipv4Addr::from(0xc613_0000 | (high << 16) | low);
    let port_base = 1 + (i >> 17) as u16;
    let mut m = header(
        IPCTNL_MSG_CT_NEW,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        i,
    );
    m.extend(nested(CTA_TUPLE_ORIG, &tuple(src, dst, port_base, 2)));
    m.extend(nested(CTA_TUPLE_REPLY, &tuple(dst, src, 2, port_base)));
    m.extend(attr(CTA_STATUS, &STATUS_ASSURED.to_be_bytes()));
    m.extend(attr(CTA_TIMEOUT, &3600u32.to_be_bytes()));
    finish(&mut m);
    m
}

fn tuple(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut ip = attr(CTA_IP_V4_SRC, &src.octets());
    ip.extend(attr(CTA_IP_V4_DST, &dst.octets()));
    let mut proto = attr(CTA_PROTO_NUM, &[UDP]);
    proto.extend(attr(CTA_PROTO_SRC_PORT, &sport.to_be_bytes()));
    proto.extend(attr(CTA_PROTO_DST_PORT, &dport.to_be_bytes()));
    let mut t = nested(CTA_TUPLE_IP, &ip);
    t.extend(nested(CTA_TUPLE_PROTO, &proto));
    t
}

/// A netlink header (its length filled in by [`finish`]) and the nfnetlink one (IPv4).
fn header(kind: u16, flags: u16, seq: u32) -> Vec<u8> {
    let mut m = vec![0u8; 4];
    m.extend(((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
    m.extend(flags.to_ne_bytes());
    m.extend(seq.to_ne_bytes());
    m.extend(0u32.to_ne_bytes());
    m.extend([nix::libc::AF_INET as u8, 0, 0, 0]);
    m
}

fn finish(m: &mut [u8]) {
    let len = m.len() as u32;
    m[..4].copy_from_slice(&len.to_ne_bytes());
}

fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut a = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
    a.extend(kind.to_ne_bytes());
    a.extend(value);
    a.resize(a.len().next_multiple_of(4), 0);
    a
}

fn nested(kind: u16, inner: &[u8]) -> Vec<u8> {
    attr(kind | NLA_F_NESTED, inner)
}
