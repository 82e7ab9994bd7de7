//! `sticky-vxlan reconcile --config <file>` for a segment network: its bridge, VXLAN device
//! and flood entries brought to what the peers say, without a pod (at boot, before kubelet
//! starts pods, or after the peers file changed). A main-mode file is left to the main mode's
//! `reconcile`.

use std::path::Path;
use std::process::ExitCode;

use super::config::Config;
use super::{datapath, node};
use crate::cli::conflist;
use crate::netlink::Socket;
use crate::vxlan::cli;
use crate::vxlan::kernel::Live;

/// Runs the command when `args` is `reconcile --config <a segment network>`; `None` otherwise.
pub fn run(args: &[String]) -> Option<ExitCode> {
    if args.first().map(String::as_str) != Some("reconcile") {
        return None;
    }
    let path = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1))?;
    let loaded = conflist::load(Path::new(path), "with type \"sticky-vxlan\"", |e| {
        conflist::has_type(e, "sticky-vxlan")
    })
    .ok()?;
    if super::mode::mode(&loaded.entry).ok()? != super::mode::Mode::Segment {
        return None;
    }
    let done = Config::from_json(&loaded.conf.name, &loaded.entry)
        .map_err(super::Error::from)
        .and_then(|cfg| {
            let mut sock = Socket::open()?;
            let node = node::resolve(&mut Live { sock: &mut sock }, &cfg)?;
            let bridge = datapath::ensure(&mut Live { sock: &mut sock }, &cfg, &node)?;
            Ok(format!(
                "segment {} vni {} port {}: {} and {} up, flood to {} node(s)\n",
                cfg.name,
                cfg.vni,
                cfg.port,
                bridge.name,
                cfg.vxlan(),
                node.remote.len()
            ))
        });
    Some(match done {
        Ok(out) => {
            print!("{out}");
            ExitCode::from(cli::EXIT_OK)
        }
        Err(e) => {
            eprintln!("sticky-vxlan: {e}");
            // The main mode's convention: an unusable `--config` is a usage error.
            ExitCode::from(match e {
                super::Error::Config(_) | super::Error::Mode(_) => cli::EXIT_USAGE,
                _ => cli::EXIT_RUNTIME,
            })
        }
    })
}
