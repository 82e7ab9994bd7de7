//! A small blocking HTTP/1.1 client: one connection per request (`Connection: close`), over
//! TLS (rustls) or plain TCP, with `Content-Length`, chunked and read-to-close bodies. That is
//! all the API server (or an edge cache in front of it) needs from the agent: a list, a
//! long-lived watch stream read line by line, and a PATCH.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host:?} is not a valid TLS server name")]
    ServerName { host: String },
    #[error("TLS with {host}: {source}")]
    Tls {
        host: String,
        #[source]
        source: rustls::Error,
    },
    #[error("talking to {addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{addr} answered something that is not HTTP/1.1: {what}")]
    Protocol { addr: String, what: String },
}

/// Where to connect: host, port and TLS settings (none for plain HTTP).
#[derive(Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Target {
    fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// One request.
pub struct Request<'a> {
    pub method: &'a str,
    /// Path and query, e.g. `/api/v1/nodes?watch=1`.
    pub path: &'a str,
    pub headers: Vec<(&'a str, String)>,
    pub body: Option<&'a [u8]>,
    /// How long a read may wait for the next byte (a watch waits longer than a list).
    pub read_timeout: Duration,
}

enum Framing {
    Length(u64),
    /// Bytes left in the current chunk; `started` once a chunk was read (its CRLF follows).
    Chunked {
        left: u64,
        done: bool,
        started: bool,
    },
    UntilClose,
}

/// A response: status, headers, and the body as a reader.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<Stream>,
    framing: Framing,
    addr: String,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_HEAD: usize = 64 * 1024;

/// Sends `req` to `target` and reads the response head.
pub fn send(target: &Target, req: &Request<'_>) -> Result<Response, Error> {
    let addr = target.addr();
    let io = |source| Error::Io {
        addr: addr.clone(),
        source,
    };
    let connect = |source| Error::Connect {
        addr: addr.clone(),
        source,
    };
    let sock_addr = addr
        .to_socket_addrs()
        .map_err(connect)?
        .next()
        .ok_or_else(|| connect(std::io::Error::other("no address")))?;
    let tcp = TcpStream::connect_timeout(&sock_addr, CONNECT_TIMEOUT).map_err(connect)?;
    tcp.set_read_timeout(Some(req.read_timeout)).map_err(io)?;
    tcp.set_write_timeout(Some(req.read_timeout)).map_err(io)?;
    let _ = tcp.set_nodelay(true);
    let mut stream = match &target.tls {
        None => Stream::Plain(tcp),
        Some(cfg) => {
            let name =
                ServerName::try_from(target.host.clone()).map_err(|_| Error::ServerName {
                    host: target.host.clone(),
                })?;
            let conn =
                rustls::ClientConnection::new(cfg.clone(), name).map_err(|source| Error::Tls {
                    host: target.host.clone(),
                    source,
                })?;
            Stream::Tls(Box::new(rustls::StreamOwned::new(conn, tcp)))
        }
    };
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        req.method,
        req.path,
        if target.port == 443 {
            target.host.clone()
        } else {
            addr.clone()
        }
    );
    for (k, v) in &req.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(body) = req.body {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(req.body.unwrap_or_default());
    stream.write_all(&out).map_err(io)?;
    stream.flush().map_err(io)?;
    read_head(BufReader::new(stream), addr)
}

