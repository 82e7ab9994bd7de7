//! The real [`NodeApi`]: the Kubernetes API over HTTP(S) with `ureq` (blocking, rustls with
//! ring, every resolved address tried, the proxy client-go would use ([`super::proxy`]), a
//! timeout on every read).
//!
//! Everything the server sends is bounded before it is believed: a list body is parsed as it
//! streams (only the kept fields of each Node stay in memory, see [`super::objects`]) and
//! stops at [`LIST_BODY_LIMIT`] bytes and `--max-nodes` nodes ([`DEFAULT_MAX_NODES`]); a list
//! stops at [`max_pages`] pages; one watch event is at most [`EVENT_LIMIT`] bytes; an error body is read up to
//! [`ERROR_BODY_LIMIT`]. The watch's socket is read at most once per [`paced::WINDOW`].

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use serde::Deserialize;
use ureq::Agent;
use ureq::http::Response;
use ureq::unversioned::resolver::DefaultResolver;
use ureq::unversioned::transport::{
    ConnectProxyConnector, Connector, RustlsConnector, TcpConnector,
};

use super::api::{ApiError, Events, ListFrom, NodeApi, NodePage};
use super::endpoint::Endpoint;
use super::objects::{Event, ListMeta, Node, Status};

pub mod paced;
pub mod proto;

/// What the agent calls itself (YurtHub caches only the agents listed in its `cache_agents`,
/// by this name).
pub const USER_AGENT_NAME: &str = "sticky-vxlan-agent";
/// One list response (a 5,000-node list from the watch cache, unpaged, is 50-200 MB on the
/// wire; only a few MB of it is kept).
pub const LIST_BODY_LIMIT: u64 = 1024 * 1024 * 1024;
/// Nodes in one list, all pages together, unless `--max-nodes` says (Kubernetes supports
/// 5,000; the largest clusters published hold 65,000 to 130,000).
pub const DEFAULT_MAX_NODES: usize = 10_000;
/// The longest JSON string believed (etcd keeps objects of up to 1.5 MiB): a longer one,
/// anywhere in a list or an event, fails the read before it is held in memory whole.
pub const MAX_STRING: u64 = 1024 * 1024;
/// Pages in one list of at most `max_nodes` Nodes: 200 for 10,000 (ten times the pages of
/// 500 they fill), so that a server sending a new continue token forever is stopped.
pub fn max_pages(max_nodes: usize) -> usize {
    max_nodes / 50
}
/// One watch event (one Node object: etcd's limit is 1.5 MiB).
pub const EVENT_LIMIT: u64 = 4 * 1024 * 1024;
/// The body of an error answer.
pub const ERROR_BODY_LIMIT: u64 = 64 * 1024;
/// Nodes asked for per page.
const PAGE: usize = 500;
/// No byte for this long means a watch connection is dead (a real API server sends a
/// bookmark about every minute): the watch is resumed on a new connection.
const WATCH_SILENCE: Duration = Duration::from_secs(150);
/// A watch not ended by the server this long after its `timeoutSeconds` is dropped, whatever
/// bytes that are no event (blank keepalive lines) it still brings: the agent lists again.
pub const WATCH_MARGIN: Duration = Duration::from_secs(30);
/// No byte for this long during a list or a patch.
const CALL_SILENCE: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Kube {
    agent: Agent,
    /// The watch's own agent: its socket is read at most once per [`paced::WINDOW`]. Its own,
    /// so that no list or patch is paced (connections are pooled per agent).
    watcher: Agent,
    endpoint: Endpoint,
    /// `--max-nodes`: the most Nodes one page may hold.
    max_nodes: usize,
    /// Shortens the watch's pace after a change ([`Kube::hurry`]).
    hurry: paced::Hurry,
}

