//! The operator tools, on top of the plugins they look after: `sticky-ipam`'s verbs
//! ([`ipam`]) and `sticky-vxlan`'s ([`vxlan`]), each run when its binary is started without
//! `CNI_COMMAND`. They share one command-line parser ([`crate::args`]) and one loader of
//! `.conf`/`.conflist` files ([`crate::cni::conflist`]). Each tool keeps its own verbs, its own
//! error type and its documented exit codes (`sticky-ipam --help`, `sticky-vxlan --help`); none
//! of this is a CNI error, so none of it has a CNI error code.

pub mod ipam;
pub mod vxlan;
