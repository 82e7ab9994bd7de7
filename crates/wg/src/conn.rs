//! The UAPI socket's connections, served by sticky-wg itself rather than by gotatun's
//! `wrap_read_write` (a thread per connection, an unbounded line buffer, no answer on bad
//! input): a task per connection, at most [`MAX_CONNECTIONS`] of them, each line at most
//! [`MAX_LINE`] bytes, a request at most [`uapi::MAX_REQUEST_BYTES`], nothing for [`IDLE_TIMEOUT`]
//! closes it. A request is read and checked whole ([`crate::uapi`]), planned against the book
//! ([`crate::book`]), and only then handed to gotatun as its typed request; every answer ends
//! with `errno=N` and an empty line, as wireguard-go's.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gotatun::device::uapi::UapiClient;
use gotatun::device::uapi::command::{
    Get, GetPeer, Request as GotatunRequest, Response, Set as GotatunSet, SetPeer, SetUnset,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Mutex, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use sticky_sites::keys::PublicKey;

use crate::book::{self, Book, PendingPeer};
use crate::relay::Relay;
use crate::uapi::{
    self, AllowedIp, IDLE_TIMEOUT, Key, MAX_CONNECTIONS, MAX_LINE, Opening, REQUEST_TIMEOUT, errno,
};

/// What the connections of one attachment share.
pub struct Shared {
    client: UapiClient,
    /// One request at a time, as wireguard-go's configuration lock: the book must move with
    /// gotatun, and only one request body is held in memory.
    book: Mutex<Book>,
    slots: Arc<Semaphore>,
    /// Told when the device must be made anew: gotatun's configuration task no longer answers,
    /// or refused a checked request (its state is then unknown), or a request changes what a
    /// running gotatun device cannot change (its replay is then in `renew`).
    broken: Notify,
    /// Why, and the request the fresh device starts with; set by a request, acted on (told to
    /// `broken`) once its answer is written, so the answer is not lost with the old device.
    renew: std::sync::Mutex<Option<Renew>>,
    /// The forwarding relay under gotatun: told when the peers change.
    relay: Arc<Relay>,
}

/// Why the device is made anew, and what the fresh one is given first.
pub struct Renew {
    pub why: String,
    pub replay: Option<uapi::Set>,
}

impl Shared {
    pub fn new(client: UapiClient, relay: Arc<Relay>) -> Arc<Shared> {
        Arc::new(Shared {
            client,
            relay,
            book: Mutex::new(Book::default()),
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            broken: Notify::new(),
            renew: std::sync::Mutex::new(None),
        })
    }

    /// Returns, with the why and the replay, once the device must be made anew.
    pub async fn broken(&self) -> Renew {
        self.broken.notified().await;
        self.renew_slot().take().unwrap_or(Renew {
            why: "gotatun no longer answers".into(),
            replay: None,
        })
    }

    /// Applies `set` as the fresh device's first request (the replay of [`Renew`]).
    pub async fn replay(&self, set: uapi::Set) -> Result<(), String> {
        let mut book = self.book.lock().await;
        set_request(self, &mut book, set)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The peers' keys and current endpoints as gotatun holds them (the relay's table), or
    /// `None` when gotatun does not answer.
    pub async fn endpoints(&self) -> Option<Vec<(PublicKey, Option<SocketAddr>)>> {
        let Ok(Response::Get(response)) = self.client.send(Get::default()).await else {
            return None;
        };
        Some(
            response
                .peers
                .iter()
                .map(|p| (PublicKey(p.peer.public_key.0), p.peer.endpoint))
                .collect(),
        )
    }

    fn renew_slot(&self) -> std::sync::MutexGuard<'_, Option<Renew>> {
        self.renew.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks for a fresh device once the current answer is written (the first reason stays).
    fn renew(&self, why: String, replay: Option<uapi::Set>) {
        self.renew_slot().get_or_insert(Renew { why, replay });
    }

    /// Tells the main loop, after an answer was written, if a request asked for a fresh device.
    fn renew_if_asked(&self) {
        if self.renew_slot().is_some() {
            self.broken.notify_one();
        }
    }
}

/// Accepts until aborted; a connection over the cap is closed at once (one log line per 10 s).
pub async fn accept(listener: UnixListener, shared: Arc<Shared>) {
    // The connections' tasks: aborted with this one when the attachment stops.
    let mut tasks = JoinSet::new();
    let mut refused = 0u64;
    let mut said = None::<Instant>;
    loop {
        while tasks.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and the like: at most one line a second until it clears.
                eprintln!("sticky-wg: accepting on the UAPI socket: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&shared.slots).try_acquire_owned() else {
            drop(stream);
            refused += 1;
            if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                eprintln!(
                    "sticky-wg: {MAX_CONNECTIONS} UAPI connections open; closed {refused} more \
                     (idle ones are closed after {}s)",
                    IDLE_TIMEOUT.as_secs()
                );
                said = Some(Instant::now());
                refused = 0;
            }
            continue;
        };
        tasks.spawn(serve(stream, Arc::clone(&shared), permit));
    }
}

