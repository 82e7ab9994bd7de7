//! The three API calls the agent makes: list nodes (paged, all pages or nothing), watch nodes
//! from a resourceVersion (a stream of events), and patch its own Node's annotations.

use std::collections::BTreeMap;
use std::time::Duration;

use super::endpoint::{self, Endpoint};
use super::http::{self, Request, Response};
use super::objects::{Event, Node, NodeList, Status};

/// What the agent calls itself (YurtHub caches only the agents listed in its `cache_agents`,
/// by this name).
pub const USER_AGENT_NAME: &str = "sticky-vxlan-agent";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Http(#[from] http::Error),
    #[error(transparent)]
    Credentials(#[from] endpoint::Error),
    /// The resourceVersion is too old (410 Gone): list again.
    #[error("resourceVersion {0} is gone (410): listing again")]
    Gone(String),
    #[error("{path}: HTTP {status} {reason}: {message}")]
    Status {
        path: String,
        status: u16,
        reason: String,
        message: String,
    },
    #[error("{path}: {reason}")]
    Decode { path: String, reason: String },
}

const LIST_BODY_LIMIT: u64 = 256 * 1024 * 1024;
const EVENT_LIMIT: u64 = 16 * 1024 * 1024;
const PAGE: usize = 500;
const WATCH_SILENCE: Duration = Duration::from_secs(150);

pub struct Client {
    pub endpoint: Endpoint,
    user_agent: String,
}

/// A complete list: every node and the list's resourceVersion.
pub struct Listed {
    pub nodes: BTreeMap<String, Node>,
    pub resource_version: String,
}

impl Client {
    pub fn new(endpoint: Endpoint) -> Client {
        Client {
            endpoint,
            user_agent: format!(
                "{USER_AGENT_NAME}/{} ({}/{})",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::OS,
                std::env::consts::ARCH
            ),
        }
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&[u8]>,
        read_timeout: Duration,
    ) -> Result<Response, Error> {
        let full = format!("{}{path}", self.endpoint.base);
        let mut headers = vec![
            ("User-Agent", self.user_agent.clone()),
            ("Accept", "application/json".to_string()),
        ];
        if let Some(a) = self.endpoint.authorization()? {
            headers.push(("Authorization", a));
        }
        if let Some(ct) = content_type {
            headers.push(("Content-Type", ct.to_string()));
        }
        let resp = http::send(
            &self.endpoint.target,
            &Request {
                method,
                path: &full,
                headers,
                body,
                read_timeout,
            },
        )?;
        if resp.status / 100 == 2 {
            return Ok(resp);
        }
        let status = resp.status;
        let body = resp.body(1024 * 1024).unwrap_or_default();
        let s: Status = serde_json::from_slice(&body).unwrap_or_default();
        if status == 410 {
            return Err(Error::Gone(path.to_string()));
        }
        Err(Error::Status {
            path: full,
            status,
            reason: s.reason,
            message: if s.message.is_empty() {
                String::from_utf8_lossy(&body).chars().take(200).collect()
            } else {
                s.message
            },
        })
    }

    /// Every node, following `continue` pages. Any failure on any page fails the whole list:
    /// only a complete list may remove a peer.
    pub fn list_nodes(&self) -> Result<Listed, Error> {
        let mut nodes = BTreeMap::new();
        let mut token: Option<String> = None;
        loop {
            let path = match &token {
                None => format!("/api/v1/nodes?limit={PAGE}"),
                Some(t) => format!("/api/v1/nodes?limit={PAGE}&continue={}", query_escape(t)),
            };
            let body = self
                .request("GET", &path, None, None, Duration::from_secs(60))?
                .body(LIST_BODY_LIMIT)?;
            let page: NodeList = serde_json::from_slice(&body).map_err(|e| Error::Decode {
                path: path.clone(),
                reason: format!("not a NodeList: {e}"),
            })?;
            for n in page.items {
                nodes.insert(n.metadata.name.clone(), n);
            }
            match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => {
                    return Ok(Listed {
                        nodes,
                        resource_version: page.metadata.resource_version,
                    });
                }
            }
        }
    }

    /// A watch from `resource_version`, with bookmarks; the server ends it after about
    /// `timeout`.
    pub fn watch_nodes(&self, resource_version: &str, timeout: Duration) -> Result<Watch, Error> {
        let path = format!(
            "/api/v1/nodes?watch=1&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={}",
            query_escape(resource_version),
            timeout.as_secs()
        );
        // No byte for this long means the connection is dead (a real API server sends a
        // bookmark about every minute): the watch is resumed on a new connection.
        let resp = self.request("GET", &path, None, None, WATCH_SILENCE)?;
        Ok(Watch { resp, path })
    }

    /// Merge-patches annotations onto the Node `name`.
    pub fn annotate_node(
        &self,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), Error> {
        let body = serde_json::json!({"metadata": {"annotations": annotations}}).to_string();
        let path = format!("/api/v1/nodes/{}", query_escape(name));
        self.request(
            "PATCH",
            &path,
            Some("application/merge-patch+json"),
            Some(body.as_bytes()),
            Duration::from_secs(30),
        )?
        .body(LIST_BODY_LIMIT)?;
        Ok(())
    }
}

/// An open watch stream.
pub struct Watch {
    resp: Response,
    path: String,
}

impl Watch {
    /// The next event; `None` when the server ended the stream cleanly.
    pub fn next_event(&mut self) -> Result<Option<Event>, Error> {
        loop {
            let Some(line) = self.resp.next_line(EVENT_LIMIT)? else {
                return Ok(None);
            };
            if line.trim_ascii().is_empty() {
                continue;
            }
            return Event::parse(&line)
                .map(Some)
                .map_err(|reason| Error::Decode {
                    path: self.path.clone(),
                    reason,
                });
        }
    }
}

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