impl Kube {
    pub fn new(endpoint: Endpoint) -> Kube {
        // ureq is built without a crypto provider of its own: ring, process-wide. Installing
        // it twice is harmless (the first one stays).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let user_agent = format!(
            "{USER_AGENT_NAME}/{} ({}/{})",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH
        );
        let config = || {
            let config = Agent::config_builder()
                .http_status_as_error(false)
                .user_agent(&user_agent)
                .accept("application/json")
                .accept_encoding("identity")
                .max_redirects(0)
                .timeout_connect(Some(CONNECT_TIMEOUT))
                .timeout_per_read(Some(CALL_SILENCE))
                .max_idle_connections(2);
            let config = match &endpoint.tls {
                Some(tls) => config.tls_config(tls.clone()),
                None => config,
            };
            // Exactly the proxy client-go's rules chose for this server (none for a loopback
            // one), never ureq's own reading of the environment.
            config.proxy(endpoint.proxy.as_ref().map(|p| p.proxy.clone()))
        };
        let hurry = paced::Hurry::default();
        let watcher = Agent::with_parts(
            config().input_buffer_size(paced::INPUT_BUFFER).build(),
            // ureq's default chain (its CONNECT proxy, TCP, rustls) with the pace between TCP
            // and TLS. No SOCKS: ureq is built without it, for lists too.
            ConnectProxyConnector::default()
                .chain(TcpConnector::default())
                .chain(paced::Pace(hurry.clone()))
                .chain(RustlsConnector::default()),
            DefaultResolver::default(),
        );
        Kube {
            agent: config().build().into(),
            watcher,
            endpoint,
            max_nodes: DEFAULT_MAX_NODES,
            hurry,
        }
    }

    /// What the reader of the watch's events sets when they bring a change: the watch's socket
    /// is then read again within [`paced::WINDOW`] ([`paced`]).
    pub fn hurry(&self) -> paced::Hurry {
        self.hurry.clone()
    }

    /// At most `n` Nodes in one page (`--max-nodes`).
    pub fn with_max_nodes(mut self, n: usize) -> Kube {
        self.max_nodes = n;
        self
    }

    fn authorization(&self) -> Result<Option<String>, ApiError> {
        self.endpoint
            .authorization()
            .map_err(|e| ApiError::Credentials(e.to_string()))
    }

    /// GET `path`; a non-2xx answer becomes the error it stands for.
    /// GET `path`, no byte for `silence` and the whole body within `deadline` (if any).
    fn get(
        &self,
        path: &str,
        silence: Duration,
        deadline: Option<Duration>,
    ) -> Result<Response<ureq::Body>, ApiError> {
        self.get_with(&self.agent, path, silence, deadline)
    }

    /// [`Kube::get`] through `agent`.
    fn get_with(
        &self,
        agent: &Agent,
        path: &str,
        silence: Duration,
        deadline: Option<Duration>,
    ) -> Result<Response<ureq::Body>, ApiError> {
        let url = format!("{}{path}", self.endpoint.base);
        let mut req = agent
            .get(&url)
            .header("Accept", proto::ACCEPT)
            .config()
            .timeout_per_read(Some(silence))
            .timeout_recv_body(deadline)
            .build();
        if let Some(a) = self.authorization()? {
            req = req.header("Authorization", a);
        }
        let resp = req.call().map_err(|e| transport(path, e))?;
        checked(path, resp)
    }
}

/// A ureq failure: nothing usable was heard from the server.
fn transport(what: &str, e: ureq::Error) -> ApiError {
    match e {
        ureq::Error::BodyExceedsLimit(limit) => ApiError::TooLarge {
            what: what.to_string(),
            limit,
            unit: "bytes",
        },
        ureq::Error::LargeResponseHeader(_, limit) => ApiError::TooLarge {
            what: format!("{what} (response headers)"),
            limit: limit as u64,
            unit: "bytes",
        },
        e => ApiError::Connection {
            what: what.to_string(),
            reason: e.to_string(),
        },
    }
}

/// True when `resp` is in Kubernetes' protobuf encoding ([`proto`]), false for JSON.
fn is_protobuf(resp: &Response<ureq::Body>) -> bool {
    resp.headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with(proto::MEDIA_TYPE))
}

/// A 2xx answer as it is; any other status as the error it stands for, with the server's
/// `Status` message when it sent one (in either encoding).
fn checked(what: &str, mut resp: Response<ureq::Body>) -> Result<Response<ureq::Body>, ApiError> {
    let code = resp.status().as_u16();
    if (200..300).contains(&code) {
        return Ok(resp);
    }
    let protobuf = is_protobuf(&resp);
    let mut body = Vec::new();
    let _ = resp
        .body_mut()
        .as_reader()
        .take(ERROR_BODY_LIMIT)
        .read_to_end(&mut body);
    let status: Status = match protobuf {
        true => proto::status(&body).unwrap_or_default(),
        false => serde_json::from_slice(&body).unwrap_or_default(),
    };
    let message = if status.message.is_empty() {
        String::from_utf8_lossy(&body).chars().take(200).collect()
    } else {
        status.message
    };
    Err(status_error(what, code, status.reason, message))
}

