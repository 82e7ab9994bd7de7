//! How every sticky-cni program runs and exits: both plugins in either role (a CNI plugin, or
//! the operator's tool when run without `CNI_COMMAND`) and the node agent.
//!
//! [`main`] hands the run its standard output and turns the outcome into the exit code and
//! one line on stderr. Its one rule beyond that: a reader that goes away is no error.
//! `sticky-ipam list | head -1` closes the pipe after one line; what the program still writes
//! is discarded, it finishes its work, and it exits as that work came out, saying nothing
//! about the pipe. (Rust ignores `SIGPIPE`, so without this a `print!` panics and a `?` on a
//! write reports "Broken pipe".)

use std::fmt::Display;
use std::io::{self, ErrorKind, Write};
use std::process::ExitCode;

/// What a program's run failed with, told on stderr as `<program>: <error>`.
pub trait Failure: Display {
    /// The documented exit code (never 0).
    fn exit_code(&self) -> u8;
    /// A mistake on the command line: stderr also says where the help is.
    fn is_usage(&self) -> bool {
        false
    }
}

/// The program's standard output (or, in a test, any writer). Once its reader has gone away,
/// writes are discarded and succeed; any other error is the caller's.
pub struct Output<W: Write> {
    inner: W,
    reader_gone: bool,
}

/// The standard output [`main`] hands a run (not locked for the run's life: a long-running
/// program's other threads may still print).
pub type Stdout = Output<io::Stdout>;

impl<W: Write> Output<W> {
    pub fn new(inner: W) -> Output<W> {
        Output {
            inner,
            reader_gone: false,
        }
    }

    /// Whether a write found the reader gone (all since were discarded).
    pub fn reader_gone(&self) -> bool {
        self.reader_gone
    }

    /// A broken pipe becomes `Ok(ok)`, and everything after it is discarded.
    fn unless_gone<T>(&mut self, result: io::Result<T>, ok: T) -> io::Result<T> {
        match result {
            Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                self.reader_gone = true;
                Ok(ok)
            }
            other => other,
        }
    }
}

impl<W: Write> Write for Output<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.reader_gone {
            return Ok(buf.len());
        }
        let written = self.inner.write(buf);
        self.unless_gone(written, buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.reader_gone {
            return Ok(());
        }
        let flushed = self.inner.flush();
        self.unless_gone(flushed, ())
    }
}

/// Runs `run` with the standard output, flushes it, and exits: 0 when the run succeeded (an
/// error at that last flush is told and exits 1); else `<program>: <error>` on stderr (and,
/// for a usage error, ``Try `<program> --help`.``) and the error's code.
pub fn main<E: Failure>(program: &str, run: impl FnOnce(&mut Stdout) -> Result<(), E>) -> ExitCode {
    let mut out = Output::new(io::stdout());
    let result = run(&mut out);
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Ok(()), Err(e)) => {
            eprintln!("{program}: writing output: {e}");
            ExitCode::FAILURE
        }
        (Err(err), _) => {
            eprintln!("{program}: {err}");
            if err.is_usage() {
                eprintln!("Try `{program} --help`.");
            }
            ExitCode::from(err.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe whose reader left after `room` bytes; or a disk that is full.
    struct Pipe {
        taken: Vec<u8>,
        room: usize,
        error: ErrorKind,
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.room - self.taken.len());
            if n == 0 {
                return Err(self.error.into());
            }
            self.taken.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn after_a_broken_pipe_writes_are_discarded_and_succeed_and_other_errors_are_kept() {
        let pipe = Pipe {
            taken: Vec::new(),
            room: 4,
            error: ErrorKind::BrokenPipe,
        };
        let mut out = Output::new(pipe);
        writeln!(out, "first line").unwrap();
        assert!(out.reader_gone());
        writeln!(out, "second line").unwrap();
        out.flush().unwrap();
        assert_eq!(out.inner.taken, b"firs");

        let full = Pipe {
            taken: Vec::new(),
            room: 4,
            error: ErrorKind::StorageFull,
        };
        let mut out = Output::new(full);
        let e = writeln!(out, "first line").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::StorageFull);
        assert!(!out.reader_gone());
    }
}
