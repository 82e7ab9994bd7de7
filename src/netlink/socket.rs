//! One blocking rtnetlink socket: request/ack, dumps, and the kernel's errno kept intact.
//!
//! Every request carries a fresh sequence number; replies with another number (late answers
//! to an earlier request) are skipped. A request ends at its ACK or `NLMSG_ERROR`, a dump at
//! `NLMSG_DONE`. A dump the kernel flags as interrupted (`NLM_F_DUMP_INTR`: the table changed
//! while it was being read) is started again, a few times at most.

use std::io;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP,
    NLMSG_OVERRUN, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    ParseableParametrized,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{SocketAddr, protocols::NETLINK_ROUTE};

use super::decode;

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
    #[error("decoding the kernel's reply to {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: decode::Error,
    },
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
    /// The receive buffer, kept from one datagram to the next.
    buf: Vec<u8>,
}

/// How much is asked for per datagram. The kernel sizes a dump's datagrams after what its
/// reader asks for (up to 32 KiB): asking for a page would get one link per datagram.
const RECV_SIZE: usize = 32 * 1024;

/// How one message of a reply reads, as far as the reply loop is concerned.
#[derive(Debug)]
enum Reply<T> {
    /// A message of the request's kind (a dumped entry, a GET's answer), as the caller's
    /// parser made it (`None`: not one it keeps).
    Inner(Option<T>),
    /// `NLMSG_ERROR`: 0 acknowledges, anything else is the negative errno.
    Error(i32),
    Done,
    Other,
}

/// One message of a datagram: its sequence number, flags and what it says.
#[derive(Debug)]
struct Message<T> {
    seq: u32,
    flags: u16,
    reply: Reply<T>,
}

/// What the reply loop saw for one request.
#[derive(Debug)]
enum Outcome<T> {
    Complete(Vec<T>),
    Interrupted,
}

/// Turns one reply message's payload (after the netlink header) of the given type into `T`,
/// or `None` to skip it.
type Parse<'a, T> = dyn FnMut(u16, &[u8]) -> Result<Option<T>, decode::Error> + 'a;

/// Parses every reply as a [`RouteNetlinkMessage`].
fn typed(message_type: u16, payload: &[u8]) -> Result<Option<RouteNetlinkMessage>, decode::Error> {
    RouteNetlinkMessage::parse_with_param(payload, message_type)
        .map(Some)
        .map_err(|source| decode::Error::Message {
            message_type,
            source,
        })
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
        Ok(Socket {
            sock,
            seq: 0,
            buf: Vec::new(),
        })
    }

    /// Sends a request that changes something (`flags` such as `NLM_F_CREATE`) and waits for
    /// its ACK. Returns the messages the kernel sent before the ACK (e.g. for a GET).
    pub fn request(
        &mut self,
        what: &'static str,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, Error> {
        self.request_with(what, message, flags, &mut typed)
    }

    /// [`Socket::request`], with each reply message's payload read by `parse` (a caller that
    /// needs a few fields of a large message need not decode all of it).
    pub fn request_with<T>(
        &mut self,
        what: &'static str,
        message: RouteNetlinkMessage,
        flags: u16,
        parse: &mut Parse<'_, T>,
    ) -> Result<Vec<T>, Error> {
        match self.exchange(
            what,
            &message,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            false,
            parse,
        )? {
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
        self.dump_with(what, message, &mut typed)
    }

    /// [`Socket::dump`], with each entry's payload read by `parse`.
    pub fn dump_with<T>(
        &mut self,
        what: &'static str,
        message: RouteNetlinkMessage,
        parse: &mut Parse<'_, T>,
    ) -> Result<Vec<T>, Error> {
        for _ in 0..DUMP_ATTEMPTS {
            let flags = NLM_F_REQUEST | NLM_F_DUMP;
            if let Outcome::Complete(found) = self.exchange(what, &message, flags, true, parse)? {
                return Ok(found);
            }
        }
        Err(Error::Interrupted { what })
    }

    fn exchange<T>(
        &mut self,
        what: &'static str,
        message: &RouteNetlinkMessage,
        flags: u16,
        dump: bool,
        parse: &mut Parse<'_, T>,
    ) -> Result<Outcome<T>, Error> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = encode(message.clone(), flags, seq);
        self.sock
            .send(&bytes, 0)
            .map_err(|source| Error::Send { what, source })?;
        let mut replies = Replies::new(what, seq, dump);
        loop {
            self.receive()
                .map_err(|source| Error::Recv { what, source })?;
            for reply in
                decode_with(&self.buf, parse).map_err(|source| Error::Decode { what, source })?
            {
                if let Some(outcome) = replies.feed(reply)? {
                    return Ok(outcome);
                }
            }
        }
    }

    /// Reads the next datagram, whole, into `self.buf`: its size is peeked first, so a
    /// datagram larger than [`RECV_SIZE`] is never cut.
    fn receive(&mut self) -> io::Result<()> {
        let mut nothing: &mut [u8] = &mut [];
        let (size, _) = self
            .sock
            .recv_from(&mut nothing, nix::libc::MSG_PEEK | nix::libc::MSG_TRUNC)?;
        self.buf.clear();
        self.buf.reserve(size.max(RECV_SIZE));
        let (got, _) = self.sock.recv_from(&mut self.buf, 0)?;
        if got != size {
            return Err(io::Error::other(format!(
                "read {got} bytes of a {size}-byte datagram"
            )));
        }
        Ok(())
    }
}

