//! `--metrics-addr`: `/metrics` (Prometheus text format) and `/healthz`, one request per
//! connection, on a thread of its own.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::state::Shared;

/// `/healthz` fails when the main loop has not gone round for this long (it goes round every
/// half second): the agent is stuck, not merely offline.
const STUCK: Duration = Duration::from_secs(30);

pub fn start(addr: SocketAddr, shared: Shared) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let _ = answer(conn, &shared);
        }
    });
    Ok(bound)
}

fn answer(conn: TcpStream, shared: &Shared) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Drain the headers.
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or_default();
    let (status, body) = match path {
        "/metrics" => ("200 OK", shared.metrics()),
        "/healthz" if shared.lock().alive.elapsed() < STUCK => ("200 OK", "ok\n".to_string()),
        "/healthz" => (
            "503 Service Unavailable",
            "the agent's main loop is stuck\n".to_string(),
        ),
        _ => (
            "404 Not Found",
            "not found: try /metrics or /healthz\n".to_string(),
        ),
    };
    let mut conn = conn;
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
