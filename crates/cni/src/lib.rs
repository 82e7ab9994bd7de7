//! The CNI protocol for plugins written in Rust: the `CNI_*` environment ([`Env`]),
//! `CNI_ARGS` ([`Args`]), the network config ([`NetConf`], and [`conflist`] for `.conf` and
//! `.conflist` files), results in every spec version from 0.1.0 to 1.1.0 ([`CniResult`]),
//! errors with their codes and host-local's words ([`CniError`]), CHECK, GC (with the
//! attachments list, [`attachments`]) and STATUS, delegation to an IPAM plugin
//! ([`delegate`]), and the skeleton that ties them together ([`skel`]). Nothing here knows
//! about IP allocation, netlink or Linux: it depends on serde, serde_json, thiserror and
//! ipnet only.
//!
//! Why not the `cni-plugin` crate: it is archived, refuses 0.3.x configs, and has no GC or
//! STATUS. sticky-cni's two plugins (`sticky-ipam`, `sticky-vxlan`) are written on this one.
//!
//! A plugin implements [`skel::Plugin`] and hands it to [`skel::run`], which reads the
//! environment and stdin, refuses what the spec refuses (an unknown command, CHECK below
//! 0.4.0, GC and STATUS below 1.1.0, a config it cannot read), calls the command, prints one
//! JSON answer in the config's `cniVersion`, and returns the exit code:
//!
//! ```
//! use std::process::ExitCode;
//!
//! use cni_protocol::error::code;
//! use cni_protocol::skel::{self, Call, Plugin};
//! use cni_protocol::{CniError, CniResult, IpConfig};
//!
//! /// Hands every container the same documentation address: the smallest IPAM plugin.
//! struct OneAddress;
//!
//! impl Plugin for OneAddress {
//!     type Error = CniError;
//!     fn add(&self, call: &Call) -> Result<CniResult, CniError> {
//!         if call.env.ifname.is_empty() {
//!             return Err(CniError::new(code::INVALID_ENV, "CNI_IFNAME is empty"));
//!         }
//!         let ip = IpConfig {
//!             address: "192.0.2.10/24".parse().expect("an address"),
//!             gateway: Some("192.0.2.1".parse().expect("an address")),
//!             interface: None,
//!         };
//!         Ok(CniResult { ips: vec![ip], ..CniResult::default() })
//!     }
//!     fn del(&self, _call: &Call) -> Result<(), CniError> {
//!         Ok(())
//!     }
//!     fn check(&self, _call: &Call) -> Result<(), CniError> {
//!         Ok(())
//!     }
//!     fn gc(&self, _call: &Call) -> Result<(), CniError> {
//!         Ok(())
//!     }
//!     fn status(&self, _call: &Call) -> Result<(), CniError> {
//!         Ok(())
//!     }
//! }
//!
//! // The plugin binary's `main` is this one call:
//! fn plugin_main() -> ExitCode {
//!     skel::run("one-address", &OneAddress)
//! }
//!
//! // What a runtime would see, without a process: an ADD in version 0.3.1.
//! let env = cni_protocol::Env::from_vars(|name| match name {
//!     "CNI_COMMAND" => Some("ADD".into()),
//!     "CNI_CONTAINERID" => Some("c1".into()),
//!     "CNI_NETNS" => Some("/run/netns/c1".into()),
//!     "CNI_IFNAME" => Some("eth0".into()),
//!     _ => None,
//! });
//! let conf = br#"{"cniVersion": "0.3.1", "name": "net", "type": "one-address"}"#;
//! let answer = skel::dispatch(&OneAddress, env, conf).expect("ADD succeeds");
//! let answer = answer.expect("ADD prints a result");
//! assert_eq!(answer["cniVersion"], "0.3.1");
//! assert_eq!(answer["ips"][0]["address"], "192.0.2.10/24");
//! assert_eq!(answer["ips"][0]["version"], "4"); // 0.3.x tags each address's family
//! # let _ = plugin_main;
//! ```

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