/// An HTTP status or an ERROR event's `Status` as an [`ApiError`].
pub fn status_error(what: &str, code: u16, reason: String, message: String) -> ApiError {
    if code == 410 {
        return ApiError::Gone {
            what: what.to_string(),
            message,
        };
    }
    ApiError::Status {
        what: what.to_string(),
        code,
        reason,
        message,
    }
}

/// A reader that counts what went through it (to tell a body cut at the limit from one that
/// is merely broken) and, for JSON, refuses a string longer than [`MAX_STRING`] as it streams
/// by.
struct Guarded<R> {
    inner: R,
    count: u64,
    /// JSON: strings are watched.
    json: bool,
    in_string: bool,
    escaped: bool,
    string_len: u64,
    too_long: bool,
}

impl<R> Guarded<R> {
    fn new(inner: R) -> Guarded<R> {
        Guarded {
            inner,
            count: 0,
            json: true,
            in_string: false,
            escaped: false,
            string_len: 0,
            too_long: false,
        }
    }
}

impl<R: Read> Read for Guarded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if !self.json {
            return Ok(n);
        }
        for &b in &buf[..n] {
            if !self.in_string {
                if b == b'"' {
                    self.in_string = true;
                    self.string_len = 0;
                }
                continue;
            }
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => {
                    self.in_string = false;
                    continue;
                }
                _ => {}
            }
            self.string_len += 1;
            if self.string_len > MAX_STRING {
                self.too_long = true;
                return Err(std::io::Error::other(
                    "a JSON string over the agent's limit",
                ));
            }
        }
        Ok(n)
    }
}

/// A page of a list up to this size is read whole and parsed from memory; a larger one is
/// parsed as it streams. serde_json reads a stream byte by byte: at 100,000 Nodes that was
/// most of the agent's CPU for the first list. A page of 500 real Nodes is about 5 MB; the
/// buffer counts against the agent's memory bound (64 MiB while a hostile list is refused).
const IN_MEMORY: u64 = 16 * 1024 * 1024;

/// A NodeList page from `reader`: from memory when the body is at most `in_memory` bytes,
/// streamed otherwise (what was read first, then the rest). Either way every byte went
/// through `reader`, so its bounds hold alike.
fn read_list<R: Read>(reader: &mut R, in_memory: u64) -> Result<BoundedList, serde_json::Error> {
    // Reserved whole (only what is read becomes resident): the buffer is never copied as it
    // grows.
    let mut head = Vec::with_capacity(usize::try_from(in_memory + 1).unwrap_or(usize::MAX));
    reader
        .by_ref()
        .take(in_memory + 1)
        .read_to_end(&mut head)
        .map_err(serde_json::Error::io)?;
    if head.len() as u64 <= in_memory {
        return serde_json::from_slice(&head);
    }
    serde_json::from_reader(BufReader::new(std::io::Cursor::new(head).chain(reader)))
}

thread_local! {
    /// Set by [`BoundedItems`] when a page holds more than [`LIMIT`] Nodes.
    static OVERFLOW: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The most Nodes [`BoundedItems`] reads (`--max-nodes`), set before each page is read.
    static LIMIT: std::cell::Cell<usize> = const { std::cell::Cell::new(DEFAULT_MAX_NODES) };
}

/// A NodeList page; more than [`LIMIT`] items stop the read at once ([`OVERFLOW`] says
/// so), and a Node that cannot be kept ([`Node::keepable`]) is skipped.
#[derive(Deserialize)]
struct BoundedList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: BoundedItems,
}

#[derive(Default)]
struct BoundedItems {
    nodes: Vec<Node>,
}

