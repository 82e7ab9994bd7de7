//! `--metrics-addr`: `/metrics` (Prometheus text format) and `/healthz`, one request per
//! connection.
//!
//! A liveness probe restarts the agent when `/healthz` does not answer, so no client may
//! starve or bloat this server (issue 19). Each connection is served on a thread of its own,
//! at most [`Limits::connections`] at once. A request head (request line and headers) is read
//! through a hard byte cap, and must be complete within a deadline counted from the accept,
//! not per read, so a byte every few seconds cannot stretch it; over the cap the answer is
//! `431`, over the deadline the connection is closed. When every slot is taken, the new
//! connection gets the slot of the one that has been sending its head the longest (a real
//! client sends its head at once: that one is slow or stuck), which is cut; when no connection
//! is still sending its head, the new one is answered `503` at once. So misbehaving clients
//! cannot keep `/healthz` waiting: it is answered as soon as its own head is in. A cut
//! connection's thread ends at once, and those still ending count against twice the cap: there
//! are never more than 96 connection threads (each with a small stack).

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::state::Shared;

/// `/healthz` fails when the main loop has not gone round for this long (it goes round every
/// half second): the agent is stuck, not merely offline.
const STUCK: Duration = Duration::from_secs(30);

/// How much the server lets its clients take.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Connections served at once.
    connections: usize,
    /// Bytes of a request head, request line and headers together.
    head_bytes: u64,
    /// Time from the accept to the end of the head.
    head_time: Duration,
}

const LIMITS: Limits = Limits {
    connections: 48,
    head_bytes: 8 * 1024,
    head_time: Duration::from_secs(5),
};

/// A connection thread's stack: it parses a head of at most 8 KiB and formats the metrics.
const STACK: usize = 256 * 1024;

/// An answer is written with one `write` into the socket's send buffer (it is a few KiB), so
/// this bounds a client that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a connection got no answer to its request (it is closed).
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("the request head is over {0} bytes")]
    TooLarge(u64),
    #[error("the request head did not arrive within {0:?}")]
    TooSlow(Duration),
    #[error("the connection ended before the request head did")]
    Ended,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Serves `/metrics` and `/healthz` on `addr` from a thread of its own; returns the address
/// bound (its port when `addr`'s is 0). An address other machines can reach (the flags allow it
/// only with `--metrics-allow-remote`) is logged as a warning.
pub fn start(addr: SocketAddr, shared: Shared) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    if !bound.ip().to_canonical().is_loopback() {
        super::log(&format!(
            "WARNING: serving /metrics and /healthz on {bound}, reachable from other machines: \
             anyone who reaches it reads the metrics and loads the agent, without credentials; \
             prefer 127.0.0.1 or firewall the port"
        ));
    }
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || listen(&listener, &shared, LIMITS))?;
    Ok(bound)
}

fn listen(listener: &TcpListener, shared: &Shared, limits: Limits) {
    let slots = Slots::new(limits.connections);
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(conn) => conn,
            Err(_) => {
                // Out of file descriptors, say: let the connections being served end.
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        match slots.take(&conn) {
            Ok(Some(held)) => {
                let shared = shared.clone();
                // If no thread can be started, the closure drops: the connection is closed.
                let _ = std::thread::Builder::new()
                    .stack_size(STACK)
                    .spawn(move || {
                        let _ = serve(&conn, &shared, &held, limits);
                    });
            }
            Ok(None) | Err(_) => busy(&conn),
        }
    }
}

/// Every slot's connection is being answered: say so at once rather than queue. A fresh
/// socket's send buffer is empty, so this write does not wait for the client.
fn busy(conn: &TcpStream) {
    let _ = conn.set_nonblocking(true);
    let _ = respond(
        conn,
        "503 Service Unavailable",
        "too many connections to the metrics server\n",
        true,
    );
}

fn serve(conn: &TcpStream, shared: &Shared, held: &Held, limits: Limits) -> Result<(), Error> {
    conn.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let head = match read_head(conn, limits) {
        Err(Error::TooLarge(n)) => {
            respond(
                conn,
                "431 Request Header Fields Too Large",
                "request head too large\n",
                true,
            )?;
            return Err(Error::TooLarge(n));
        }
        head => head?,
    };
    held.head_read();
    let (status, body) = route(&head, shared);
    // The answer to `HEAD` is the same without its body.
    Ok(respond(conn, status, &body, !head.starts_with(b"HEAD "))?)
}

/// The request head, through its blank line: at most `limits.head_bytes`, complete within
/// `limits.head_time` of the call however the bytes trickle in.
fn read_head(conn: &TcpStream, limits: Limits) -> Result<Vec<u8>, Error> {
    let start = Instant::now();
    let mut input = conn.take(limits.head_bytes);
    let mut head = Vec::new();
    let mut chunk = [0; 1024];
    loop {
        let left = limits.head_time.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(Error::TooSlow(limits.head_time));
        }
        conn.set_read_timeout(Some(left))?;
        let n = match input.read(&mut chunk) {
            Ok(0) if input.limit() == 0 => return Err(Error::TooLarge(limits.head_bytes)),
            Ok(0) => return Err(Error::Ended),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(Error::TooSlow(limits.head_time));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        // The blank line may straddle two reads.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = end_of_head(&head[from..]) {
            head.truncate(from + end);
            return Ok(head);
        }
    }
}

