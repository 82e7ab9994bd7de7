//! One blocking rtnetlink socket: request/ack, dumps, and the kernel's errno kept intact.
//!
//! Every request carries a fresh sequence number; replies with another number (late answers
//! to an earlier request) are skipped. A request ends at its ACK or `NLMSG_ERROR`, a dump at
//! `NLMSG_DONE`. A dump the kernel flags as interrupted (`NLM_F_DUMP_INTR`: the table changed
//! while it was being read) is started again, a few times at most.
//!
//! Many writes can go out as one batch ([`Socket::request_batch`]): several requests per
//! `send`, each with its own sequence number and ACK, the ACKs read together. The kernel works
//! through a datagram's messages in order, each on its own: a refused one does not stop the
//! ones after it, and each gets its own answer.

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

/// At most this many bytes of requests go out in one `send` of a batch.
const BATCH_BYTES: usize = 64 * 1024;

/// At most this many requests go out in one `send` of a batch. The kernel handles a whole
/// datagram inside `send` and queues one ACK datagram per request meanwhile; each costs the
/// receive buffer some 500-800 bytes (the kernel's bookkeeping, not the ACK's 36 bytes), and
/// an ACK that finds the buffer (`net.core.rmem_default`, 208 KiB) full is dropped: the next
/// receive fails with `ENOBUFS`. Measured with the root test below: 512 per `send`
/// overflowed, 256 did not; 128 leaves room for the larger ACKs of refused requests (they
/// quote the request).
const BATCH_MESSAGES: usize = 128;

