//! List, then watch from the list's resourceVersion, as client-go's reflector does, over the
//! [`NodeApi`] and [`Clock`] traits: every transition is a unit test below.
//!
//! - The first list asks for `resourceVersion=0` (the API server answers from its watch cache,
//!   as for kubelet's and client-go's informers); pages are followed to the end; any failure on
//!   any page fails the whole list (only a complete list may remove a peer), and so does a list
//!   over [`max_pages`](super::kube::max_pages) pages or `--max-nodes`
//!   ([`DEFAULT_MAX_NODES`](super::kube::DEFAULT_MAX_NODES)) nodes.
//! - A watch that the server ends (its timeout) is resumed from the last resourceVersion; so is
//!   one whose connection broke or could not be opened (nothing was heard from the server), after
//!   a jittered backoff.
//! - Every other failure while watching (410 Gone, 504 too large resourceVersion, 5xx, an
//!   ERROR event, an event that is not a Node, an event too large) means "list again", after a
//!   jittered backoff; after 410 and 504 the list is a consistent read (no resourceVersion),
//!   otherwise one no older than the last resourceVersion seen. Repeated failures back off
//!   to 30 s.
//! - [`SyncState`] says whether the API answers and since when the agent's view is stale:
//!   from the first failure until the next complete list (or a resumed watch when no list was
//!   needed).

use std::time::Duration;

use super::api::{ApiError, ListFrom, NodeApi};
use super::clock::{Backoff, Clock};
use super::kube::{DEFAULT_MAX_NODES, max_pages};
use super::objects::{Event, Node};

/// Where the reflector's nodes go.
pub trait Sink {
    /// A complete list: every node there is.
    fn replace(&mut self, nodes: Vec<Node>);
    fn upsert(&mut self, node: Node);
    fn delete(&mut self, name: &str);
    /// The API's state changed (reachable, stale, last error, counters).
    fn state(&mut self, state: &SyncState);
}

/// What the reflector knows about the API, for the status file, `show` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncState {
    pub api_reachable: bool,
    /// Unix seconds since which the agent's view may miss changes (none while in sync).
    pub stale_since: Option<u64>,
    /// Unix seconds of the last complete list.
    pub last_list: Option<u64>,
    /// Unix seconds the API last answered (a page, a watch opened, an event), to within
    /// [`ANSWER_EVERY`].
    pub last_answer: Option<u64>,
    /// The last failure, for the log and `show`.
    pub last_error: Option<String>,
    pub lists: u64,
    pub list_failures: u64,
    pub watch_failures: u64,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    List(ListFrom),
    Watch { resource_version: String },
}

/// How long the server should keep one watch open: 5 to 10 minutes, as client-go asks
/// (450 s ± a third), unless `--watch-timeout` says otherwise.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(450);
/// How often the last answer's time is passed on while events flow.
const ANSWER_EVERY: Duration = Duration::from_secs(10);
/// A watch that the server ended after less than this is resumed only after a backoff (a
/// server that ends every watch at once must not be hammered).
const SHORT_WATCH: Duration = Duration::from_secs(1);

pub struct Reflector<A, C, S> {
    pub api: A,
    pub clock: C,
    pub sink: S,
    backoff: Backoff,
    state: SyncState,
    phase: Phase,
    /// `--watch-timeout`: the server's `timeoutSeconds` as given, not spread.
    watch_timeout: Option<Duration>,
    /// `--max-nodes`: the most Nodes one list may bring.
    max_nodes: usize,
}

impl<A: NodeApi, C: Clock, S: Sink> Reflector<A, C, S> {
    pub fn new(api: A, clock: C, sink: S, backoff: Backoff) -> Self {
        Reflector {
            api,
            clock,
            sink,
            backoff,
            state: SyncState::default(),
            phase: Phase::List(ListFrom::Cache),
            watch_timeout: None,
            max_nodes: DEFAULT_MAX_NODES,
        }
    }