fn read_head(mut reader: BufReader<Stream>, addr: String) -> Result<Response, Error> {
    let proto = |what: String| Error::Protocol {
        addr: addr.clone(),
        what,
    };
    let mut lines = Vec::new();
    let mut total = 0;
    loop {
        let mut line = Vec::new();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|source| Error::Io {
                addr: addr.clone(),
                source,
            })?;
        if n == 0 {
            return Err(proto(
                "the connection closed before the response head ended".into(),
            ));
        }
        total += n;
        if total > MAX_HEAD {
            return Err(proto("response head longer than 64 KiB".into()));
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        if text.is_empty() {
            break;
        }
        lines.push(text);
    }
    let status_line = lines.first().cloned().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Err(proto(format!("status line {status_line:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(proto(format!("status line {status_line:?}")));
    }
    let status: u16 = code
        .parse()
        .map_err(|_| proto(format!("status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines[1..]
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let framing = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        Framing::Chunked {
            left: 0,
            done: false,
            started: false,
        }
    } else if let Some(len) = header("content-length") {
        Framing::Length(
            len.parse()
                .map_err(|_| proto(format!("Content-Length {len:?}")))?,
        )
    } else {
        Framing::UntilClose
    };
    Ok(Response {
        status,
        headers,
        reader,
        framing,
        addr,
    })
}

impl Response {
    /// Reads the whole body, at most `limit` bytes.
    pub fn body(mut self, limit: u64) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        let addr = self.addr.clone();
        (&mut self)
            .take(limit + 1)
            .read_to_end(&mut out)
            .map_err(|source| Error::Io { addr, source })?;
        if out.len() as u64 > limit {
            return Err(Error::Protocol {
                addr: self.addr,
                what: format!("a body longer than {limit} bytes"),
            });
        }
        Ok(out)
    }

    /// The next line of the body (without the newline); `None` at the end of the body.
    pub fn next_line(&mut self, limit: u64) -> Result<Option<Vec<u8>>, Error> {
        let mut line = Vec::new();
        let addr = self.addr.clone();
        let mut r = BufReader::with_capacity(1, self.by_ref().take(limit + 1));
        // A byte-at-a-time reader over the buffered body: the stream's own buffer does the work.
        r.read_until(b'\n', &mut line)
            .map_err(|source| Error::Io { addr, source })?;
        if line.is_empty() {
            return Ok(None);
        }
        if line.len() as u64 > limit {
            return Err(Error::Protocol {
                addr: self.addr.clone(),
                what: format!("a line longer than {limit} bytes"),
            });
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        } else {
            // The body ended in the middle of a line: that is a cut stream, not an event.
            return Err(Error::Protocol {
                addr: self.addr.clone(),
                what: "the stream ended in the middle of a line".into(),
            });
        }
        Ok(Some(line))
    }

    fn chunk_header(&mut self) -> std::io::Result<u64> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line)?;
        let text = String::from_utf8_lossy(&line);
        let size = text.trim().split(';').next().unwrap_or_default().trim();
        if line.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the connection closed inside a chunked body",
            ));
        }
        u64::from_str_radix(size, 16).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad chunk size {size:?}"),
            )
        })
    }

    fn chunk_end(&mut self) -> std::io::Result<()> {
        let mut crlf = Vec::new();
        self.reader.read_until(b'\n', &mut crlf)?;
        if crlf.trim_ascii().is_empty() && !crlf.is_empty() {
            Ok(())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "chunk not followed by CRLF",
            ))
        }
    }
}

impl Read for Response {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.framing {
            Framing::UntilClose => self.reader.read(buf),
            Framing::Length(0) => Ok(0),
            Framing::Length(left) => {
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let n = self.reader.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("the connection closed with {left} body bytes missing"),
                    ));
                }
                self.framing = Framing::Length(left - n as u64);
                Ok(n)
            }
            Framing::Chunked { done: true, .. } => Ok(0),
            Framing::Chunked {
                left: 0, started, ..
            } => {
                if started {
                    self.chunk_end()?;
                }
                let size = self.chunk_header()?;
                if size == 0 {
                    // Trailers, then the empty line.
                    loop {
                        let mut line = Vec::new();
                        if self.reader.read_until(b'\n', &mut line)? == 0
                            || line.trim_ascii().is_empty()
                        {
                            break;
                        }
                    }
                    self.framing = Framing::Chunked {
                        left: 0,
                        done: true,
                        started: true,
                    };
                    return Ok(0);
                }
                self.framing = Framing::Chunked {
                    left: size,
                    done: false,
                    started: true,
                };
                self.read(buf)
            }
            Framing::Chunked { left, .. } => {
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let n = self.reader.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the connection closed inside a chunk",
                    ));
                }
                self.framing = Framing::Chunked {
                    left: left - n as u64,
                    done: false,
                    started: true,
                };
                Ok(n)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn serve_once(reply: &'static [u8]) -> Target {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            s.write_all(reply).unwrap();
        });
        Target {
            host: "127.0.0.1".into(),
            port,
            tls: None,
        }
    }

    fn get(t: &Target) -> Response {
        send(
            t,
            &Request {
                method: "GET",
                path: "/",
                headers: vec![],
                body: None,
                read_timeout: Duration::from_secs(5),
            },
        )
        .unwrap()
    }

    #[test]
    fn chunked_lines_across_chunk_boundaries() {
        let t = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\n{\"a\"\r\n3\r\n:1}\r\n2\r\n\n{\r\n2\r\n}\n\r\n0\r\n\r\n",
        );
        let mut r = get(&t);
        assert_eq!(r.status, 200);
        assert_eq!(r.next_line(100).unwrap().unwrap(), b"{\"a\":1}");
        assert_eq!(r.next_line(100).unwrap().unwrap(), b"{}");
        assert_eq!(r.next_line(100).unwrap(), None);
    }

    #[test]
    fn a_body_cut_short_is_an_error_not_a_short_body() {
        let t = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345");
        assert!(get(&t).body(100).is_err());
        let t = serve_once(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n12345");
        assert!(get(&t).body(100).is_err());
        let t = serve_once(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{}\n");
        let mut r = get(&t);
        assert!(r.next_line(100).is_ok());
        assert!(
            r.next_line(100).is_err(),
            "no last chunk: the stream was cut"
        );
        let t = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc");
        assert_eq!(get(&t).body(100).unwrap(), b"abc");
        let t = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc");
        assert!(get(&t).body(2).is_err(), "over the limit");
    }
}