/// Why a connection ends.
enum Stop {
    /// End of stream, a timeout or a read error: closed without an answer.
    Gone,
    /// A line over its bound, a request over its bound, or not UTF-8: this errno is answered,
    /// then the connection is closed (the rest of the stream cannot be read as requests).
    Refuse(uapi::Error),
}

/// Reads one line of at most [`MAX_LINE`] bytes within [`IDLE_TIMEOUT`]; never holds more.
async fn next_line<R>(r: &mut BufReader<R>, buf: &mut Vec<u8>) -> Result<String, Stop>
where
    R: tokio::io::AsyncRead + Unpin,
{
    buf.clear();
    let mut limited = (&mut *r).take(MAX_LINE as u64 + 1);
    let read = limited.read_until(b'\n', buf);
    match tokio::time::timeout(IDLE_TIMEOUT, read).await {
        Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Err(Stop::Gone),
        Ok(Ok(_)) => {}
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    } else if buf.len() > MAX_LINE {
        return Err(Stop::Refuse(uapi::Error::LineTooLong));
    } else {
        // A last line without its newline: the request is cut short, nothing is applied.
        return Err(Stop::Gone);
    }
    String::from_utf8(std::mem::take(buf)).map_err(|_| Stop::Refuse(uapi::Error::NotUtf8))
}

/// Serves one connection: requests one after the other until the client closes.
async fn serve(stream: UnixStream, shared: Arc<Shared>, _slot: OwnedSemaphorePermit) {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        let answer = match next_line(&mut r, &mut buf).await {
            Ok(first) if first.is_empty() => continue,
            Ok(first) => request(&first, &mut r, &mut buf, &shared).await,
            Err(stop) => Err(stop),
        };
        let text = match answer {
            Ok(Ok(text)) => text,
            Ok(Err(refusal)) => {
                eprintln!(
                    "sticky-wg: refused a UAPI request (errno={}): {refusal}",
                    refusal.errno()
                );
                format!("errno={}\n\n", refusal.errno())
            }
            Err(Stop::Gone) => return,
            Err(Stop::Refuse(e)) => {
                eprintln!(
                    "sticky-wg: refused a UAPI request (errno={}), closing the connection: {e}",
                    e.errno()
                );
                let _ = w
                    .write_all(format!("errno={}\n\n", e.errno()).as_bytes())
                    .await;
                let _ = w.shutdown().await;
                return;
            }
        };
        let written = w.write_all(text.as_bytes()).await;
        shared.renew_if_asked();
        if written.is_err() {
            return;
        }
    }
}

/// Reads the rest of the request that `first` opens and answers it: the answer's text, or
/// why it was refused. A refused request is still read to its empty line, so a client that is
/// still writing gets the answer.
async fn request<R>(
    first: &str,
    r: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    shared: &Shared,
) -> Result<Result<String, Refusal>, Stop>
where
    R: tokio::io::AsyncRead + Unpin,
{
    #[cfg(feature = "crash-points")]
    if first == "panic=1" {
        // Test-only (never in a release build): a panic inside a tokio task, where gotatun's
        // own panicked, to prove the hook ends the process.
        panic!("crash point: panic=1 over UAPI");
    }
    let opening = match uapi::open(first) {
        Ok(opening) => opening,
        Err(e) => {
            drain(r, buf).await?;
            return Ok(Err(e.into()));
        }
    };
    let mut reader = match opening {
        Opening::Get => {
            if let Err(e) = uapi::get_line(&next_line(r, buf).await?) {
                drain(r, buf).await?;
                return Ok(Err(e.into()));
            }
            return Ok(get(shared).await);
        }
        Opening::Set(reader) => reader,
    };
    // Held while the body is read: one request body in memory at a time. The whole body has
    // REQUEST_TIMEOUT, so a client sending a line every few seconds cannot keep the lock.
    let mut book = shared.book.lock().await;
    let read = async {
        let mut budget = uapi::Budget::default();
        let mut refused = None;
        loop {
            let line = next_line(r, buf).await?;
            if line.is_empty() {
                return Ok(refused);
            }
            budget.take(&line).map_err(Stop::Refuse)?;
            // After the first refusal the rest is read but not kept.
            if refused.is_none()
                && let Err(e) = reader.line(&line)
            {
                refused = Some(e);
            }
        }
    };
    let refused = tokio::time::timeout(REQUEST_TIMEOUT, read)
        .await
        .map_err(|_| Stop::Gone)??;
    Ok(match refused {
        Some(e) => Err(e.into()),
        None => set_request(shared, &mut book, reader.finish()).await,
    })
}

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("{0}")]
    Uapi(#[from] uapi::Error),
    #[error("{0}")]
    Book(#[from] book::Error),
    #[error("UDP port {0} is in use: the tunnel could not come up")]
    PortInUse(u16),
    #[error("gotatun refused a checked request (errno={0}); attaching a fresh device")]
    Gotatun(i32),
    #[error("gotatun's configuration task no longer answers; attaching a fresh device")]
    Deaf,
}

impl Refusal {
    fn errno(&self) -> i32 {
        match self {
            Refusal::Uapi(e) => e.errno(),
            Refusal::Book(e) => e.errno(),
            Refusal::PortInUse(_) => errno::EADDRINUSE,
            Refusal::Gotatun(n) => *n,
            Refusal::Deaf => errno::EIO,
        }
    }
}

/// Reads (and drops) the rest of a refused request, bounded as a request is.
async fn drain<R>(r: &mut BufReader<R>, buf: &mut Vec<u8>) -> Result<(), Stop>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut budget = uapi::Budget::default();
    loop {
        let line = next_line(r, buf).await?;
        if line.is_empty() {
            return Ok(());
        }
        budget.take(&line).map_err(Stop::Refuse)?;
    }
}

