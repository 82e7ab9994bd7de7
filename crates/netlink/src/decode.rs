//! Why a reply from the kernel could not be read: the one error of every decoder, from the
//! netlink header of a datagram ([`super::socket`]) to the few fields of a link read straight
//! from its bytes ([`super::link`]).

use netlink_packet_core::DecodeError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A message's netlink header (length, type, flags) does not fit the datagram.
    #[error("{0}")]
    Header(#[source] DecodeError),
    #[error("NLMSG_ERROR shorter than its code")]
    ShortErrorMessage,
    /// A reply decoded whole as a `netlink-packet-route` message.
    #[error("message type {message_type}: {source}")]
    Message {
        message_type: u16,
        #[source]
        source: DecodeError,
    },
    /// An `RTM_NEWLINK` payload cut before the field read.
    #[error("link message of {0} bytes")]
    ShortLink(usize),
    /// A netlink attribute (its header, or a value of the wrong size or not text).
    #[error("{0}")]
    Attribute(#[source] DecodeError),
    #[error("vxlan attribute {kind}: {source}")]
    VxlanAttribute {
        kind: u16,
        #[source]
        source: DecodeError,
    },
}
