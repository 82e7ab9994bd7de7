//! sticky-ipam: host-local's configuration and data dir, with sticky leases per pod.
//!
//! - [`config`] reads the `ipam` section; [`range`] validates ranges and orders addresses.
//! - [`identity`] names pods safely in file names; [`record`] is one file's format.
//! - [`allocator`] (ADD), [`del`] and [`check`], [`group`] (crash leftovers) and
//!   [`lifecycle`] (boots, expiry, GC) are the policy, over the [`store::Store`] trait;
//!   [`disk`] is the only code that touches the data dir; [`index`] is its derived name
//!   index, so a call reads what it asks about, not the whole directory.
//! - [`plugin`] wires the CNI commands to them; the operator's tool (a layer up) is `cli::ipam`; [`metrics`]
//!   writes the node_exporter textfile.

mod allocator;
mod check;
pub mod cli;
mod codes;
pub mod config;
mod del;
mod disk;
mod group;
mod host;
pub mod identity;
mod index;
mod lifecycle;
mod metrics;
pub mod plugin;
mod range;
pub mod record;
mod resolv;
pub mod store;

use cni_protocol::ArgsError;

/// Every way a sticky-ipam command can fail; [`codes`] gives each its CNI code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Alloc(#[from] allocator::AllocError),
    #[error(transparent)]
    Check(#[from] check::CheckError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Resolv(#[from] resolv::ResolvError),
    #[error(
        "GC needs cni.dev/valid-attachments (or cni.dev/attachments); refusing to release everything"
    )]
    GcWithoutAttachments,
    #[error(transparent)]
    BadAttachments(#[from] cni_protocol::AttachmentsError),
    #[error("{0}")]
    NotReady(String),
}
