//! `sticky-wg`: the sites gateway's WireGuard data path, a daemon of its own so that an agent
//! restart or upgrade never stops cross-site traffic (docs/sites-tunnel-choice.md).
//!
//! It runs gotatun (Mullvad's userspace WireGuard) on a persistent TUN device and serves
//! WireGuard's standard configuration protocol on `<socket-dir>/<ifname>.sock`. It holds no key
//! and no configuration of its own: the agent pushes everything over that socket and reads the
//! state back (`wg show` works the same way). The TUN is persistent so the agent's MTU,
//! addresses and routes outlive this process; if the link is deleted under it, it makes it
//! again and serves a fresh, empty device. Under gotatun, its UDP socket is wrapped so that the
//! device forwards between its peers without decrypting and reaches a peer through a relay
//! (`relay`, on `sticky_sites::relay`'s rules). tokio and gotatun live in this crate only.

mod book;
mod conn;
mod decide;
pub mod flags;
mod relay;
mod serve;
mod tun;
pub mod uapi;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use sticky_primitives::program;

/// Everything that stops the daemon (a lost device is not among them: it is attached again).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(#[from] flags::Error),
    #[error("writing output: {0}")]
    Output(#[source] io::Error),
    #[error("{0}")]
    Tun(#[from] tun::Error),
    #[error("making socket directory {path:?}: {source}")]
    SocketDir { path: PathBuf, source: io::Error },
    #[error(
        "{path:?}: another sticky-wg already serves this device (its socket answers); \
         stop it first, two daemons on one device is a mistake"
    )]
    AlreadyServed { path: PathBuf },
    #[error("removing stale socket {path:?}: {source}")]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("binding UAPI socket {path:?}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("starting WireGuard (gotatun) on {ifname:?}: {message}")]
    Device { ifname: String, message: String },
    #[error("link {ifname:?} vanished while it was being attached")]
    NoIndex { ifname: String },
    #[error("starting the runtime: {0}")]
    Runtime(#[source] io::Error),
    #[error("installing signal handlers: {0}")]
    Signals(#[source] io::Error),
}

/// Exit 2 for a usage error, 1 for anything else (`--help` says so).
impl program::Failure for Error {
    fn is_usage(&self) -> bool {
        matches!(self, Error::Usage(_))
    }
    fn exit_code(&self) -> u8 {
        if self.is_usage() { 2 } else { 1 }
    }
}

/// The whole program: `--help`, `--version`, or the daemon until SIGTERM/SIGINT.
pub fn main(args: &[String]) -> ExitCode {
    program::main("sticky-wg", |out| {
        if args.iter().any(|a| matches!(a.as_str(), "--help" | "-h")) {
            return out.write_all(flags::HELP.as_bytes()).map_err(Error::Output);
        }
        if args.first().is_some_and(|a| a == "--version") {
            let version = env!("CARGO_PKG_VERSION");
            return writeln!(out, "sticky-wg {version}").map_err(Error::Output);
        }
        let opts = flags::parse(args)?;
        abort_on_panic();
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?
            .block_on(serve::run(&opts))
    })
}

/// Makes any panic end the process. tokio catches a panic inside a task and lets the others
/// run on: gotatun's configuration task panicked that way (issue 36) and left a live process
/// whose socket accepted and answered nothing, which neither systemd nor the DaemonSet
/// restarts, and which a new sticky-wg refused to replace. Aborted, the process is restarted,
/// and the new one takes over the socket file the dead one left (decide::socket). A hook,
/// not `panic = "abort"`: the workspace's profiles are shared with the other binaries.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!("sticky-wg: panicked (a bug); aborting so that it is restarted");
        std::process::abort();
    }));
}
