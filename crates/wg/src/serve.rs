//! The daemon's loop: attach gotatun to the persistent TUN, serve the UAPI socket, watch the
//! link, attach again when it is lost, stop on SIGTERM/SIGINT.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gotatun::device::uapi::UapiServer;
use gotatun::device::{Device, DeviceBuilder};
use gotatun::tun::tun_async_device::TunDevice;
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;

use crate::conn::{self, Renew, Shared};
use crate::decide;
use crate::flags::Options;
use crate::relay::{self, Relay};
use crate::{Error, tun, uapi};

/// How often the link's index is read: a deleted device is noticed within this.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// One gotatun device on the TUN, with the accept loop of its socket.
struct Attachment {
    device: Device<(relay::Factory, TunDevice, TunDevice)>,
    accept: JoinHandle<()>,
    /// Keeps the relay's table to gotatun's peers.
    refresh: JoinHandle<()>,
    shared: Arc<Shared>,
    /// How the replay it was made with went (see conn::Renew).
    replayed: Option<Result<(), String>>,
    index: u32,
    since: Instant,
}

impl Attachment {
    /// Stops accepting, stops gotatun (it closes its TUN descriptor; the persistent link
    /// stays) and removes the socket file.
    async fn stop(self, socket: &Path) {
        self.accept.abort();
        self.refresh.abort();
        self.device.stop().await;
        let _ = std::fs::remove_file(socket);
    }
}

/// Why an attachment ended.
enum End {
    Signal(&'static str),
    Lost(String),
    /// A request asked for a fresh device (see conn::Renew).
    Renew(Renew),
}

/// Runs until SIGTERM/SIGINT. Errors only at start: once serving, a lost device is attached again.
pub async fn run(opts: &Options) -> Result<(), Error> {
    // The socket and its directory are root's only: the socket takes private keys.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
    let ifname = opts.ifname.as_str();
    let socket = prepare_socket(&opts.socket_dir, ifname)?;
    let mut attachment = attach(ifname, &socket, None).await?;
    eprintln!(
        "sticky-wg: serving {ifname} (ifindex {}) on {}",
        attachment.index,
        socket.display()
    );
    loop {
        let end = tokio::select! {
            _ = term.recv() => End::Signal("SIGTERM"),
            _ = int.recv() => End::Signal("SIGINT"),
            _ = attachment.device.wait() => End::Lost("gotatun stopped with an error".into()),
            renew = attachment.shared.broken() => End::Renew(renew),
            lost = watch(ifname, attachment.index) => End::Lost(lost),
        };
        let lasted = attachment.since.elapsed();
        attachment.stop(&socket).await;
        let replay = match end {
            End::Signal(name) => {
                eprintln!("sticky-wg: {name}: stopped; {ifname} is left in place");
                return Ok(());
            }
            End::Lost(why) => {
                eprintln!("sticky-wg: {ifname} lost ({why}); attaching again");
                None
            }
            End::Renew(Renew { why, replay }) => {
                eprintln!("sticky-wg: {ifname}: {why}; attaching a fresh device");
                replay
            }
        };
        // A replay is a client's request, not a failure that could repeat: no pause.
        let mut pause = match replay {
            Some(_) => Duration::ZERO,
            None => decide::pause_before_reattach(lasted),
        };
        let mut last_error = String::new();
        attachment = loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
                _ = tokio::time::sleep(pause) => {}
            }
            match attach(ifname, &socket, replay.as_ref()).await {
                Ok(a) => break a,
                Err(e) => {
                    // One line per distinct failure, retried every second.
                    let said = e.to_string();
                    if said != last_error {
                        eprintln!("sticky-wg: attaching {ifname} again failed, retrying: {said}");
                        last_error = said;
                    }
                    pause = decide::MIN_ATTACHMENT;
                }
            }
        };
        let index = attachment.index;
        match &attachment.replayed {
            None => eprintln!(
                "sticky-wg: {ifname} is back (ifindex {index}), serving an empty device on {}",
                socket.display()
            ),
            Some(Ok(())) => eprintln!(
                "sticky-wg: {ifname} is back (ifindex {index}) with the new settings and its peers"
            ),
            Some(Err(e)) => eprintln!(
                "sticky-wg: {ifname} is back (ifindex {index}), but its configuration was \
                 refused ({e}): serving an empty device"
            ),
        }
    }
}