/// `get=1`: gotatun's answer, with the peers sticky-wg holds while there is no key.
async fn get(shared: &Shared) -> Result<String, Refusal> {
    let book = shared.book.lock().await;
    let Ok(Response::Get(mut response)) = shared.client.send(Get::default()).await else {
        return Err(deaf(shared));
    };
    for (key, held) in book.pending() {
        let mut peer = GetPeer::new(*key);
        peer.peer.preshared_key = held.preshared_key.map(|k| SetUnset::Set(k.into()));
        peer.peer.endpoint = held.endpoint;
        peer.peer.persistent_keepalive_interval = held.persistent_keepalive;
        peer.peer.allowed_ip = held.allowed_ips.iter().filter_map(network).collect();
        peer.last_handshake_time_sec = Some(0);
        peer.last_handshake_time_nsec = Some(0);
        peer.rx_bytes = Some(0);
        peer.tx_bytes = Some(0);
        response.peers.push(peer);
    }
    // gotatun's text ends with `errno=0\n`; the empty line ends the answer.
    Ok(format!("{response}\n"))
}

/// `set=1`, checked: planned against the book, sent, and the book moved on once gotatun said 0.
async fn set_request(
    shared: &Shared,
    book: &mut Book,
    mut request: uapi::Set,
) -> Result<String, Refusal> {
    let settings =
        request.private_key.is_some() || request.listen_port.is_some() || request.fwmark.is_some();
    if settings && matches!(book, Book::Keyed { .. }) {
        let now = running(shared).await?;
        let mut same = request.clone();
        match book::unchanged_settings(&mut same, &now.settings) {
            Ok(()) => request = same,
            Err(book::Error::Running { what }) => {
                return renew_with(shared, &now, &request, what);
            }
            Err(e) => return Err(e.into()),
        }
    }
    let plan = book.plan(&request)?;
    let held = book.pending().count();
    if plan.send.private_key.is_some() {
        // The key brings the tunnel up: gotatun binds its port then, and a port in use would
        // leave it keyed with no tunnel (errno 22, the key applied). Checked first.
        let port = match plan.send.listen_port {
            Some(port) => port,
            None => running(shared).await?.settings.listen_port,
        };
        if port != 0 && port_taken(port) {
            return Err(Refusal::PortInUse(port));
        }
    }
    match shared
        .client
        .send(GotatunRequest::Set(gotatun_set(&plan.send)))
        .await
    {
        Ok(Response::Set(r)) if r.errno == 0 => {}
        Ok(Response::Set(r)) => {
            // gotatun applies as it goes: after a refusal its state is not known. A fresh
            // device (empty, as after a restart) is better than a half-configured one.
            shared.renew(
                format!("gotatun refused a checked request (errno={})", r.errno),
                None,
            );
            return Err(Refusal::Gotatun(r.errno));
        }
        Ok(Response::Get(_)) | Err(_) => return Err(deaf(shared)),
    }
    *book = plan.after;
    shared.relay.changed();
    if held > 0 && matches!(book, Book::Keyed { .. }) {
        eprintln!("sticky-wg: the private key came; {held} peer(s) held until then are configured");
    }
    Ok("errno=0\n\n".to_string())
}

