//! The watch's socket, read at most once per [`WINDOW`]: what arrived meanwhile is read in one
//! go.
//!
//! At 100,000 Nodes the kubelets' status updates (one per Node every 5 minutes) are about 330
//! watch events a second of 10 KB each, and a real API server writes each in three pieces (its
//! chunk header, its text, its trailer: Go's `net/http` through a 4 KiB buffer). Read as they
//! come, that is three wakeups and three `recv` calls an event: measured, 3 context switches an
//! event and most of the agent's idle CPU, in the kernel. Read at most every [`WINDOW`], it is
//! at most 100 wakeups a second whatever the cluster, and an event waits at most [`WINDOW`]
//! longer. A watch that was quiet for [`WINDOW`] is read at once: a lone change is not delayed.
//!
//! The pace sits between ureq's TCP transport and its TLS (the connector chain of ureq's
//! `unversioned` module, pinned by Cargo.lock): it spaces the reads of the socket only, never
//! what is already buffered.

use std::time::{Duration, Instant};

use ureq::Error;
use ureq::unversioned::transport::{Buffers, ConnectionDetails, Connector, NextTimeout, Transport};

/// The least time between two reads of a watch's socket: well within the main loop's burst
/// window (20 ms, `BURST`, checked where it is defined), so that events the API sends together
/// are still written together.
pub const WINDOW: Duration = Duration::from_millis(10);

/// What is read at most per wakeup: [`WINDOW`] apart, 100 MiB a second (a burst of 1,000
/// Nodes of 10 KB is 10 MB).
pub const INPUT_BUFFER: usize = 1 << 20;

/// Wraps the connection the chain made so far (TCP, or a proxy's tunnel) in a [`Paced`]
/// transport of [`WINDOW`].
#[derive(Debug, Clone, Copy)]
pub struct Pace;

impl<In: Transport> Connector<In> for Pace {
    type Out = Paced<In>;

    fn connect(
        &self,
        _details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, Error> {
        Ok(chained.map(|inner| Paced {
            inner,
            window: WINDOW,
            last_read: None,
        }))
    }
}

/// A transport whose reads of the socket are at least `window` apart.
#[derive(Debug)]
pub struct Paced<T> {
    inner: T,
    window: Duration,
    last_read: Option<Instant>,
}

impl<T: Transport> Transport for Paced<T> {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), Error> {
        self.inner.transmit_output(amount, timeout)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, Error> {
        if let Some(wait) = self
            .last_read
            .and_then(|t| self.window.checked_sub(t.elapsed()))
        {
            std::thread::sleep(wait);
        }
        let read = self.inner.await_input(timeout);
        self.last_read = Some(Instant::now());
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

    /// Records when it was read; each read brings one byte.
    #[derive(Debug)]
    struct Recording {
        buffers: LazyBuffers,
        reads: Vec<Instant>,
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

    fn paced(window: Duration) -> Paced<Recording> {
        Paced {
            inner: Recording {
                buffers: LazyBuffers::new(16, 16),
                reads: Vec::new(),
            },
            window,
            last_read: None,
        }
    }

    fn read(t: &mut Paced<Recording>) {
        assert!(t.await_input(timeout()).unwrap());
        t.buffers().input_consume(1);
    }

    #[test]
    fn reads_of_the_socket_are_a_window_apart() {
        let window = Duration::from_millis(30);
        let mut t = paced(window);
        for _ in 0..3 {
            read(&mut t);
        }
        // Lower bounds only: a sleep never ends early.
        let reads = &t.inner.reads;
        assert!(reads[1] - reads[0] >= window);
        assert!(reads[2] - reads[1] >= window);
    }

    #[test]
    fn a_first_read_and_a_read_after_a_quiet_window_are_not_held() {
        // A window no loaded machine's scheduling comes near.
        let window = Duration::from_secs(30);
        let mut t = paced(window);
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
