//! The watch's socket, read at most once per window: what arrived meanwhile is read in one go.
//!
//! At 100,000 Nodes the kubelets' status updates (one per Node every 5 minutes) are about 330
//! watch events a second of 10 KB each, and a real API server writes each in three pieces (its
//! chunk header, its text, its trailer: Go's `net/http` through a 4 KiB buffer). Read as they
//! come, that is three wakeups and three `recv` calls an event: measured, 3 context switches an
//! event and most of the agent's idle CPU, in the kernel. Read at most once per window, it is a
//! bounded number of wakeups a second whatever the cluster.
//!
//! The window is [`WINDOW`] after a read that brought a change ([`Hurry`], set by whoever
//! reads the events) or that had to wait for its bytes (the watch was quiet), and doubles up to
//! [`NO_CHANGE_WINDOW`] while every read finds bytes waiting and none of them changes anything:
//! the heartbeats of a large cluster. So a lone change after a quiet spell is read at once, an
//! event sent with a change is read at most [`WINDOW`] after it (within the main loop's burst),
//! and a change within a stream of heartbeats waits at most [`NO_CHANGE_WINDOW`]. Each wakeup
//! costs about 0.15 ms of CPU at 100,000 Nodes (docs/benchmarks.md): 100 a second at [`WINDOW`],
//! 25 at [`NO_CHANGE_WINDOW`].
//!
//! The pace sits between ureq's TCP transport and its TLS (the connector chain of ureq's
//! `unversioned` module, pinned by Cargo.lock): it spaces the reads of the socket only, never
//! what is already buffered.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ureq::Error;
use ureq::unversioned::transport::{Buffers, ConnectionDetails, Connector, NextTimeout, Transport};

/// The least time between two reads of a watch's socket, and the window after a change: well
/// within the main loop's burst window (20 ms, `BURST`, checked where it is defined), so that
/// events the API sends together are still written together.
pub const WINDOW: Duration = Duration::from_millis(10);

/// The longest window: while the watch brings only events that change nothing.
pub const NO_CHANGE_WINDOW: Duration = Duration::from_millis(40);

/// A read that returned sooner than this found its bytes waiting.
const WAITING: Duration = Duration::from_millis(1);

/// What is read at most per wakeup: [`WINDOW`] apart, 100 MiB a second (a burst of 1,000
/// Nodes of 10 KB is 10 MB).
pub const INPUT_BUFFER: usize = 1 << 20;

/// Set when the events read brought a change: the next read of the socket is at most
/// [`WINDOW`] away. Shared by the watch's transport and the reader of its events.
#[derive(Debug, Clone, Default)]
pub struct Hurry(Arc<AtomicBool>);

impl Hurry {
    pub fn now(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether it was set since the last take.
    pub fn take(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }
}

/// Wraps the connection the chain made so far (TCP, or a proxy's tunnel) in a [`Paced`]
/// transport.
#[derive(Debug, Clone)]
pub struct Pace(pub Hurry);

impl<In: Transport> Connector<In> for Pace {
    type Out = Paced<In>;

    fn connect(
        &self,
        _details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, Error> {
        Ok(chained.map(|inner| Paced::new(inner, self.0.clone(), WINDOW, NO_CHANGE_WINDOW)))
    }
}

/// A transport whose reads of the socket are a window apart, the window between `shortest`
/// and `longest` as the module says.
#[derive(Debug)]
pub struct Paced<T> {
    inner: T,
    hurry: Hurry,
    shortest: Duration,
    longest: Duration,
    window: Duration,
    last_read: Option<Instant>,
    /// The last read found its bytes waiting.
    found_waiting: bool,
}

impl<T> Paced<T> {
    fn new(inner: T, hurry: Hurry, shortest: Duration, longest: Duration) -> Paced<T> {
        Paced {
            inner,
            hurry,
            shortest,
            longest,
            window: shortest,
            last_read: None,
            found_waiting: false,
        }
    }
}

impl<T: Transport> Transport for Paced<T> {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), Error> {
        self.inner.transmit_output(amount, timeout)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, Error> {
        self.window = match self.hurry.take() || !self.found_waiting {
            true => self.shortest,
            false => (self.window * 2).min(self.longest),
        };
        if let Some(wait) = self
            .last_read
            .and_then(|t| self.window.checked_sub(t.elapsed()))
        {
            std::thread::sleep(wait);
        }
        let asked = Instant::now();
        let read = self.inner.await_input(timeout);
        let now = Instant::now();
        self.found_waiting = now - asked < WAITING;
        self.last_read = Some(now);
        read
    }

