//! `--doctor-every`: the agent runs `sticky-vxlan doctor`'s checks ([`sticky_vxlan::doctor`])
//! on a thread of its own now and then, and `/metrics` says per peer and per remote site what
//! the path to it is (`ok` or the cause), so a dashboard shows "node-17 → node-42: mtu" before anyone asks.
//! The checks write nothing; a run takes the probes' window (2.5 s) whatever the peers.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use sticky_vxlan::doctor::{self, Report};
use sticky_vxlan::status::now_unix;

/// The last periodic check's outcome.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Paths {
    /// Unix seconds of the last run.
    pub at: u64,
    /// Per peer (its underlay address): `ok` or the cause found on the path to it.
    pub peers: Vec<(String, String)>,
    /// Per remote site (with sites): `ok` or the cause found on the path to it.
    pub sites: Vec<(String, String)>,
    /// The causes found on this node itself.
    pub node: Vec<String>,
    /// Why the last run could not check anything.
    pub error: Option<String>,
}

impl Paths {
    fn of(report: Result<Report, doctor::Error>) -> Paths {
        let at = now_unix();
        let r = match report {
            Ok(r) => r,
            Err(e) => {
                return Paths {
                    at,
                    error: Some(e.to_string()),
                    ..Paths::default()
                };
            }
        };
        Paths {
            at,
            peers: (r.measured.peers.iter())
                .map(|p| (p.peer.to_string(), r.peer_state(p).to_string()))
                .collect(),
            sites: (r.measured.sites.iter().flat_map(|s| &s.remotes))
                .map(|s| (s.site.clone(), r.site_state(&s.site).to_string()))
                .collect(),
            node: (r.findings.iter())
                .filter(|f| f.peer.is_none() && f.site.is_none())
                .map(|f| f.cause.code().to_string())
                .collect(),
            error: None,
        }
    }
}

/// Runs the checks of the network in `config` every `every`, from a thread of its own, and
/// hands each outcome to `keep` (the agent keeps it in its shared state for `/metrics`).
pub fn start(config: PathBuf, every: Duration, keep: impl Fn(Paths) + Send + 'static) {
    let spawned = std::thread::Builder::new()
        .name("doctor".into())
        .spawn(move || {
            loop {
                let paths = Paths::of(doctor::run(&config));
                if let Some(e) = &paths.error {
                    eprintln!("sticky-vxlan-agent: doctor: {e}");
                }
                keep(paths);
                std::thread::sleep(every);
            }
        });
    if let Err(e) = spawned {
        eprintln!("sticky-vxlan-agent: doctor: cannot start its thread: {e}");
    }
}

/// The periodic check's metrics (docs/agent.md, "Metrics").
pub fn metrics(out: &mut String, p: &Paths) {
    let head = |out: &mut String, name: &str, help: &str| {
        let _ = writeln!(
            out,
            "# HELP sticky_vxlan_agent_{name} {help}\n# TYPE sticky_vxlan_agent_{name} gauge"
        );
    };
    head(
        out,
        "path_cause",
        "Per peer: 1 with the cause the last periodic doctor run found on the path to it (cause=\"ok\" when it passes).",
    );
    for (peer, cause) in &p.peers {
        let _ = writeln!(
            out,
            "sticky_vxlan_agent_path_cause{{peer=\"{peer}\",cause=\"{cause}\"}} 1"
        );
    }
    head(
        out,
        "site_path_cause",
        "Per remote site: 1 with the cause the last periodic doctor run found on the path to it (cause=\"ok\" when it passes).",
    );
    for (site, cause) in &p.sites {
        let _ = writeln!(
            out,
            "sticky_vxlan_agent_site_path_cause{{site=\"{site}\",cause=\"{cause}\"}} 1"
        );
    }
    head(
        out,
        "node_cause",
        "1 for each cause the last periodic doctor run found on this node itself.",
    );
    for cause in &p.node {
        let _ = writeln!(out, "sticky_vxlan_agent_node_cause{{cause=\"{cause}\"}} 1");
    }
    head(
        out,
        "doctor_ok",
        "1 when the last periodic doctor run could check, 0 when it could not (the log says why).",
    );
    let _ = writeln!(
        out,
        "sticky_vxlan_agent_doctor_ok {}",
        u8::from(p.error.is_none())
    );
    head(
        out,
        "doctor_last_run_timestamp_seconds",
        "Unix time of the last periodic doctor run.",
    );
    let _ = writeln!(
        out,
        "sticky_vxlan_agent_doctor_last_run_timestamp_seconds {}",
        p.at
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_peer_has_one_labelled_line_and_the_node_its_causes() {
        let mut out = String::new();
        metrics(
            &mut out,
            &Paths {
                at: 7,
                peers: vec![
                    ("192.0.2.2".into(), "ok".into()),
                    ("192.0.2.3".into(), "mtu".into()),
                ],
                sites: vec![("site-b".into(), "wan-mtu".into())],
                node: vec!["forward-drop".into()],
                error: None,
            },
        );
        for line in [
            "sticky_vxlan_agent_path_cause{peer=\"192.0.2.2\",cause=\"ok\"} 1",
            "sticky_vxlan_agent_path_cause{peer=\"192.0.2.3\",cause=\"mtu\"} 1",
            "sticky_vxlan_agent_site_path_cause{site=\"site-b\",cause=\"wan-mtu\"} 1",
            "sticky_vxlan_agent_node_cause{cause=\"forward-drop\"} 1",
            "sticky_vxlan_agent_doctor_ok 1",
            "sticky_vxlan_agent_doctor_last_run_timestamp_seconds 7",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from {out}");
        }
    }

    #[test]
    fn a_run_that_could_not_check_says_so() {
        let p = Paths::of(doctor::run(std::path::Path::new(
            "/nonexistent/10-x.conflist",
        )));
        assert!(p.error.is_some() && p.peers.is_empty());
        let mut out = String::new();
        metrics(&mut out, &p);
        assert!(out.contains("sticky_vxlan_agent_doctor_ok 0\n"), "{out}");
    }
}
