//! Why a reply from the kernel could not be read: the one error of every decoder, from the
//! netlink header of a datagram ([`super::socket`]) to the few fields of a link read straight
//! from its bytes ([`super::link`]).

use netlink_packet_core::{DecodeError, NlasIterator};

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
    /// An `RTM_NEWROUTE` payload shorter than its header.
    #[error("route message of {0} bytes")]
    ShortRoute(usize),
    /// An `RTM_NEWNEIGH` payload shorter than its header.
    #[error("neighbour message of {0} bytes")]
    ShortNeighbour(usize),
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

/// The attributes of a netlink attribute block, as (type, value).
pub(crate) fn attributes(block: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), Error>> {
    NlasIterator::new(block).map(|nla| {
        let nla = nla.map_err(Error::Attribute)?;
        let (kind, end) = (nla.kind(), usize::from(nla.length()));
        // `new_checked` made sure that 4 <= length <= the buffer's length.
        let value = nla.into_inner().get(4..end).unwrap_or_default();
        Ok((kind, value))
    })
}
