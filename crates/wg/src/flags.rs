//! `sticky-wg [--socket-dir DIR] IFNAME`, read with the tools' shared parser.

use std::path::PathBuf;

use sticky_primitives::args::{self, ArgsError, Spec};

/// WireGuard's standard socket directory: `wg show` looks there.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/wireguard";

/// `--help`.
pub const HELP: &str = "\
sticky-wg: the sites gateway's WireGuard data path (userspace, gotatun)

Usage: sticky-wg [--socket-dir DIR] IFNAME
       sticky-wg --help | --version

Makes IFNAME a persistent TUN device when it is absent (so its MTU, addresses and routes
outlive a restart), runs WireGuard on it and serves WireGuard's standard configuration
protocol on DIR/IFNAME.sock, so `wg show IFNAME` and `wg set IFNAME ...` work. It holds no
key and no configuration: the node agent pushes key, port and peers over that socket. It never
touches addresses, routes or the MTU. If IFNAME is deleted, it makes it again and serves an
empty device within about a second. SIGTERM/SIGINT: stops, removes the socket, leaves the TUN.

Options:
  --socket-dir DIR   where the UAPI socket goes (default /var/run/wireguard; made 0700)

The socket: each request is read whole and checked before anything is applied; a refused
one changes nothing and is answered errno=N, as wireguard-go answers:
  22  a key or value the protocol does not take (bad hex, port 70000, a host name, /99, ...)
  71  a line that is not key=value
   7  a line over 1024 bytes or a request over 16 MiB (the connection is then closed)
  28  a device that would hold more than 65536 peers
  98  the listen port is in use when the key brings the tunnel up
Peers set before the private key are held and configured with the key. A new private key,
listen port or fwmark for a running tunnel is applied on a fresh device with the peers as
they are (gotatun cannot rebind a running device; sessions handshake again). At most 16
connections at once (one more is closed at once); one silent for 5 s is closed, and a set
request is read within 30 s (one request at a time) or its connection is closed.
A panic aborts the process (SIGABRT), so its service manager starts a new one, which
takes over the dead one's socket.

Relaying: a peer whose endpoint is a relayed endpoint (an address in 100::/32, made by the
agent) is reached through the relay peer it names, which forwards the datagrams without a key
that decrypts them. Any device forwards, between two of its own peers only, a datagram that
comes from one's current endpoint and names the other. It logs what it forwarded and dropped
when that first changes, then at most once a minute.

Exit status: 0 after SIGTERM/SIGINT, 1 on an error, 2 on a usage error.
";

/// A command-line mistake.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error("{0}")]
    Name(#[from] crate::tun::Error),
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub ifname: String,
    pub socket_dir: PathBuf,
}

const SPEC: Spec = Spec {
    verb: "sticky-wg",
    flags: &[],
    values: &["--socket-dir"],
    repeatable: &[],
    positionals: &["IFNAME"],
};

/// Parses the arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Options, Error> {
    let p = args::parse(args, &[], &SPEC)?;
    let ifname = p.positionals[0].clone();
    crate::tun::check_name(&ifname)?;
    let socket_dir = PathBuf::from(p.value("--socket-dir").unwrap_or(DEFAULT_SOCKET_DIR));
    Ok(Options { ifname, socket_dir })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_interface_is_required_and_the_socket_dir_defaults_to_wireguards() {
        let o = parse(&args(&["stickywg0"])).unwrap();
        assert_eq!(o.ifname, "stickywg0");
        assert_eq!(o.socket_dir, PathBuf::from("/var/run/wireguard"));
        let o = parse(&args(&["--socket-dir", "/tmp/x", "wg1"])).unwrap();
        assert_eq!(o.socket_dir, PathBuf::from("/tmp/x"));
        let o = parse(&args(&["wg1", "--socket-dir=/tmp/y"])).unwrap();
        assert_eq!(o.socket_dir, PathBuf::from("/tmp/y"));
    }

    #[test]
    fn the_help_states_the_bounds_the_daemon_has() {
        use crate::uapi::{
            IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_LINE, MAX_PEERS, REQUEST_TIMEOUT, errno,
        };
        for says in [
            format!("over {MAX_LINE} bytes"),
            format!("over {} MiB", crate::uapi::MAX_REQUEST_BYTES >> 20),
            format!("more than {MAX_PEERS} peers"),
            format!("At most {MAX_CONNECTIONS}\nconnections"),
            format!("silent for {} s", IDLE_TIMEOUT.as_secs()),
            format!("read within {} s", REQUEST_TIMEOUT.as_secs()),
        ] {
            assert!(HELP.contains(&says), "--help does not say {says:?}");
        }
        for n in [
            errno::EINVAL,
            errno::EPROTO,
            errno::E2BIG,
            errno::ENOSPC,
            errno::EADDRINUSE,
        ] {
            assert!(
                HELP.contains(&format!("  {n:>2}  ")),
                "--help lacks errno {n}"
            );
        }
    }

    #[test]
    fn mistakes_are_usage_errors_quoting_the_input() {
        let cases: &[(&[&str], &str)] = &[
            (&[], "needs IFNAME"),
            (&["a", "b"], "\"b\""),
            (&["--nope", "a"], "\"--nope\""),
            (&["a", "--socket-dir"], "needs a value"),
            (&["a/b"], "\"a/b\""),
            (&["a234567890123456"], "\"a234567890123456\""),
        ];
        for (given, says) in cases {
            let err = parse(&args(given)).unwrap_err().to_string();
            assert!(err.contains(says), "{given:?}: {err}");
        }
    }
}