impl<'de> Deserialize<'de> for BoundedItems {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = BoundedItems;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of Nodes")
            }
            fn visit_unit<E>(self) -> Result<BoundedItems, E> {
                Ok(BoundedItems::default())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<BoundedItems, A::Error> {
                let mut out = BoundedItems::default();
                let limit = LIMIT.with(std::cell::Cell::get);
                while let Some(n) = seq.next_element::<Node>()? {
                    if out.nodes.len() == limit {
                        OVERFLOW.with(|o| o.set(true));
                        return Err(serde::de::Error::custom("too many Nodes"));
                    }
                    if n.keepable() {
                        out.nodes.push(n);
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_any(Visit)
    }
}

impl Kube {
    /// A list page in protobuf ([`proto::read_list`]), bounded as the JSON one is.
    fn list_protobuf(
        &self,
        path: &str,
        mut resp: Response<ureq::Body>,
    ) -> Result<NodePage, ApiError> {
        let body = resp.body_mut().as_reader().take(LIST_BODY_LIMIT + 1);
        let mut reader = Guarded {
            json: false,
            ..Guarded::new(BufReader::new(body))
        };
        let page = proto::read_list(&mut reader, self.max_nodes);
        let too_large = |limit, unit| too_large(path, limit, unit);
        if reader.count > LIST_BODY_LIMIT {
            return Err(too_large(LIST_BODY_LIMIT, "bytes"));
        }
        page.map_err(|e| match e {
            proto::Error::TooManyNodes(n) => too_large(n as u64, "nodes in one page"),
            proto::Error::TooLarge { limit, .. } => too_large(limit, "bytes in one item"),
            e if e.is_io() => ApiError::Connection {
                what: path.to_string(),
                reason: e.to_string(),
            },
            e => ApiError::Decode {
                what: path.to_string(),
                reason: format!("not a NodeList: {e}"),
            },
        })
    }
}

/// A list answer over one of the agent's bounds.
fn too_large(path: &str, limit: u64, unit: &'static str) -> ApiError {
    ApiError::TooLarge {
        what: path.to_string(),
        limit,
        unit,
    }
}

/// `s` escaped for a URL query value.
fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl NodeApi for Kube {
    fn list(
        &mut self,
        from: &ListFrom,
        continue_token: Option<&str>,
    ) -> Result<NodePage, ApiError> {
        let mut path = format!("/api/v1/nodes?limit={PAGE}");
        match (continue_token, from) {
            (Some(t), _) => path.push_str(&format!("&continue={}", query_escape(t))),
            (None, ListFrom::Cache) => path.push_str("&resourceVersion=0"),
            (None, ListFrom::Latest) => {}
            (None, ListFrom::NotOlderThan(v)) => path.push_str(&format!(
                "&resourceVersion={}&resourceVersionMatch=NotOlderThan",
                query_escape(v)
            )),
        }
        let mut resp = self.get(&path, CALL_SILENCE, None)?;
        if is_protobuf(&resp) {
            return self.list_protobuf(&path, resp);
        }
        let mut reader = Guarded::new(resp.body_mut().as_reader().take(LIST_BODY_LIMIT + 1));
        OVERFLOW.with(|o| o.set(false));
        LIMIT.with(|l| l.set(self.max_nodes));
        let parsed = read_list(&mut reader, IN_MEMORY);
        let too_large = |limit, unit| too_large(&path, limit, unit);
        if reader.count > LIST_BODY_LIMIT {
            return Err(too_large(LIST_BODY_LIMIT, "bytes"));
        }
        if reader.too_long {
            return Err(too_large(MAX_STRING, "bytes in one JSON string"));
        }
        if OVERFLOW.with(std::cell::Cell::get) {
            return Err(too_large(self.max_nodes as u64, "nodes in one page"));
        }
        let page = parsed.map_err(|e| {
            if e.is_io() {
                ApiError::Connection {
                    what: path.clone(),
                    reason: e.to_string(),
                }
            } else {
                ApiError::Decode {
                    what: path.clone(),
                    reason: format!("not a NodeList: {e}"),
                }
            }
        })?;
        Ok(NodePage {
            items: page.items.nodes,
            resource_version: page.metadata.resource_version,
            continue_token: page.metadata.continue_token.filter(|t| !t.is_empty()),
        })
    }

    fn watch(
        &mut self,
        resource_version: &str,
        timeout: Duration,
    ) -> Result<Box<dyn Events + '_>, ApiError> {
        let path = format!(
            "/api/v1/nodes?watch=1&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={}",
            query_escape(resource_version),
            timeout.as_secs()
        );
        let within = timeout + WATCH_MARGIN;
        let deadline = Instant::now() + within;
        let resp = self.get_with(&self.watcher, &path, WATCH_SILENCE, Some(within))?;
        Ok(Box::new(Watch {
            protobuf: is_protobuf(&resp),
            body: BufReader::new(resp.into_body().into_reader()),
            path,
            deadline,
            within,
        }))
    }

    fn annotate(
        &mut self,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        let path = format!("/api/v1/nodes/{}/status", query_escape(name));
        let url = format!("{}{path}", self.endpoint.base);
        let body = serde_json::json!({"metadata": {"annotations": annotations}}).to_string();
        let mut req = self
            .agent
            .patch(&url)
            .header("Content-Type", "application/merge-patch+json");
        if let Some(a) = self.authorization()? {
            req = req.header("Authorization", a);
        }
        let resp = req.send(body.as_bytes()).map_err(|e| transport(&path, e))?;
        let mut resp = checked(&path, resp)?;
        let _ = resp
            .body_mut()
            .as_reader()
            .take(ERROR_BODY_LIMIT)
            .read_to_end(&mut Vec::new());
        Ok(())
    }
}

/// An open watch stream, until its deadline: one JSON event per line, or in protobuf
/// length-prefixed frames ([`proto::next_frame`]).
struct Watch<R> {
    body: BufReader<R>,
    protobuf: bool,
    path: String,
    /// When the server should long have ended it ([`WATCH_MARGIN`] after its timeout); the
    /// body's read budget ends it there too.
    deadline: Instant,
    within: Duration,
}

/// What one read of a watch stream gave.
enum Read1 {
    End,
    /// A blank line: a keepalive, no event.
    Nothing,
    Event(Result<Event, String>),
}

impl<R: Read> Watch<R> {
    fn past_deadline(&self) -> Option<ApiError> {
        (Instant::now() >= self.deadline).then(|| ApiError::Deadline {
            what: self.path.clone(),
            after: self.within,
        })
    }

    /// A broken read: the deadline's, when the body's budget ran out, or the connection's.
    fn broken(&self, reason: String) -> ApiError {
        self.past_deadline().unwrap_or(ApiError::Connection {
            what: self.path.clone(),
            reason,
        })
    }

    fn too_large(&self) -> ApiError {
        ApiError::TooLarge {
            what: self.path.clone(),
            limit: EVENT_LIMIT,
            unit: "bytes in one watch event",
        }
    }

    fn next_line(&mut self) -> Result<Read1, ApiError> {
        let mut line = Vec::new();
        let read = (&mut self.body)
            .take(EVENT_LIMIT + 1)
            .read_until(b'\n', &mut line);
        let n = read.map_err(|e| self.broken(e.to_string()))?;
        if n == 0 {
            return Ok(Read1::End);
        }
        if line.len() as u64 > EVENT_LIMIT {
            return Err(self.too_large());
        }
        if line.trim_ascii().is_empty() {
            return Ok(Read1::Nothing);
        }
        if !line.ends_with(b"\n") {
            // The stream ended inside an event: the connection broke.
            return Err(ApiError::Connection {
                what: self.path.clone(),
                reason: "the stream ended inside an event".into(),
            });
        }
        Ok(Read1::Event(Event::parse(&line).map_err(|e| e.to_string())))
    }

    fn next_frame(&mut self) -> Result<Read1, ApiError> {
        match proto::next_frame(&mut self.body) {
            Ok(None) => Ok(Read1::End),
            Ok(Some(frame)) => Ok(Read1::Event(proto::event(frame).map_err(|e| e.to_string()))),
            Err(proto::Error::TooLarge { .. }) => Err(self.too_large()),
            Err(e) => Err(self.broken(e.to_string())),
        }
    }
}

impl<R: Read> Events for Watch<R> {
    fn next_event(&mut self) -> Result<Option<Event>, ApiError> {
        loop {
            if let Some(e) = self.past_deadline() {
                return Err(e);
            }
            let read = match self.protobuf {
                true => self.next_frame()?,
                false => self.next_line()?,
            };
            return match read {
                Read1::End => Ok(None),
                Read1::Nothing => continue,
                Read1::Event(Ok(Event::Added(n) | Event::Modified(n) | Event::Deleted(n)))
                    if !n.keepable() =>
                {
                    Err(ApiError::Decode {
                        what: self.path.clone(),
                        reason: format!(
                            "a Node name of {} bytes (Kubernetes allows 253)",
                            n.metadata.name.len()
                        ),
                    })
                }
                Read1::Event(Ok(Event::Error(s))) => Err(status_error(
                    &format!("{} (ERROR event)", self.path),
                    s.code,
                    s.reason,
                    s.message,
                )),
                Read1::Event(Ok(e)) => Ok(Some(e)),
                Read1::Event(Err(reason)) => Err(ApiError::Decode {
                    what: self.path.clone(),
                    reason,
                }),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_of_more_than_max_nodes_stops_the_read_and_says_so() {
        let items: Vec<String> = (0..DEFAULT_MAX_NODES + 2)
            .map(|i| format!(r#"{{"metadata":{{"name":"n{i}"}}}}"#))
            .collect();
        let text = format!(
            r#"{{"kind":"NodeList","metadata":{{"resourceVersion":"7"}},"items":[{}]}}"#,
            items.join(",")
        );
        OVERFLOW.with(|o| o.set(false));
        assert!(serde_json::from_str::<BoundedList>(&text).is_err());
        assert!(OVERFLOW.with(std::cell::Cell::get));
        let long = "x".repeat(300);
        let small: BoundedList = serde_json::from_str(&format!(
            r#"{{"metadata":{{"resourceVersion":"7"}},"items":[{{"metadata":{{"name":"{long}"}}}},{{"metadata":{{"name":"ok"}}}}]}}"#
        ))
        .unwrap();
        let names: Vec<&str> = small
            .items
            .nodes
            .iter()
            .map(|n| n.metadata.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["ok"],
            "a name Kubernetes would refuse is not a Node"
        );
    }

    #[test]
    fn a_string_over_the_limit_fails_the_read_as_it_streams() {
        let mut body = br#"{"items":[{"metadata":{"name":""#.to_vec();
        body.extend(std::iter::repeat_n(b'a', MAX_STRING as usize + 10));
        body.extend(br#""}}]}"#);
        for in_memory in [10, IN_MEMORY] {
            let mut r = Guarded::new(&body[..]);
            assert!(read_list(&mut r, in_memory).is_err());
            assert!(r.too_long);
        }
        // Escaped quotes do not end a string; long strings elsewhere are fine up to the limit.
        let ok = br#"{"items":[{"metadata":{"name":"a\"b","annotations":{"k":"\\"}}}]}"#;
        // Read whole, or streamed past the first 10 bytes: the same page.
        for in_memory in [10, IN_MEMORY] {
            let mut r = Guarded::new(&ok[..]);
            let page = read_list(&mut r, in_memory).unwrap();
            assert_eq!(page.items.nodes[0].metadata.name, "a\"b");
            assert!(!r.too_long);
        }
    }

    #[test]
    fn gone_is_its_own_error_every_other_status_is_a_status() {
        assert!(matches!(
            status_error("w", 410, "Expired".into(), "too old".into()),
            ApiError::Gone { .. }
        ));
        let e = status_error(
            "w",
            504,
            "Timeout".into(),
            "Too large resource version".into(),
        );
        assert!(matches!(e, ApiError::Status { code: 504, .. }));
        assert!(!e.is_connection());
    }

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(query_escape("a b&c=d/e"), "a%20b%26c%3Dd%2Fe");
        assert_eq!(query_escape("eyJ2Ijo-_.~"), "eyJ2Ijo-_.~");
    }

    /// A stream of blank lines (a server's keepalive) never answers: past its deadline the
    /// watch ends with [`ApiError::Deadline`], not a resumable broken connection.
    #[test]
    fn keepalive_lines_are_no_answer_past_the_deadline() {
        // Blank lines without end: only the deadline can end this read, however fast or
        // loaded the machine is.
        let deadline = Instant::now() + Duration::from_millis(50);
        let mut w = Watch {
            body: BufReader::new(std::io::repeat(b'\n')),
            protobuf: false,
            path: "/api/v1/nodes?watch=1".into(),
            deadline,
            within: Duration::from_millis(50),
        };
        let Err(e) = w.next_event() else {
            panic!("a blank line is not an event");
        };
        assert!(matches!(e, ApiError::Deadline { .. }), "{e:?}");
        assert!(!e.is_connection(), "a deadline means list again");
        assert!(Instant::now() >= deadline, "ended before its deadline");
        assert!(e.to_string().contains("no end within"), "{e}");
    }
}
