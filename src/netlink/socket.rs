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
        let mut found = Vec::new();
        let mut interrupted = false;
        loop {
            let (datagram, _) = self
                .sock
                .recv_from_full()
                .map_err(|source| Error::Recv { what, source })?;
            for reply in decode_all(&datagram).map_err(|reason| Error::Decode { what, reason })? {
                if reply.header.sequence_number != seq {
                    continue;
                }
                interrupted |= reply.header.flags & NLM_F_DUMP_INTR != 0;
                match reply.payload {
                    NetlinkPayload::InnerMessage(inner) => found.push(inner),
                    NetlinkPayload::Error(err) => match err.code {
                        None if !dump => return Ok(Outcome::Complete(found)),
                        None => {}
                        Some(code) => {
                            return Err(Error::Kernel {
                                what,
                                errno: code.get().abs(),
                            });
                        }
                    },
                    NetlinkPayload::Done(_) => {
                        return Ok(if interrupted {
                            Outcome::Interrupted
                        } else {
                            Outcome::Complete(found)
                        });
                    }
                    _ => {}
                }
            }
        }
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

    #[test]
    fn error_keeps_errno() {
        let mut header = NetlinkHeader::default();
        header.sequence_number = 1;
        let mut err = ErrorMessage::default();
        err.code = NonZeroI32::new(-17);
        let mut msg =
            NetlinkMessage::<RouteNetlinkMessage>::new(header, NetlinkPayload::Error(err));
        msg.finalize();
        let mut bytes = vec![0; msg.buffer_len()];
        msg.serialize(&mut bytes);
        let parsed = decode_all(&bytes).unwrap();
        let NetlinkPayload::Error(e) = &parsed[0].payload else {
            panic!("not an error")
        };
        assert_eq!(e.code.map(|c| c.get()), Some(-17));
        let kernel = Error::Kernel {
            what: "x",
            errno: 17,
        };
        assert!(kernel.is(nix::errno::Errno::EEXIST));
    }
}