/// Collects the replies to one request; pure, so the protocol rules are unit-tested.
struct Replies<T> {
    what: &'static str,
    seq: u32,
    dump: bool,
    found: Vec<T>,
    interrupted: bool,
}

impl<T> Replies<T> {
    fn new(what: &'static str, seq: u32, dump: bool) -> Replies<T> {
        Replies {
            what,
            seq,
            dump,
            found: Vec::new(),
            interrupted: false,
        }
    }

    /// Takes one reply; `Some` once the request is over.
    fn feed(&mut self, reply: Message<T>) -> Result<Option<Outcome<T>>, Error> {
        if reply.seq != self.seq {
            // A late answer to an earlier request.
            return Ok(None);
        }
        self.interrupted |= reply.flags & NLM_F_DUMP_INTR != 0;
        match reply.reply {
            Reply::Inner(Some(inner)) => self.found.push(inner),
            Reply::Error(0) if !self.dump => {
                return Ok(Some(Outcome::Complete(std::mem::take(&mut self.found))));
            }
            Reply::Error(0) => {}
            Reply::Error(code) => {
                return Err(Error::Kernel {
                    what: self.what,
                    errno: code.saturating_abs(),
                });
            }
            Reply::Done => {
                return Ok(Some(if self.interrupted {
                    Outcome::Interrupted
                } else {
                    Outcome::Complete(std::mem::take(&mut self.found))
                }));
            }
            Reply::Inner(None) | Reply::Other => {}
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

/// Splits one datagram into its netlink messages, each inner one read by `parse`.
fn decode_with<T>(
    datagram: &[u8],
    parse: &mut Parse<'_, T>,
) -> Result<Vec<Message<T>>, decode::Error> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < datagram.len() {
        let rest = &datagram[offset..];
        let buf = NetlinkBuffer::new_checked(rest).map_err(decode::Error::Header)?;
        let len = buf.length() as usize;
        let payload = buf.payload();
        let reply = match buf.message_type() {
            NLMSG_ERROR => {
                let code = payload
                    .get(..4)
                    .and_then(|b| <[u8; 4]>::try_from(b).ok())
                    .map(i32::from_ne_bytes)
                    .ok_or(decode::Error::ShortErrorMessage)?;
                Reply::Error(code)
            }
            NLMSG_DONE => Reply::Done,
            NLMSG_NOOP | NLMSG_OVERRUN => Reply::Other,
            message_type => Reply::Inner(parse(message_type, payload)?),
        };
        out.push(Message {
            seq: buf.sequence_number(),
            flags: buf.flags(),
            reply,
        });
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
        let buf = NetlinkBuffer::new_checked(&bytes).unwrap();
        assert_eq!(buf.sequence_number(), 42);
        assert_eq!(buf.length() as usize, bytes.len());
        assert_eq!(buf.message_type(), 18, "RTM_GETLINK");
        let parsed = decode_with(&bytes, &mut typed).unwrap();
        assert!(matches!(
            &parsed[0].reply,
            Reply::Inner(Some(RouteNetlinkMessage::GetLink(m))) if m.attributes == [LinkAttribute::IfName("eth0".into())]
        ));
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
        let parsed = decode_with(&bytes, &mut typed).unwrap();
        assert_eq!(parsed.len(), 2);
        assert!(matches!(
            parsed[0].reply,
            Reply::Inner(Some(RouteNetlinkMessage::NewLink(_)))
        ));
        assert!(matches!(parsed[1].reply, Reply::Done));
        // A parser that keeps nothing of a message still sees where the request ends.
        let skipped = decode_with(&bytes, &mut |_, _| Ok(None::<()>)).unwrap();
        assert!(matches!(skipped[0].reply, Reply::Inner(None)));
        assert!(matches!(skipped[1].reply, Reply::Done));
    }

    /// One message as the kernel sends it, decoded as the reply loop decodes it.
    fn reply(
        seq: u32,
        flags: u16,
        payload: NetlinkPayload<RouteNetlinkMessage>,
    ) -> Message<RouteNetlinkMessage> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        header.flags = flags;
        let mut message = NetlinkMessage::new(header, payload);
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        let mut parsed = decode_with(&bytes, &mut typed).unwrap();
        assert_eq!(parsed.len(), 1);
        parsed.remove(0)
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
