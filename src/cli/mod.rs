//! What the two operator tools share: one command-line parser ([`args`]) and one loader of
//! `.conf`/`.conflist` files ([`conflist`]). Each tool keeps its own verbs, its own error type
//! and its documented exit codes (`sticky-ipam --help`, `sticky-vxlan --help`); none of this
//! is a CNI error, so none of it has a CNI error code.

pub mod args;
pub mod conflist;
pub mod node_ranges;
