//! Netlink.