/// A request that changes a running device's key, port or fwmark: gotatun 0.10.2 cannot rebind
/// a running device, so a fresh one is made with the running configuration and the request on
/// top (book::replay), as a restart and the agent's next round would, without the round. The
/// request is checked first (peer cap, a new port in use), so an accepted one is applied.
fn renew_with(
    shared: &Shared,
    now: &Now,
    request: &uapi::Set,
    what: &'static str,
) -> Result<String, Refusal> {
    let replay = book::replay(&now.settings, now.peers.clone(), request)?;
    if let Some(port) = request.listen_port
        && port != 0
        && port != now.settings.listen_port
        && port_taken(port)
    {
        return Err(Refusal::PortInUse(port));
    }
    shared.renew(
        format!(
            "{what} changes (gotatun cannot rebind a running device): a fresh device takes the \
             new settings and the {} peer(s), which handshake again",
            replay.peers.len()
        ),
        Some(replay),
    );
    Ok("errno=0\n\n".to_string())
}

/// What gotatun reports: its settings and its peers as configuration.
struct Now {
    settings: book::Running,
    peers: BTreeMap<Key, PendingPeer>,
}

/// The device as gotatun has it now.
async fn running(shared: &Shared) -> Result<Now, Refusal> {
    let Ok(Response::Get(now)) = shared.client.send(Get::default()).await else {
        return Err(deaf(shared));
    };
    let peers = now
        .peers
        .iter()
        .map(|p| {
            let held = PendingPeer {
                preshared_key: match &p.peer.preshared_key {
                    Some(SetUnset::Set(k)) => Some(k.0),
                    _ => None,
                },
                endpoint: p.peer.endpoint,
                persistent_keepalive: p.peer.persistent_keepalive_interval,
                allowed_ips: p
                    .peer
                    .allowed_ip
                    .iter()
                    .map(|n| AllowedIp {
                        addr: n.ip(),
                        prefix: n.prefix(),
                    })
                    .collect(),
            };
            (p.peer.public_key.0, held)
        })
        .collect();
    Ok(Now {
        settings: book::Running {
            private_key: now.private_key.map(|k| k.0),
            listen_port: now.listen_port.unwrap_or(0),
            fwmark: now.fwmark.unwrap_or(0),
        },
        peers,
    })
}

/// gotatun's configuration task no longer answers: a fresh device, once this answer is out.
fn deaf(shared: &Shared) -> Refusal {
    shared.renew("gotatun no longer answers".into(), None);
    Refusal::Deaf
}

/// True when another socket holds UDP `port` (gotatun binds `[::]:port`, dual stack).
fn port_taken(port: u16) -> bool {
    let in_use = |r: std::io::Result<std::net::UdpSocket>| matches!(r, Err(e) if e.kind() == std::io::ErrorKind::AddrInUse);
    match std::net::UdpSocket::bind((Ipv6Addr::UNSPECIFIED, port)) {
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => true,
        // No IPv6: gotatun falls back to IPv4 too.
        Err(_) => in_use(std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port))),
    }
}

/// The typed request as gotatun's.
fn gotatun_set(set: &uapi::Set) -> GotatunSet {
    let mut out = GotatunSet::default();
    out.private_key = set.private_key.map(Into::into);
    out.listen_port = set.listen_port;
    out.fwmark = set.fwmark.map(|m| match NonZeroU32::new(m) {
        Some(m) => SetUnset::Set(m),
        None => SetUnset::Unset,
    });
    out.replace_peers = set.replace_peers;
    for change in &set.peers {
        let mut peer = SetPeer::new(change.public_key);
        peer.remove = change.remove;
        peer.update_only = change.update_only;
        peer.replace_allowed_ips = change.replace_allowed_ips;
        peer.peer.preshared_key = change.preshared_key.map(|k| {
            if k == [0; 32] {
                SetUnset::Unset
            } else {
                SetUnset::Set(k.into())
            }
        });
        peer.peer.endpoint = change.endpoint;
        peer.peer.persistent_keepalive_interval = change.persistent_keepalive;
        peer.peer.allowed_ip = change.allowed_ips.iter().filter_map(network).collect();
        out.peers.push(peer);
    }
    out
}

/// An allowed IP as gotatun's type (the parser checked the prefix, so none is dropped).
fn network(ip: &AllowedIp) -> Option<ipnetwork::IpNetwork> {
    ipnetwork::IpNetwork::new(ip.addr, ip.prefix).ok()
}