    fn is_open(&mut self) -> bool {
        self.inner.is_open()
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ureq::unversioned::transport::LazyBuffers;

    /// Records when it was read; each read brings one byte, at once or after `blocks`.
    #[derive(Debug)]
    struct Recording {
        buffers: LazyBuffers,
        reads: Vec<Instant>,
        blocks: Option<Duration>,
    }

    impl Transport for Recording {
        fn buffers(&mut self) -> &mut dyn Buffers {
            &mut self.buffers
        }
        fn transmit_output(&mut self, _: usize, _: NextTimeout) -> Result<(), Error> {
            Ok(())
        }
        fn await_input(&mut self, _: NextTimeout) -> Result<bool, Error> {
            self.reads.push(Instant::now());
            if let Some(b) = self.blocks {
                std::thread::sleep(b);
            }
            self.buffers.input_append_buf()[0] = b'x';
            self.buffers.input_appended(1);
            Ok(true)
        }
        fn is_open(&mut self) -> bool {
            true
        }
    }

    fn timeout() -> NextTimeout {
        NextTimeout {
            after: ureq::unversioned::transport::time::Duration::Exact(Duration::from_secs(60)),
            reason: ureq::Timeout::RecvBody,
            per_read: None,
            per_write: None,
        }
    }

    fn paced(shortest: Duration, longest: Duration) -> Paced<Recording> {
        let inner = Recording {
            buffers: LazyBuffers::new(16, 16),
            reads: Vec::new(),
            blocks: None,
        };
        Paced::new(inner, Hurry::default(), shortest, longest)
    }

    fn read(t: &mut Paced<Recording>) {
        assert!(t.await_input(timeout()).unwrap());
        t.buffers().input_consume(1);
    }

    fn gaps(t: &Paced<Recording>) -> Vec<Duration> {
        t.inner.reads.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[test]
    fn reads_that_find_bytes_waiting_and_no_change_grow_apart_to_the_longest_window() {
        let (shortest, longest) = (Duration::from_millis(20), Duration::from_millis(60));
        let mut t = paced(shortest, longest);
        for _ in 0..5 {
            read(&mut t);
        }
        // Lower bounds only: a sleep never ends early. The first read after the first is a
        // shortest window away (nothing was known of the stream), then 40, 60, 60.
        let g = gaps(&t);
        assert!(g[0] >= shortest, "{g:?}");
        assert!(g[1] >= shortest * 2, "{g:?}");
        assert!(g[2] >= longest && g[3] >= longest, "{g:?}");
    }

    #[test]
    fn after_a_change_or_a_quiet_read_the_window_is_the_shortest_again() {
        let s = Duration::from_millis(20);
        let mut t = paced(s, Duration::from_secs(30));
        let mut windows = Vec::new();
        let mut step = |t: &mut Paced<Recording>| {
            read(t);
            windows.push(t.window / s.as_millis() as u32);
        };
        // Bytes waiting at every read: 1, 2, 4 shortest windows.
        for _ in 0..3 {
            step(&mut t);
        }
        // A change read: the shortest again, then growing.
        t.hurry.now();
        step(&mut t);
        step(&mut t);
        // A read that waits for its bytes: the one after it is a shortest window away.
        t.inner.blocks = Some(WAITING * 5);
        step(&mut t);
        step(&mut t);
        let ms = |n: u64| Duration::from_millis(n);
        assert_eq!(windows, [ms(1), ms(2), ms(4), ms(1), ms(2), ms(4), ms(1)]);
        assert!(gaps(&t).iter().all(|g| *g >= s), "{:?}", gaps(&t));
    }

    #[test]
    fn a_first_read_and_a_read_after_a_quiet_window_are_not_held() {
        // A window no loaded machine's scheduling comes near.
        let window = Duration::from_secs(30);
        let mut t = paced(window, window);
        let start = Instant::now();
        read(&mut t);
        assert!(t.inner.reads[0] - start < window);
        // Quiet for a window since the last read.
        t.last_read = Instant::now().checked_sub(window);
        let before = Instant::now();
        read(&mut t);
        assert!(t.inner.reads[1] - before < window);
    }
}
