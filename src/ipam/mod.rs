//! sticky-ipam.
