//! The CNI protocol: environment, `CNI_ARGS`, network config, results in every spec version,
//! errors and the dispatcher. Nothing here knows about IP allocation or netlink.

pub mod args;
pub mod attachments;
pub mod conflist;
pub mod delegate;
pub mod env;
pub mod error;
pub mod netconf;
pub mod result;
pub mod skel;
pub mod version;

pub use args::{Args, ArgsError};
pub use attachments::{Attachment, AttachmentsError};
pub use env::{Command, Env, EnvError};
pub use error::CniError;
pub use netconf::{NetConf, NetConfError};
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use skel::{Call, Plugin};
pub use version::{Version, version_reply};