/// Where the blank line that ends a head ends in `bytes` (`\r\n\r\n`, or a bare `\n\n`).
fn end_of_head(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|i| {
        let rest = &bytes[i..];
        if rest.starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if rest.starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

/// The answer to a request head: status and body.
fn route(head: &[u8], shared: &Shared) -> (&'static str, String) {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut words = std::str::from_utf8(line)
        .unwrap_or_default()
        .split_whitespace();
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return ("400 Bad Request", "bad request\n".into());
    };
    let path = target.split('?').next().unwrap_or_default();
    if !matches!(path, "/metrics" | "/healthz") {
        let body = "not found: try /metrics or /healthz\n".into();
        return ("404 Not Found", body);
    }
    if !matches!(method, "GET" | "HEAD") {
        return ("405 Method Not Allowed", "use GET\n".into());
    }
    match path {
        "/metrics" => ("200 OK", shared.metrics()),
        _ if shared.lock().alive.elapsed() < STUCK => ("200 OK", "ok\n".into()),
        _ => (
            "503 Service Unavailable",
            "the agent's main loop is stuck\n".into(),
        ),
    }
}

fn respond(mut conn: &TcpStream, status: &str, body: &str, send_body: bool) -> io::Result<()> {
    let allow = if status.starts_with("405") {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let message = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
         {allow}Connection: close\r\n\r\n{}",
        body.len(),
        if send_body { body } else { "" }
    );
    conn.write_all(message.as_bytes())
}

/// The connections being served, shared by the accepting thread and the connections' own.
#[derive(Clone)]
struct Slots(Arc<Mutex<SlotList>>);

struct SlotList {
    /// Connections served at once; as many again that were cut may still be ending.
    cap: usize,
    next_id: u64,
    /// One per connection thread, until it ends.
    taken: Vec<Slot>,
}

struct Slot {
    id: u64,
    since: Instant,
    /// The connection (a second handle), to cut it when a new one needs its slot.
    conn: TcpStream,
    phase: Phase,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Reading its request head.
    Head,
    /// Being answered: keeps its slot.
    Answer,
    /// Cut to make room: its read returns at once and its thread ends.
    Cut,
}

/// A connection's hold on its slot, given back when dropped.
struct Held {
    slots: Slots,
    id: u64,
}

impl Slots {
    fn new(cap: usize) -> Slots {
        Slots(Arc::new(Mutex::new(SlotList {
            cap,
            next_id: 0,
            taken: Vec::new(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, SlotList> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for `conn`: a free one, else that of the connection which has been reading its
    /// head the longest, which is cut. `None` when every connection is being answered, or
    /// when those cut have not ended yet (so there are never more than twice `cap` threads).
    fn take(&self, conn: &TcpStream) -> io::Result<Option<Held>> {
        let mut list = self.lock();
        let serving = list.taken.iter().filter(|s| s.phase != Phase::Cut).count();
        if serving >= list.cap {
            if list.taken.len() >= 2 * list.cap {
                return Ok(None);
            }
            let slowest = (list.taken.iter_mut())
                .filter(|s| s.phase == Phase::Head)
                .min_by_key(|s| s.since);
            let Some(slowest) = slowest else {
                return Ok(None);
            };
            slowest.phase = Phase::Cut;
            let _ = slowest.conn.shutdown(Shutdown::Both);
        }
        let handle = conn.try_clone()?;
        list.next_id += 1;
        let id = list.next_id;
        list.taken.push(Slot {
            id,
            since: Instant::now(),
            conn: handle,
            phase: Phase::Head,
        });
        Ok(Some(Held {
            slots: self.clone(),
            id,
        }))
    }
}

impl Held {
    /// The head is in: the connection keeps its slot until it is answered.
    fn head_read(&self) {
        let mut list = self.slots.lock();
        let slot = list.taken.iter_mut().find(|s| s.id == self.id);
        if let Some(slot) = slot.filter(|s| s.phase == Phase::Head) {
            slot.phase = Phase::Answer;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.slots.lock().taken.retain(|s| s.id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sticky_vxlan::status::Status;

    /// A server on 127.0.0.1 with `limits`.
    fn server(limits: Limits) -> (SocketAddr, Shared) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Shared::new(Status::default());
        let s = shared.clone();
        std::thread::spawn(move || listen(&listener, &s, limits));
        (addr, shared)
    }

    /// Sends `request` and reads the answer to its end (the server closes).
    fn ask(addr: SocketAddr, request: &str) -> String {
        let mut conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        answer
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        ask(addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"))
    }

    /// True when the server closed `conn` (EOF or reset) within `within`.
    fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
        conn.set_read_timeout(Some(within)).unwrap();
        let mut sink = Vec::new();
        match conn.read_to_end(&mut sink) {
            Ok(_) => true,
            Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
        }
    }

    #[test]
    fn answers_get_and_head_on_its_two_paths_and_refuses_the_rest() {
        let (addr, shared) = server(LIMITS);
        let metrics = get(addr, "/metrics");
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(metrics.contains("sticky_vxlan_agent_peers"), "{metrics}");
        assert!(get(addr, "/healthz?verbose").ends_with("\r\n\r\nok\n"));
        let head = ask(addr, "HEAD /healthz HTTP/1.1\n\n");
        assert!(ask(addr, "HEAD /x HTTP/1.1\r\n\r\n").ends_with("\r\n\r\n"));
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        let post = ask(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 ") && post.contains("\r\nAllow: GET, HEAD\r\n"));
        assert!(get(addr, "/").starts_with("HTTP/1.1 404 "));
        assert!(ask(addr, "\r\n\r\n").starts_with("HTTP/1.1 400 "));
        shared.lock().alive = Instant::now()
            .checked_sub(STUCK + Duration::from_secs(1))
            .unwrap();
        assert!(get(addr, "/healthz").starts_with("HTTP/1.1 503 "));
    }

    #[test]
    fn a_head_over_the_byte_cap_is_answered_431_and_closed() {
        let (addr, _) = server(LIMITS);
        let line = "a".repeat(8 * 1024);
        assert!(ask(addr, &line).starts_with("HTTP/1.1 431 "));
        // Just under the cap is a request like any other.
        let padded = format!("GET /healthz HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(8100));
        assert!(ask(addr, &padded).starts_with("HTTP/1.1 200 "));
        // A client that sends on and on is cut after the cap, not read to its end.
        let mut conn = TcpStream::connect(addr).unwrap();
        conn.set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let chunk = vec![b'a'; 64 * 1024];
        let sent = (0..1024)
            .take_while(|_| conn.write_all(&chunk).is_ok())
            .count();
        assert!(sent < 1024, "64 MiB without a newline were all read");
    }

    #[test]
    fn a_head_trickled_in_is_cut_at_the_deadline_counted_from_the_accept() {
        let limits = Limits {
            head_time: Duration::from_millis(600),
            ..LIMITS
        };
        let (addr, _) = server(limits);
        let mut conn = TcpStream::connect(addr).unwrap();
        let start = Instant::now();
        // A byte every 200 ms: each read is quick, the head is not.
        let mut cut = None;
        for b in b"GET /healthz HTTP/1.1\r\n" {
            if conn.write_all(&[*b]).is_err() {
                cut = Some(start.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let cut = cut.unwrap_or_else(|| {
            assert!(closed_within(&mut conn, Duration::from_secs(5)));
            start.elapsed()
        });
        assert!(cut < Duration::from_secs(2), "cut after {cut:?}");
    }

    #[test]
    fn slow_heads_give_way_to_a_new_connection() {
        let limits = Limits {
            connections: 2,
            ..LIMITS
        };
        let (addr, _) = server(limits);
        let mut silent: Vec<TcpStream> =
            (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        // Both are served (their threads wait for a head) before the next comes.
        assert!(!closed_within(&mut silent[0], Duration::from_millis(200)));
        let start = Instant::now();
        assert!(get(addr, "/healthz").ends_with("\r\n\r\nok\n"));
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(
            closed_within(&mut silent[0], Duration::from_secs(1)),
            "the oldest silent connection gave its slot"
        );
        assert!(!closed_within(&mut silent[1], Duration::from_millis(200)));
    }

    #[test]
    fn slots_cut_the_slowest_head_and_are_busy_when_none_can_give_way() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // (client, server side)
        let pair = || {
            let client = TcpStream::connect(addr).unwrap();
            (client, listener.accept().unwrap().0)
        };
        let (mut clients, servers): (Vec<_>, Vec<_>) = (0..6).map(|_| pair()).unzip();
        let slots = Slots::new(2);
        let take = |i: usize| slots.take(&servers[i]).unwrap();
        let (a, b) = (take(0).unwrap(), take(1).unwrap());
        a.head_read();
        b.head_read();
        assert!(take(5).is_none(), "both are being answered");
        busy(&servers[5]);
        servers[5].shutdown(Shutdown::Write).unwrap();
        let mut answer = String::new();
        clients[5].read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");

        drop(a);
        let c = take(2).unwrap();
        let d = take(3).unwrap();
        assert!(closed_within(&mut clients[2], Duration::from_secs(1)));
        let e = take(4).unwrap();
        assert!(closed_within(&mut clients[3], Duration::from_secs(1)));
        assert!(
            take(0).is_none(),
            "b answering, e reading, c and d cut but still ending: four threads"
        );
        drop(c);
        assert!(take(0).is_some(), "e gives way");
        assert!(closed_within(&mut clients[4], Duration::from_secs(1)));
        drop((b, d, e));
    }
}