/// Makes the socket directory (0700) and decides what to do with a file already at the
/// socket's path: a live daemon's is refused, a dead one's is removed.
fn prepare_socket(dir: &Path, ifname: &str) -> Result<PathBuf, Error> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| Error::SocketDir {
            path: dir.to_path_buf(),
            source,
        })?;
    let path = dir.join(format!("{ifname}.sock"));
    let probe = UnixStream::connect(&path).map(drop).map_err(|e| e.kind());
    match decide::socket(probe) {
        decide::Socket::Bind => {}
        decide::Socket::Refuse => return Err(Error::AlreadyServed { path }),
        decide::Socket::ReplaceStale => match std::fs::remove_file(&path) {
            Ok(()) => eprintln!("sticky-wg: removed stale socket {}", path.display()),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(source) => return Err(Error::RemoveStale { path, source }),
        },
    }
    Ok(path)
}

/// Makes the persistent TUN if absent, starts a fresh gotatun device on it (no key, no
/// peers), gives it `replay` when there is one (before any client can reach it) and serves its
/// UAPI on `socket`.
async fn attach(
    ifname: &str,
    socket: &Path,
    replay: Option<&uapi::Set>,
) -> Result<Attachment, Error> {
    tun::ensure_persistent(ifname)?;
    let index = tun::index(ifname).ok_or_else(|| Error::NoIndex {
        ifname: ifname.to_string(),
    })?;
    let device_error = |message: String| Error::Device {
        ifname: ifname.to_string(),
        message,
    };
    let (client, server) = UapiServer::new();
    let forwarding = Relay::new();
    let device = DeviceBuilder::new()
        .with_udp(relay::Factory::new(Arc::clone(&forwarding)))
        .create_tun(ifname)
        .map_err(|e| device_error(e.to_string()))?
        .with_uapi(server)
        .build()
        .await
        .map_err(|e| device_error(e.to_string()))?;
    let shared = Shared::new(client, Arc::clone(&forwarding));
    let replayed = match replay {
        Some(set) => Some(shared.replay(set.clone()).await),
        None => None,
    };
    let listener = match bind(socket) {
        Ok(l) => l,
        Err(e) => {
            device.stop().await;
            return Err(e);
        }
    };
    let accept = tokio::spawn(conn::accept(listener, Arc::clone(&shared)));
    let reader = Arc::clone(&shared);
    let refresh = tokio::spawn(relay::refresh(forwarding, move || {
        let reader = Arc::clone(&reader);
        async move { reader.endpoints().await }
    }));
    Ok(Attachment {
        device,
        accept,
        refresh,
        shared,
        replayed,
        index,
        since: Instant::now(),
    })
}

/// Binds the socket (replacing our own previous file), root-only.
fn bind(socket: &Path) -> Result<UnixListener, Error> {
    let bind_error = |source| Error::Bind {
        path: socket.to_path_buf(),
        source,
    };
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(bind_error(e)),
    }
    let listener = UnixListener::bind(socket).map_err(bind_error)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(bind_error)?;
    Ok(listener)
}

/// Returns (with the reason) once the link is gone or has another index.
async fn watch(ifname: &str, attached: u32) -> String {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    loop {
        tick.tick().await;
        match decide::device(attached, tun::index(ifname)) {
            decide::Device::Same => {}
            decide::Device::Gone => return "the link was deleted".into(),
            decide::Device::Replaced { now } => {
                return format!("the link has a new index {now}, not {attached}");
            }
        }
    }
}