/// One write of a batch: what it is (for the error), the message, its flags (such as
/// `NLM_F_CREATE`; `NLM_F_REQUEST | NLM_F_ACK` are added).
#[derive(Debug, Clone)]
pub struct Request {
    pub what: &'static str,
    pub message: RouteNetlinkMessage,
    pub flags: u16,
}

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
pub(crate) fn typed(
    message_type: u16,
    payload: &[u8],
) -> Result<Option<RouteNetlinkMessage>, decode::Error> {
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
    pub(crate) fn request_with<T>(
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

    /// Sends one [`Request`] and waits for its ACK.
    pub fn write(&mut self, request: Request) -> Result<(), Error> {
        self.request(request.what, request.message, request.flags)
            .map(drop)
    }

    /// Sends many writes, as many per `send` as fit ([`BATCH_BYTES`], [`BATCH_MESSAGES`]),
    /// and reads the ACKs of each `send` before the next. Returns each request's own answer,
    /// in order: `Ok`, or [`Error::Kernel`] with its errno, as [`Socket::write`] would have
    /// returned it. The outer error is a failure of the socket itself (send, receive,
    /// decode): then what became of the requests is unknown.
    pub fn request_batch(
        &mut self,
        requests: Vec<Request>,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        let skip = &mut |_: u16, _: &[u8]| Ok(None::<()>);
        let answers = self.batch_with(requests, true, skip)?;
        Ok(answers.into_iter().map(|a| a.map(drop)).collect())
    }

    /// Sends many GETs of one entry each as one batch ([`Socket::request_batch`]), with no
    /// ACK asked for: each is answered once, by its entry or by the kernel's refusal (`ENOENT`
    /// for an entry that is not there). Returns each request's answer, in order: its entry
    /// (read by `parse`; `None` for one `parse` skips) or the refusal.
    pub(crate) fn get_batch<T>(
        &mut self,
        requests: Vec<Request>,
        parse: &mut Parse<'_, T>,
    ) -> Result<Vec<Result<Option<T>, Error>>, Error> {
        self.batch_with(requests, false, parse)
    }

    /// A batch; `acked`: each request asks for its ACK (a write) or is answered by its one
    /// reply (a GET).
    fn batch_with<T>(
        &mut self,
        requests: Vec<Request>,
        acked: bool,
        parse: &mut Parse<'_, T>,
    ) -> Result<Vec<Result<Option<T>, Error>>, Error> {
        let mut answers = Vec::with_capacity(requests.len());
        for chunk in chunks(requests, acked, &mut self.seq) {
            answers.extend(self.send_chunk(&chunk, parse)?);
        }
        Ok(answers)
    }

    /// Sends one chunk of a batch in one `send` and reads its answers.
    fn send_chunk<T>(
        &mut self,
        chunk: &Chunk,
        parse: &mut Parse<'_, T>,
    ) -> Result<Vec<Result<Option<T>, Error>>, Error> {
        let what = chunk
            .whats
            .first()
            .copied()
            .unwrap_or("a batch of requests");
        self.sock
            .send(&chunk.bytes, 0)
            .map_err(|source| Error::Send { what, source })?;
        let mut acks = Acks::new(chunk.first, &chunk.whats, chunk.acked);
        loop {
            self.receive_small()
                .map_err(|source| Error::Recv { what, source })?;
            for reply in
                decode_with(&self.buf, parse).map_err(|source| Error::Decode { what, source })?
            {
                if let Some(answers) = acks.feed(reply) {
                    return Ok(answers);
                }
            }
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
    pub(crate) fn dump_with<T>(
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

    /// Reads the next datagram into `self.buf` in one call, for answers known to be small
    /// (an ACK, or an error quoting a request of a batch): one longer than [`RECV_SIZE`] is
    /// an error, never read cut short as if whole.
    fn receive_small(&mut self) -> io::Result<()> {
        self.buf.clear();
        self.buf.reserve(RECV_SIZE);
        let room = self.buf.capacity();
        let size = self.sock.recv(&mut self.buf, nix::libc::MSG_TRUNC)?;
        if size > room {
            return Err(io::Error::other(format!(
                "a {size}-byte datagram, cut at {room} bytes"
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

/// The requests of one `send` of a batch.
#[derive(Debug)]
struct Chunk {
    /// The requests, one after the other.
    bytes: Vec<u8>,
    /// The sequence number of the first; the others follow it.
    first: u32,
    whats: Vec<&'static str>,
    /// Whether each request asks for its ACK.
    acked: bool,
}

/// Encodes a batch, each request with the next sequence number after `seq` (left at the last
/// one used), cut into chunks of at most [`BATCH_BYTES`] and [`BATCH_MESSAGES`]; `acked`:
/// each asks for its ACK.
fn chunks(requests: Vec<Request>, acked: bool, seq: &mut u32) -> Vec<Chunk> {
    let ack = if acked { NLM_F_ACK } else { 0 };
    let mut out: Vec<Chunk> = Vec::new();
    for request in requests {
        *seq = seq.wrapping_add(1);
        let flags = NLM_F_REQUEST | ack | request.flags;
        let mut bytes = encode(request.message, flags, *seq);
        // The kernel finds the next message at the current one's length rounded up to 4.
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        let full = out.last().is_none_or(|c| {
            c.bytes.len() + bytes.len() > BATCH_BYTES || c.whats.len() >= BATCH_MESSAGES
        });
        if full {
            out.push(Chunk {
                bytes: Vec::new(),
                first: *seq,
                whats: Vec::new(),
                acked,
            });
        }
        if let Some(chunk) = out.last_mut() {
            chunk.bytes.extend_from_slice(&bytes);
            chunk.whats.push(request.what);
        }
    }
    out
}

/// Collects the answers of one `send` of a batch; pure, so the matching is unit-tested.
struct Acks<'a, T> {
    /// The sequence number of the first request; the others follow it.
    first: u32,
    whats: &'a [&'static str],
    /// Whether the requests asked for their ACK (writes); if not (GETs), a reply that is not
    /// an error answers its request.
    acked: bool,
    /// Each request's answer once it came: its errno (0: acknowledged) or its one reply.
    answers: Vec<Option<Result<Option<T>, i32>>>,
    waiting: usize,
}

impl<'a, T> Acks<'a, T> {
    fn new(first: u32, whats: &'a [&'static str], acked: bool) -> Acks<'a, T> {
        Acks {
            first,
            whats,
            acked,
            answers: whats.iter().map(|_| None).collect(),
            waiting: whats.len(),
        }
    }

    /// Takes one reply; once every request is answered, each one's answer in order.
    fn feed(&mut self, reply: Message<T>) -> Option<Vec<Result<Option<T>, Error>>> {
        // Sequence numbers wrap; one outside this batch is a late answer to something else.
        let index = reply.seq.wrapping_sub(self.first) as usize;
        let slot = self.answers.get_mut(index)?;
        if slot.is_some() {
            return None;
        }
        *slot = Some(match reply.reply {
            Reply::Error(0) => Ok(None),
            Reply::Error(code) => Err(code),
            Reply::Inner(inner) if !self.acked => Ok(inner),
            Reply::Inner(_) | Reply::Done | Reply::Other => return None,
        });
        self.waiting -= 1;
        if self.waiting > 0 {
            return None;
        }
        let answers = std::mem::take(&mut self.answers);
        Some(
            answers
                .into_iter()
                .zip(self.whats)
                .map(|(answer, what)| match answer {
                    Some(Err(code)) => Err(Error::Kernel {
                        what,
                        errno: code.saturating_abs(),
                    }),
                    Some(Ok(inner)) => Ok(inner),
                    None => Ok(None),
                })
                .collect(),
        )
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

    fn neighbour(i: u32) -> Request {
        let mut msg = netlink_packet_route::neighbour::NeighbourMessage::default();
        msg.header.ifindex = i;
        Request {
            what: if i.is_multiple_of(2) { "even" } else { "odd" },
            message: RouteNetlinkMessage::NewNeighbour(msg),
            flags: netlink_packet_core::NLM_F_CREATE,
        }
    }

    #[test]
    fn a_batch_is_cut_into_sends_each_request_with_its_own_sequence_number() {
        let mut seq = u32::MAX - 1;
        let requests: Vec<Request> = (0..300).map(neighbour).collect();
        let chunks = chunks(requests, true, &mut seq);
        assert_eq!(seq, 298, "300 numbers used, wrapping past u32::MAX");
        let sizes: Vec<usize> = chunks.iter().map(|c| c.whats.len()).collect();
        assert_eq!(
            sizes,
            [BATCH_MESSAGES, BATCH_MESSAGES, 300 - 2 * BATCH_MESSAGES]
        );
        let mut expected = u32::MAX;
        for chunk in &chunks {
            assert!(chunk.bytes.len() <= BATCH_BYTES);
            assert_eq!(chunk.first, expected);
            let parsed = decode_with(&chunk.bytes, &mut typed).unwrap();
            assert_eq!(parsed.len(), chunk.whats.len());
            for (message, what) in parsed.iter().zip(&chunk.whats) {
                assert_eq!(message.seq, expected);
                let flags = NLM_F_REQUEST | NLM_F_ACK | netlink_packet_core::NLM_F_CREATE;
                assert_eq!(message.flags, flags);
                let Reply::Inner(Some(RouteNetlinkMessage::NewNeighbour(n))) = &message.reply
                else {
                    panic!("{message:?}")
                };
                assert_eq!(
                    *what,
                    if n.header.ifindex.is_multiple_of(2) {
                        "even"
                    } else {
                        "odd"
                    }
                );
                expected = expected.wrapping_add(1);
            }
        }
        assert_eq!(expected, seq.wrapping_add(1));
        assert!(super::chunks(Vec::new(), true, &mut seq).is_empty());
    }

    #[test]
    fn a_batch_is_cut_by_bytes_too() {
        let mut big = LinkMessage::default();
        big.attributes
            .push(LinkAttribute::IfAlias("x".repeat(1000)));
        let requests = (0..100)
            .map(|_| Request {
                what: "big",
                message: RouteNetlinkMessage::SetLink(big.clone()),
                flags: 0,
            })
            .collect();
        let chunks = chunks(requests, true, &mut 0);
        assert!(chunks.len() > 1, "100 x 1 KiB is more than one send");
        assert!(chunks.iter().all(|c| c.bytes.len() <= BATCH_BYTES));
        assert_eq!(chunks.iter().map(|c| c.whats.len()).sum::<usize>(), 100);
    }

    #[test]
    fn acks_are_matched_to_their_requests_by_sequence_number() {
        let whats = ["a", "b", "c"];
        // Sequence numbers u32::MAX, 0, 1: the batch wraps.
        let mut acks = Acks::new(u32::MAX, &whats, false);
        assert!(acks.feed(reply(0, 0, ack(-17))).is_none(), "b refused");
        assert!(acks.feed(reply(7, 0, ack(0))).is_none(), "late: not ours");
        assert!(acks.feed(reply(7, 0, link())).is_none(), "late: not ours");
        assert!(acks.feed(reply(1, 0, ack(0))).is_none());
        assert!(acks.feed(reply(0, 0, ack(0))).is_none(), "b answered once");
        assert!(acks.feed(reply(0, 0, link())).is_none(), "b answered once");
        let answers = acks
            .feed(reply(u32::MAX, 0, link()))
            .expect("all answered: a by its entry (a GET's one reply)");
        assert_eq!(answers.len(), 3);
        let a = answers[0].as_ref().unwrap();
        assert!(matches!(a, Some(RouteNetlinkMessage::NewLink(_))), "{a:?}");
        assert!(answers[2].as_ref().unwrap().is_none(), "c acknowledged");
        let err = answers[1].as_ref().unwrap_err();
        assert_eq!(err.errno(), Some(17));
        assert!(
            err.to_string().starts_with("b: the kernel refused it"),
            "{err}"
        );
        // Writes: only their ACK answers them.
        let mut acks = Acks::new(5, &whats[..1], true);
        assert!(
            acks.feed(reply(5, 0, link())).is_none(),
            "an echo, not the ack"
        );
        let answers = acks.feed(reply(5, 0, ack(0))).expect("answered");
        assert!(matches!(answers[..], [Ok(None)]), "{answers:?}");
    }

    /// The kernel's own answers: 999 entry writes and one bad route in the middle, as one
    /// batch, in a network namespace of this test's thread alone (gone with the thread, even
    /// when an assertion fails).
    #[test]
    #[ignore = "needs root: a network namespace"]
    fn a_batch_lands_and_a_refused_request_gets_its_own_error() {
        use crate::neigh::{self, Fdb, Neighbour};
        use crate::route::{self, Route};
        use std::net::{IpAddr, Ipv4Addr};

        crate::in_own_netns(
            &[crate::TEST_NODE, &[&["link", "set", "vt0", "up"]]].concat(),
            || {
                let mut sock = Socket::open().unwrap();
                let vt0 = crate::link::get(&mut sock, "vt0").unwrap().unwrap().index;
                let mut fdbs = Vec::new();
                let mut neighbours = Vec::new();
                let mut routes = Vec::new();
                for i in 0..333u32 {
                    let [_, _, a, b] = i.to_be_bytes();
                    let mac = [0x0a, 1, 0, 0, a, b];
                    fdbs.push(Fdb {
                        index: vt0,
                        mac,
                        dst: IpAddr::V4(Ipv4Addr::new(198, 18, a, b)),
                        permanent: true,
                    });
                    let ip = Ipv4Addr::new(198, 19, a, b);
                    neighbours.push(Neighbour {
                        index: vt0,
                        ip: IpAddr::V4(ip),
                        mac,
                        permanent: true,
                    });
                    routes.push(Route {
                        dst: ipnet::IpNet::new(IpAddr::V4(ip), 32).unwrap(),
                        gateway: Some(IpAddr::V4(ip)),
                        oif: Some(vt0),
                        onlink: true,
                        metric: 0,
                        protocol: 118,
                    });
                }
                let bad = Route {
                    oif: Some(999_999),
                    ..routes[0].clone()
                };
                let mut requests = Vec::new();
                for i in 0..333 {
                    requests.push(neigh::Write::AddFdb(&fdbs[i]).request());
                    requests.push(neigh::Write::ReplaceNeighbour(&neighbours[i]).request());
                    requests.push(route::Write::Replace(&routes[i]).request());
                    if i == 166 {
                        requests.push(route::Write::Replace(&bad).request());
                    }
                }
                assert_eq!(requests.len(), 1000);
                let answers = sock.request_batch(requests).unwrap();
                assert_eq!(answers.len(), 1000);
                for (k, answer) in answers.into_iter().enumerate() {
                    if k == 501 {
                        let err = answer.as_ref().unwrap_err();
                        assert!(err.is(nix::errno::Errno::ENODEV), "{err}");
                        let named = route::Write::Replace(&bad).answer(answer);
                        let text = named.unwrap_err().to_string();
                        assert!(
                            text.starts_with("route 198.19.0.0/32 via 198.19.0.0 dev #999999"),
                            "{text}"
                        );
                    } else {
                        assert!(answer.is_ok(), "request {k}: {answer:?}");
                    }
                }
                let mut got_fdb = neigh::list_fdb(&mut sock, vt0).unwrap();
                got_fdb.retain(|f| f.mac[0] == 0x0a);
                assert_eq!(got_fdb.len(), 333);
                assert!(fdbs.iter().all(|f| got_fdb.contains(f)));
                let got_neigh = neigh::list(&mut sock, vt0).unwrap();
                assert!(
                    neighbours.iter().all(|n| got_neigh.contains(n)),
                    "{got_neigh:?}"
                );
                let got_routes = route::list(&mut sock).unwrap();
                assert!(routes.iter().all(|r| got_routes.contains(r)));
                // The same FDB entries again: there already, which is no error (the kernel may
                // say EEXIST or nothing).
                let again: Vec<Request> = fdbs
                    .iter()
                    .map(|f| neigh::Write::AddFdb(f).request())
                    .collect();
                let answers = sock.request_batch(again).unwrap();
                for (f, answer) in fdbs.iter().zip(answers) {
                    neigh::Write::AddFdb(f).answer(answer).unwrap();
                }
            },
        );
    }
}
