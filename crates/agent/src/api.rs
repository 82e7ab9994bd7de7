//! What the agent asks of the Kubernetes API, as a small trait: one page of the node list, a
//! watch stream of node events, and a merge patch of its own Node's annotations. [`super::kube`]
//! is the real one over HTTP; tests drive [`super::reflector`] with a scripted fake.
//!
//! Errors are classified the way client-go's reflector needs them: a broken connection is
//! resumed, anything else the server says (410, 504 "too large resource version", 5xx, an
//! ERROR event, a body that is not what it should be or too large) means "list again".

use std::collections::BTreeMap;
use std::time::Duration;

use super::objects::{Event, Node};

/// One page of `GET /api/v1/nodes`.
#[derive(Debug, Clone, Default)]
pub struct NodePage {
    pub items: Vec<Node>,
    pub resource_version: String,
    /// Present when more pages follow.
    pub continue_token: Option<String>,
}

/// Which version of the list to ask for, as client-go does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListFrom {
    /// `resourceVersion=0`: whatever the API server's watch cache holds (cheap for the server;
    /// the first list, and relists after a watch that merely ended).
    Cache,
    /// No resourceVersion: a consistent read (after 410 Gone or a too large resourceVersion,
    /// when the cache is known to be behind or ahead).
    Latest,
    /// `resourceVersion=<v>&resourceVersionMatch=NotOlderThan`: after any other watch
    /// failure, a list no older than what the agent has already seen.
    NotOlderThan(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The connection could not be made, broke, or went silent: nothing was said by the
    /// server. A watch is resumed from where it was.
    #[error("{what}: {reason}")]
    Connection { what: String, reason: String },
    /// 410 Gone (or an ERROR event with code 410): the resourceVersion is too old.
    #[error("{what}: resourceVersion is gone (410): {message}")]
    Gone { what: String, message: String },
    /// Any other HTTP status the server answered with, or an ERROR event.
    #[error("{what}: HTTP {code} {reason}: {message}")]
    Status {
        what: String,
        code: u16,
        reason: String,
        message: String,
    },
    /// The server answered, but not with what it should have.
    #[error("{what}: {reason}")]
    Decode { what: String, reason: String },
    /// A response, an event or a list went over the agent's bounds.
    #[error("{what}: more than {limit} {unit}: refused (the agent's memory is bounded)")]
    TooLarge {
        what: String,
        limit: u64,
        unit: &'static str,
    },
    /// A watch the server had not ended by its deadline (its `timeoutSeconds` plus a margin):
    /// bytes that are no event (a blank keepalive line) are no answer. Listed again.
    #[error(
        "{what}: no end within {after:?} (the watch's timeoutSeconds and a margin), keepalive bytes are no answer: dropped, listing again"
    )]
    Deadline { what: String, after: Duration },
    /// The credentials cannot be used (a token file unreadable or with control characters).
    #[error("credentials: {0}")]
    Credentials(String),
}

impl ApiError {
    /// True when nothing was heard from the server: the only failure after which a watch is
    /// resumed rather than the list made again.
    pub fn is_connection(&self) -> bool {
        matches!(self, ApiError::Connection { .. })
    }
}

/// A watch stream.
pub trait Events {
    /// The next event; `None` when the server ended the stream cleanly (its timeout).
    fn next_event(&mut self) -> Result<Option<Event>, ApiError>;
}

/// The calls the agent makes.
pub trait NodeApi {
    /// One page of the node list (`continue_token` from the previous page, if any).
    fn list(&mut self, from: &ListFrom, continue_token: Option<&str>)
    -> Result<NodePage, ApiError>;
    /// A watch with bookmarks from `resource_version`, which the server ends after `timeout`.
    fn watch(
        &mut self,
        resource_version: &str,
        timeout: Duration,
    ) -> Result<Box<dyn Events + '_>, ApiError>;
    /// Merge-patches annotations onto the Node `name` (through `nodes/status`, as kubelet
    /// and flannel do, so the agent needs no write access to whole Node objects).
    fn annotate(
        &mut self,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), ApiError>;
}
