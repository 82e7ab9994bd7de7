//! One blocking rtnetlink socket: request/ack, dumps, and the kernel's errno kept intact.
//!
//! Every request carries a fresh sequence number; replies with another number (late answers
//! to an earlier request) are skipped. A request ends at its ACK or `NLMSG_ERROR`, a dump at
//! `NLMSG_DONE`. A dump the kernel flags as interrupted (`NLM_F_DUMP_INTR`: the table changed
//! while it was being read) is started again, a few times at most.

use std::io;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{SocketAddr, protocols::NETLINK_ROUTE};

/// How many times an interrupted dump is started again before giving up.
const DUMP_ATTEMPTS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening a netlink socket: {0}")]
    Open(#[source] io::Error),
    #[error("sending {what} over netlink: {source}")]
    Send {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("receiving the reply to {what} over netlink: {source}")]
    Recv {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("decoding the kernel's reply to {what}: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("{what}: the kernel refused it: {} (errno {errno})", io::Error::from_raw_os_error(*errno))]
    Kernel { what: &'static str, errno: i32 },
    #[error("{what}: the dump was interrupted {DUMP_ATTEMPTS} times in a row")]
    Interrupted { what: &'static str },
}

impl Error {
    /// The kernel's errno (positive, e.g. `EEXIST`) when the kernel refused the request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    pub fn is(&self, errno: nix::errno::Errno) -> bool {
        self.errno() == Some(errno as i32)
    }
}

/// A blocking `NETLINK_ROUTE` socket, bound in the network namespace of the thread that opened
/// it (it keeps working there whatever thread uses it later).
pub struct Socket {
    sock: netlink_sys::Socket,
    seq: u32,
}

/// What the reply loop saw for one request.
#[derive(Debug)]
enum Outcome {
    Complete(Vec<RouteNetlinkMessage>),
    Interrupted,
}

impl Socket {
    pub fn open() -> Result<Socket, Error> {
        let mut sock = netlink_sys::Socket::new(NETLINK_ROUTE).map_err(Error::Open)?;
        sock.bind_auto().map_err(Error::Open)?;
        sock.connect(&SocketAddr::new(0, 0)).map_err(Error::Open)?;
        // Extended acks are a nicety; an old kernel without them still works.
        let _ = sock.set_ext_ack(true);
        // Strict checking (Linux 4.20+) makes the kernel apply the filters a dump request
        // carries (one interface's FDB, the main table's routes) instead of dumping it all;
        // every caller filters what it gets again, so an older kernel gives the same answers.
        let _ = sock.set_netlink_get_strict_chk(true);
        Ok(Socket { sock, seq: 0 })
    }

    /// Sends a request that changes something (`flags` such as `NLM_F_CREATE`) and waits for
    /// its ACK. Returns the messages the kernel sent before the ACK (e.g. for a GET).
    pub fn request(
        &mut self,
        what: &'static str,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, Error> {
        match self.exchange(what, message, NLM_F_REQUEST | NLM_F_ACK | flags, false)? {
            Outcome::Complete(found) => Ok(found),
            Outcome::Interrupted => Err(Error::Interrupted { what }),
        }
    }

    /// Dumps a table, starting again if the kernel says the dump was interrupted.
    pub fn dump(
        &mut self,
        what: &'static str,
        message: RouteNetlinkMessage,
    ) -> Result<Vec<RouteNetlinkMessage>, Error> {
        for _ in 0..DUMP_ATTEMPTS {
            let flags = NLM_F_REQUEST | NLM_F_DUMP;
            if let Outcome::Complete(found) = self.exchange(what, message.clone(), flags, true)? {
                return Ok(found);
            }
        }
        Err(Error::Interrupted { what })
    }

    fn exchange(
        &mut self,
        what: &'static str,
        message: RouteNetlinkMessage,
        flags: u16,
        dump: bool,
    ) -> Result<Outcome, Error> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = encode(message, flags, seq);
        self.sock
            .send(&bytes, 0)
            .map_err(|source| Error::Send { what, source })?;
        let mut replies = Replies::new(what, seq, dump);
        loop {
            let (datagram, _) = self
                .sock
                .recv_from_full()
                .map_err(|source| Error::Recv { what, source })?;
            for reply in decode_all(&datagram).map_err(|reason| Error::Decode { what, reason })? {
                if let Some(outcome) = replies.feed(reply)? {
                    return Ok(outcome);
                }
            }
        }
    }
}

/// Collects the replies to one request; pure, so the protocol rules are unit-tested.
struct Replies {
    what: &'static str,
    seq: u32,
    dump: bool,
    found: Vec<RouteNetlinkMessage>,
    interrupted: bool,
}

impl Replies {
    fn new(what: &'static str, seq: u32, dump: bool) -> Replies {
        Replies {
            what,
            seq,
            dump,
            found: Vec::new(),
            interrupted: false,
        }
    }

    /// Takes one reply; `Some` once the request is over.
    fn feed(
        &mut self,
        reply: NetlinkMessage<RouteNetlinkMessage>,
    ) -> Result<Option<Outcome>, Error> {
        if reply.header.sequence_number != self.seq {
            // A late answer to an earlier request.
            return Ok(None);
        }
        self.interrupted |= reply.header.flags & NLM_F_DUMP_INTR != 0;
        match reply.payload {
            NetlinkPayload::InnerMessage(inner) => self.found.push(inner),
            NetlinkPayload::Error(err) => match err.code {
                None if !self.dump => {
                    return Ok(Some(Outcome::Complete(std::mem::take(&mut self.found))));
                }
                None => {}
                Some(code) => {
                    return Err(Error::Kernel {
                        what: self.what,
                        errno: code.get().abs(),
                    });
                }
            },
            NetlinkPayload::Done(_) => {
                return Ok(Some(if self.interrupted {
                    Outcome::Interrupted
                } else {
                    Outcome::Complete(std::mem::take(&mut self.found))
                }));
            }
            _ => {}
        }
        Ok(None)
    }
}

/// Serializes one request with the given flags and sequence number.
pub fn encode(message: RouteNetlinkMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

/// Splits one datagram into its netlink messages.
pub fn decode_all(datagram: &[u8]) -> Result<Vec<NetlinkMessage<RouteNetlinkMessage>>, String> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < datagram.len() {
        let rest = &datagram[offset..];
        let len = NetlinkBuffer::new_checked(rest)
            .map_err(|e| e.to_string())?
            .length() as usize;
        let end = len.min(rest.len());
        out.push(NetlinkMessage::deserialize(&rest[..end]).map_err(|e| e.to_string())?);
        // Messages are padded to 4 bytes.
        offset += (len + 3) & !3;
        if len == 0 {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{DoneMessage, ErrorMessage};
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};
    use std::num::NonZeroI32;

    #[test]
    fn encode_sets_header_fields_and_length() {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName("eth0".into()));
        let bytes = encode(RouteNetlinkMessage::GetLink(msg), NLM_F_REQUEST, 42);
        let parsed = decode_all(&bytes).unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].header.sequence_number, 42);
        assert_eq!(parsed[0].header.length as usize, bytes.len());
        assert_eq!(parsed[0].header.message_type, 18, "RTM_GETLINK");
    }

    #[test]
    fn decode_splits_a_multipart_datagram() {
        let mut bytes = encode(
            RouteNetlinkMessage::NewLink(LinkMessage::default()),
            NLM_F_REQUEST,
            7,
        );
        let mut header = NetlinkHeader::default();
        header.sequence_number = 7;
        let mut done = NetlinkMessage::<RouteNetlinkMessage>::new(
            header,
            NetlinkPayload::Done(DoneMessage::default()),
        );
        done.finalize();
        let mut tail = vec![0; done.buffer_len()];
        done.serialize(&mut tail);
        bytes.extend(tail);
        let parsed = decode_all(&bytes).unwrap();
        assert_eq!(parsed.len(), 2);
        assert!(matches!(parsed[1].payload, NetlinkPayload::Done(_)));
    }

    fn reply(
        seq: u32,
        flags: u16,
        payload: NetlinkPayload<RouteNetlinkMessage>,
    ) -> NetlinkMessage<RouteNetlinkMessage> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        header.flags = flags;
        NetlinkMessage::new(header, payload)
    }

    fn link() -> NetlinkPayload<RouteNetlinkMessage> {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(LinkMessage::default()))
    }

    fn ack(code: i32) -> NetlinkPayload<RouteNetlinkMessage> {
        let mut err = ErrorMessage::default();
        err.code = NonZeroI32::new(code);
        NetlinkPayload::Error(err)
    }

    #[test]
    fn request_ends_at_ack_and_skips_other_sequence_numbers() {
        let mut r = Replies::new("t", 5, false);
        assert!(
            r.feed(reply(4, 0, link())).unwrap().is_none(),
            "late reply skipped"
        );
        assert!(r.feed(reply(5, 0, link())).unwrap().is_none());
        let Some(Outcome::Complete(found)) = r.feed(reply(5, 0, ack(0))).unwrap() else {
            panic!("ack must end the request")
        };
        assert_eq!(found.len(), 1, "only the reply with our sequence number");
    }

    #[test]
    fn nack_keeps_the_errno() {
        let mut r = Replies::new("t", 1, false);
        let err = r.feed(reply(1, 0, ack(-17))).unwrap_err();
        assert_eq!(err.errno(), Some(17));
        assert!(err.to_string().contains("errno 17"), "{err}");
    }

    #[test]
    fn dump_is_multipart_until_done_and_reports_interruption() {
        let multi = netlink_packet_core::NLM_F_MULTIPART;
        let mut r = Replies::new("t", 2, true);
        assert!(r.feed(reply(2, multi, link())).unwrap().is_none());
        assert!(r.feed(reply(2, multi, link())).unwrap().is_none());
        let done = NetlinkPayload::Done(DoneMessage::default());
        let Some(Outcome::Complete(found)) = r.feed(reply(2, multi, done.clone())).unwrap() else {
            panic!("done must end the dump")
        };
        assert_eq!(found.len(), 2);

        let mut r = Replies::new("t", 3, true);
        assert!(
            r.feed(reply(3, multi | NLM_F_DUMP_INTR, link()))
                .unwrap()
                .is_none()
        );
        assert!(matches!(
            r.feed(reply(3, multi, done)).unwrap(),
            Some(Outcome::Interrupted)
        ));
    }
}