    /// Refuses a list of more than `n` Nodes (`--max-nodes`), or of more than
    /// [`max_pages`]`(n)` pages.
    pub fn with_max_nodes(mut self, n: usize) -> Self {
        self.max_nodes = n;
        self
    }

    /// Asks the server to end each watch after `timeout` (`--watch-timeout`), instead of 5
    /// to 10 minutes.
    pub fn with_watch_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.watch_timeout = timeout;
        self
    }

    #[cfg(test)]
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Runs forever.
    pub fn run(mut self) {
        loop {
            self.step();
        }
    }

    /// One list, or one watch until it ends, then the wait the outcome calls for.
    pub fn step(&mut self) {
        self.phase = match std::mem::replace(&mut self.phase, Phase::List(ListFrom::Cache)) {
            Phase::List(from) => self.list(from),
            Phase::Watch { resource_version } => self.watch(resource_version),
        };
    }

    fn list(&mut self, from: ListFrom) -> Phase {
        match self.list_all(&from) {
            Ok((nodes, resource_version)) => {
                self.state.api_reachable = true;
                self.state.stale_since = None;
                self.state.last_list = Some(self.clock.unix());
                self.state.last_answer = self.state.last_list;
                self.state.last_error = None;
                self.state.lists += 1;
                self.sink.replace(nodes);
                self.sink.state(&self.state);
                Phase::Watch { resource_version }
            }
            Err(e) => {
                self.state.list_failures += 1;
                let again = match e {
                    ApiError::Gone { .. } | ApiError::Status { code: 504, .. } => ListFrom::Latest,
                    _ => from,
                };
                self.failed(e);
                Phase::List(again)
            }
        }
    }

    /// Every page of the list, or the first failure.
    fn list_all(&mut self, from: &ListFrom) -> Result<(Vec<Node>, String), ApiError> {
        let mut nodes = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..max_pages(self.max_nodes) {
            let page = self.api.list(from, token.as_deref())?;
            self.state.api_reachable = true;
            if nodes.len() + page.items.len() > self.max_nodes {
                return Err(ApiError::TooLarge {
                    what: "the node list".into(),
                    limit: self.max_nodes as u64,
                    unit: "nodes",
                });
            }
            nodes.extend(page.items);
            match page.continue_token {
                Some(t) if Some(&t) == token.as_ref() => {
                    return Err(ApiError::Decode {
                        what: "the node list".into(),
                        reason: "the server sent the same continue token twice".into(),
                    });
                }
                Some(t) => token = Some(t),
                None => return Ok((nodes, page.resource_version)),
            }
        }
        Err(ApiError::TooLarge {
            what: "the node list".into(),
            limit: max_pages(self.max_nodes) as u64,
            unit: "pages",
        })
    }

    fn watch(&mut self, mut resource_version: String) -> Phase {
        let timeout = match self.watch_timeout {
            Some(t) => t,
            None => {
                let spread = self.backoff.jitter(WATCH_TIMEOUT, 1.0 / 3.0);
                Duration::from_secs(spread.as_secs())
            }
        };
        let started = self.clock.now();
        let (state, sink, clock) = (&mut self.state, &mut self.sink, &self.clock);
        let end = match self.api.watch(&resource_version, timeout) {
            Err(e) => Err(e),
            Ok(mut events) => {
                // The watch opened: the API answers, and what was missed is in this stream.
                answered(state, sink, clock, true);
                loop {
                    match events.next_event() {
                        Ok(Some(event)) => {
                            answered(state, sink, clock, false);
                            if let Some(rv) = apply(sink, event) {
                                resource_version = rv;
                            }
                        }
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                }
            }
        };
        if let Err(e) = end {
            return self.watch_failed(e, resource_version);
        }
        if self.clock.now() - started < SHORT_WATCH {
            let wait = self.backoff.next_wait(self.clock.now());
            self.clock.sleep(wait);
        }
        Phase::Watch { resource_version }
    }

    /// A failed watch: resumed after a broken connection, listed again otherwise.
    fn watch_failed(&mut self, e: ApiError, resource_version: String) -> Phase {
        self.state.watch_failures += 1;
        let next = if e.is_connection() {
            Phase::Watch { resource_version }
        } else {
            Phase::List(match e {
                ApiError::Gone { .. } | ApiError::Status { code: 504, .. } => ListFrom::Latest,
                // As client-go: no older than what this agent has already seen.
                _ if !resource_version.is_empty() => ListFrom::NotOlderThan(resource_version),
                _ => ListFrom::Cache,
            })
        };
        self.failed(e);
        next
    }

    /// Records a failure, tells the sink, and waits the backoff.
    fn failed(&mut self, e: ApiError) {
        if e.is_connection() {
            self.state.api_reachable = false;
        }
        self.state.stale_since.get_or_insert(self.clock.unix());
        self.state.last_error = Some(e.to_string());
        self.sink.state(&self.state);
        let wait = self.backoff.next_wait(self.clock.now());
        self.clock.sleep(wait);
    }
}

/// The API answered (a watch opened, or an event came): marks it reachable and in sync, and
/// tells the sink when that changed, on `now`, or at most every [`ANSWER_EVERY`] (a watch
/// brings hundreds of heartbeats a second in a large cluster).
fn answered<S: Sink, C: Clock>(state: &mut SyncState, sink: &mut S, clock: &C, now: bool) {
    let unix = clock.unix();
    let changed = !state.api_reachable || state.stale_since.is_some();
    let due = state
        .last_answer
        .is_none_or(|t| unix.saturating_sub(t) >= ANSWER_EVERY.as_secs());
    if !(changed || due || now) {
        return;
    }
    state.api_reachable = true;
    state.stale_since = None;
    state.last_error = None;
    state.last_answer = Some(unix);
    sink.state(state);
}

/// Passes one event to the sink; the resourceVersion to resume from after it.
fn apply<S: Sink>(sink: &mut S, event: Event) -> Option<String> {
    match event {
        Event::Added(n) | Event::Modified(n) => {
            let rv = n.metadata.resource_version.clone();
            sink.upsert(n);
            Some(rv)
        }
        Event::Deleted(n) => {
            sink.delete(&n.metadata.name);
            Some(n.metadata.resource_version)
        }
        Event::Bookmark(rv) => Some(rv),
        // The transport turns ERROR events into errors; one that gets here changes nothing.
        Event::Error(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, VecDeque};

    use super::super::api::{Events, NodePage};
    use super::super::clock::FakeClock;
    use super::*;

    /// One scripted answer of the fake API.
    enum Answer {
        Page(NodePage),
        Watch(Vec<Result<Event, ApiError>>),
        Fail(ApiError),
    }

    /// A scripted API: answers in order, and records every call.
    #[derive(Default)]
    struct FakeApi {
        answers: VecDeque<Answer>,
        calls: Vec<String>,
    }

    struct Stream(VecDeque<Result<Event, ApiError>>);

    impl Events for Stream {
        fn next_event(&mut self) -> Result<Option<Event>, ApiError> {
            self.0.pop_front().transpose()
        }
    }

    impl NodeApi for FakeApi {
        fn list(&mut self, from: &ListFrom, token: Option<&str>) -> Result<NodePage, ApiError> {
            self.calls
                .push(format!("list {from:?} {}", token.unwrap_or("-")));
            match self.answers.pop_front() {
                Some(Answer::Page(p)) => Ok(p),
                Some(Answer::Fail(e)) => Err(e),
                _ => panic!("unexpected list"),
            }
        }
        fn watch(&mut self, rv: &str, timeout: Duration) -> Result<Box<dyn Events + '_>, ApiError> {
            assert!(
                (300..=600).contains(&timeout.as_secs()),
                "watch timeout {timeout:?} is not 5-10 minutes"
            );
            self.calls.push(format!("watch {rv}"));
            match self.answers.pop_front() {
                Some(Answer::Watch(events)) => Ok(Box::new(Stream(events.into()))),
                Some(Answer::Fail(e)) => Err(e),
                _ => panic!("unexpected watch"),
            }
        }
        fn annotate(&mut self, _: &str, _: &BTreeMap<String, String>) -> Result<(), ApiError> {
            unreachable!()
        }
    }

    /// Records what reached the sink, one line per call.
    #[derive(Default)]
    struct Recorder {
        log: Vec<String>,
        states: Vec<SyncState>,
        /// Node calls and states in the order they came.
        timeline: Vec<String>,
    }

    impl Sink for Recorder {
        fn replace(&mut self, nodes: Vec<Node>) {
            let names: Vec<&str> = nodes.iter().map(|n| n.metadata.name.as_str()).collect();
            self.log.push(format!("replace {}", names.join(",")));
            self.timeline.push("replace".into());
        }
        fn upsert(&mut self, node: Node) {
            self.log.push(format!("upsert {}", node.metadata.name));
            self.timeline.push(format!("upsert {}", node.metadata.name));
        }
        fn delete(&mut self, name: &str) {
            self.log.push(format!("delete {name}"));
        }
        fn state(&mut self, state: &SyncState) {
            self.states.push(state.clone());
            self.timeline.push(format!(
                "reachable={} stale={}",
                state.api_reachable,
                state.stale_since.is_some()
            ));
        }
    }

    fn node(name: &str, rv: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = name.into();
        n.metadata.resource_version = rv.into();
        n
    }

    fn page(names: &[&str], rv: &str, token: Option<&str>) -> Answer {
        Answer::Page(NodePage {
            items: names.iter().map(|n| node(n, rv)).collect(),
            resource_version: rv.into(),
            continue_token: token.map(String::from),
        })
    }

    fn status(code: u16, message: &str) -> ApiError {
        super::super::kube::status_error("watch", code, String::new(), message.into())
    }

    fn broken() -> ApiError {
        ApiError::Connection {
            what: "watch".into(),
            reason: "connection reset".into(),
        }
    }

    fn reflector(answers: Vec<Answer>) -> Reflector<FakeApi, FakeClock, Recorder> {
        let api = FakeApi {
            answers: answers.into(),
            calls: Vec::new(),
        };
        Reflector::new(
            api,
            FakeClock::default(),
            Recorder::default(),
            Backoff::seeded(7),
        )
    }

    fn steps(r: &mut Reflector<FakeApi, FakeClock, Recorder>, n: usize) {
        for _ in 0..n {
            r.step();
        }
    }

    #[test]
    fn the_first_list_is_from_the_cache_pages_followed_then_a_watch_from_its_version() {
        let mut r = reflector(vec![
            page(&["a", "b"], "", Some("t1")),
            page(&["c"], "100", None),
            Answer::Watch(vec![
                Ok(Event::Added(node("d", "101"))),
                Ok(Event::Deleted(node("a", "102"))),
                Ok(Event::Bookmark("150".into())),
            ]),
            Answer::Watch(vec![]),
        ]);
        steps(&mut r, 3);
        assert_eq!(
            r.api.calls,
            ["list Cache -", "list Cache t1", "watch 100", "watch 150"]
        );
        assert_eq!(r.sink.log, ["replace a,b,c", "upsert d", "delete a"]);
        // Watches that lasted a moment are not resumed after a wait... but these ended at
        // once (the fake clock did not move), so each is followed by a backoff.
        assert_eq!(r.clock.sleeps.len(), 2);
        assert!(r.sink.states.last().unwrap().api_reachable);
    }

    #[test]
    fn a_failed_page_fails_the_whole_list_and_nothing_is_replaced() {
        let mut r = reflector(vec![
            page(&["a"], "", Some("t1")),
            Answer::Fail(status(500, "etcd is away")),
            page(&["a", "b"], "9", None),
        ]);
        steps(&mut r, 1);
        assert!(r.sink.log.is_empty(), "{:?}", r.sink.log);
        assert_eq!(r.clock.sleeps.len(), 1, "a backoff before the next list");
        let s = r.sink.states.last().unwrap();
        assert!(s.stale_since.is_some() && s.last_error.as_deref().unwrap().contains("500"));
        steps(&mut r, 1);
        assert_eq!(r.sink.log, ["replace a,b"]);
        assert_eq!(r.sink.states.last().unwrap().stale_since, None);
    }

    #[test]
    fn every_watch_failure_but_a_broken_connection_means_list_again() {
        for (e, from) in [
            (status(410, "too old resource version"), ListFrom::Latest),
            (status(504, "Too large resource version"), ListFrom::Latest),
            (
                status(500, "internal error"),
                ListFrom::NotOlderThan("5".into()),
            ),
            (status(403, "forbidden"), ListFrom::NotOlderThan("5".into())),
            (
                ApiError::Decode {
                    what: "watch".into(),
                    reason: "not a Node".into(),
                },
                ListFrom::NotOlderThan("5".into()),
            ),
            (
                ApiError::TooLarge {
                    what: "watch".into(),
                    limit: 1,
                    unit: "bytes",
                },
                ListFrom::NotOlderThan("5".into()),
            ),
        ] {
            let what = e.to_string();
            // The failure at the opening of the watch...
            let mut r = reflector(vec![page(&["a"], "5", None), Answer::Fail(e)]);
            steps(&mut r, 2);
            assert_eq!(r.phase(), &Phase::List(from.clone()), "{what}");
            assert_eq!(r.clock.sleeps.len(), 1, "{what}: relist only after a wait");
        }
        // ... and in the middle of the stream (an ERROR event).
        let mut r = reflector(vec![
            page(&["a"], "5", None),
            Answer::Watch(vec![
                Ok(Event::Modified(node("a", "6"))),
                Err(status(410, "too old")),
            ]),
        ]);
        steps(&mut r, 2);
        assert_eq!(r.phase(), &Phase::List(ListFrom::Latest));
        assert_eq!(r.sink.log, ["replace a", "upsert a"]);
    }

    /// Issue 27, defect 6: a watch held open past its deadline (blank lines only) is dropped;
    /// the agent lists again and is stale until that list.
    #[test]
    fn a_watch_past_its_deadline_means_list_again_and_stale_until_then() {
        let mut r = reflector(vec![
            page(&["a", "b"], "5", None),
            Answer::Watch(vec![Err(ApiError::Deadline {
                what: "watch".into(),
                after: Duration::from_secs(480),
            })]),
            page(&["a"], "9", None),
        ]);
        steps(&mut r, 2);
        assert_eq!(r.phase(), &Phase::List(ListFrom::NotOlderThan("5".into())));
        let s = r.sink.states.last().unwrap();
        assert!(s.stale_since.is_some(), "{s:?}");
        assert!(s.last_error.as_deref().unwrap().contains("no end within"));
        assert_eq!(s.watch_failures, 1);
        steps(&mut r, 1);
        assert_eq!(r.sink.log, ["replace a,b", "replace a"]);
        assert_eq!(r.sink.states.last().unwrap().stale_since, None);
    }

    #[test]
    fn a_broken_connection_resumes_the_watch_from_the_last_version_seen() {
        let mut r = reflector(vec![
            page(&["a"], "5", None),
            Answer::Watch(vec![Ok(Event::Modified(node("a", "8"))), Err(broken())]),
            Answer::Fail(broken()),
            Answer::Watch(vec![]),
        ]);
        steps(&mut r, 4);
        assert_eq!(
            r.api.calls,
            ["list Cache -", "watch 5", "watch 8", "watch 8"]
        );
        let unreachable = r.sink.states.iter().any(|s| !s.api_reachable);
        assert!(unreachable, "the status said the API was away");
        assert!(r.sink.states.last().unwrap().api_reachable);
    }

    #[test]
    fn repeated_failures_back_off_to_the_cap_never_in_a_tight_loop() {
        let mut answers = vec![];
        for _ in 0..12 {
            answers.push(Answer::Fail(status(410, "gone")));
        }
        let mut r = reflector(answers);
        steps(&mut r, 12);
        let sleeps = &r.clock.sleeps;
        assert_eq!(sleeps.len(), 12, "every failure waits");
        assert!(sleeps[0] >= Backoff::MIN / 2);
        assert!(sleeps[11] >= Backoff::MAX / 2 && sleeps[11] <= Backoff::MAX * 3 / 2);
        // 12 failures take minutes, not the 180 cycles a second of a loop without backoff.
        assert!(
            r.clock.elapsed > Duration::from_secs(120),
            "{:?}",
            r.clock.elapsed
        );
        assert_eq!(r.sink.states.last().unwrap().list_failures, 12);
    }

    #[test]
    fn a_list_that_never_ends_or_grows_without_bound_is_refused() {
        // A server that always sends a new continue token: stops at max_pages.
        let mut answers: Vec<Answer> = (0..max_pages(DEFAULT_MAX_NODES))
            .map(|i| page(&["a"], "", Some(&format!("t{i}"))))
            .collect();
        answers.push(page(&["a"], "1", None));
        let mut r = reflector(answers);
        steps(&mut r, 1);
        assert!(r.sink.log.is_empty());
        let err = r.sink.states.last().unwrap().last_error.clone().unwrap();
        assert!(err.contains("pages"), "{err}");
        // The same continue token twice is refused at once.
        let mut r = reflector(vec![
            page(&["a"], "", Some("t")),
            page(&["b"], "", Some("t")),
        ]);
        steps(&mut r, 1);
        assert_eq!(r.api.calls.len(), 2);
        assert!(r.sink.log.is_empty());
        // More Nodes than --max-nodes, over two pages: refused; as many: taken.
        let names: Vec<String> = (0..1001).map(|i| format!("n{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let two_pages = || {
            vec![
                page(&names[..600], "", Some("t")),
                page(&names[600..], "9", None),
            ]
        };
        let mut r = reflector(two_pages()).with_max_nodes(1000);
        steps(&mut r, 1);
        assert!(r.sink.log.is_empty());
        let err = r.sink.states.last().unwrap().last_error.clone().unwrap();
        assert!(err.contains("more than 1000 nodes"), "{err}");
        let mut r = reflector(two_pages()).with_max_nodes(1001);
        steps(&mut r, 1);
        assert_eq!(r.sink.log.len(), 1, "listed");
    }

    #[test]
    fn the_api_is_marked_answering_when_a_resumed_watch_opens_not_when_it_ends() {
        let mut r = reflector(vec![
            page(&["a"], "5", None),
            Answer::Fail(broken()),
            Answer::Watch(vec![Ok(Event::Modified(node("a", "6")))]),
        ]);
        steps(&mut r, 3);
        let t = &r.sink.timeline;
        let down = t
            .iter()
            .position(|e| e == "reachable=false stale=true")
            .unwrap();
        let up = t
            .iter()
            .skip(down)
            .position(|e| e == "reachable=true stale=false")
            .unwrap()
            + down;
        let event = t.iter().position(|e| e == "upsert a").unwrap();
        assert!(
            up < event,
            "answering before the stream's first event: {t:?}"
        );
    }

    #[test]
    fn lists_that_succeed_between_failed_watches_do_not_reset_the_backoff() {
        let mut answers = vec![];
        for _ in 0..6 {
            answers.push(page(&["a"], "5", None));
            answers.push(Answer::Fail(status(410, "gone")));
        }
        let mut r = reflector(answers);
        steps(&mut r, 12);
        let sleeps = &r.clock.sleeps;
        assert_eq!(sleeps.len(), 6);
        assert!(
            sleeps[5] >= Backoff::MIN * 32 / 2,
            "the sixth wait grew: {sleeps:?}"
        );
    }
}
