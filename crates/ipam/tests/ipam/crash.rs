//! Crash safety. With the `crash-points` feature the process aborts at the n-th crash point of
//! a call (`STICKY_CRASH_AT=n`); every step of ADD and DEL is hit in turn, and after each death
//! the data dir parses, no address is recorded twice, the name index is either not trusted or
//! exactly right, and the next call succeeds and converges.
//! Then random SIGKILLs of concurrent ADD/DEL processes, with the same checks.
//!
//! The crash-points binary is built once per test run into `target/crash` (or taken from
//! `STICKY_CRASH_BIN`), so a plain `cargo test` runs these tests.

use sticky_testkit::support;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use support::*;

const NET: &str = "crash";

fn crash_bin() -> Plugin {
    Plugin::at(crash_bin_path())
}

/// One crash scenario: builds its starting state in a fresh data dir, names the call to crash,
/// and checks the converged state after recovery.
struct Scenario {
    name: &'static str,
    setup: fn(&Path) -> (Conf, Call),
    /// Called with the data dir and the successful result of the recovery call (ADD) or
    /// `Null` (DEL), after convergence.
    verify: fn(&Path, &Conf, &serde_json::Value),
    /// The starting state holds OpenYurt markers (empty `<ip>_<ns>_<pod>` files).
    markers: bool,
}

fn v4(data: &Path) -> Conf {
    Conf::new(
        NET,
        data,
        json!([[{"subnet": "10.60.0.0/24", "rangeStart": "10.60.0.10", "rangeEnd": "10.60.0.20"}]]),
    )
}

fn pod_a() -> Pod {
    Pod::new("ns", "a", "uid-a")
}

fn run_ok(call: Call) -> serde_json::Value {
    Plugin::sticky().run(&call).ok()
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "first ADD on an empty data dir",
            setup: |d| {
                let c = v4(d);
                let call = Call::add("ca2", &c).pod(&pod_a());
                (c, call)
            },
            verify: |d, _, r| {
                let st = check_dir(&d.join(NET), COMPLETED);
                assert_eq!(st.attached_to("ca2"), vec![result_ip(r)]);
                assert_eq!(st.records.len(), 1);
            },
            markers: false,
        },
        Scenario {
            name: "ADD takes back a released lease",
            setup: |d| {
                let c = v4(d);
                run_ok(Call::add("cb", &c).pod(&Pod::new("ns", "b", "ub")));
                run_ok(Call::add("ca1", &c).pod(&pod_a()));
                run_ok(Call::add("cn", &c));
                run_ok(Call::del("ca1", &c).pod(&pod_a()));
                (
                    c.clone(),
                    Call::add("ca2", &c).pod(&Pod::new("ns", "a", "uid-a2")),
                )
            },
            verify: |d, _, r| {
                assert_eq!(result_ip(r), ip("10.60.0.11"));
                let st = check_dir(&d.join(NET), COMPLETED);
                assert_eq!(st.attached_to("ca2"), vec![ip("10.60.0.11")]);
                assert_eq!(st.attached_to("cb"), vec![ip("10.60.0.10")]);
                assert_eq!(st.attached_to("cn"), vec![ip("10.60.0.12")]);
                assert_eq!(st.records.len(), 3);
            },
            markers: false,
        },
        Scenario {
            name: "ADD takes over an attachment with the same UID",
            setup: |d| {
                let c = v4(d);
                run_ok(Call::add("ca1", &c).pod(&pod_a()));
                (c.clone(), Call::add("ca2", &c).pod(&pod_a()))
            },
            verify: |d, _, r| {
                assert_eq!(result_ip(r), ip("10.60.0.10"));
                let st = check_dir(&d.join(NET), COMPLETED);
                assert_eq!(st.attached_to("ca2"), vec![ip("10.60.0.10")]);
                assert!(st.attached_to("ca1").is_empty());
                assert_eq!(st.records.len(), 1);
            },
            markers: false,
        },
        Scenario {
            name: "ADD reclaims the earliest released lease",
            setup: |d| {
                let c = Conf::new(
                    NET,
                    d,
                    json!([[{"subnet": "10.60.1.0/24", "rangeStart": "10.60.1.10", "rangeEnd": "10.60.1.11"}]]),
                );
                for (cid, name) in [("c0", "p0"), ("c1", "p1")] {
                    run_ok(Call::add(cid, &c).pod(&Pod::new("ns", name, name)));
                }
                for (cid, name) in [("c0", "p0"), ("c1", "p1")] {
                    run_ok(Call::del(cid, &c).pod(&Pod::new("ns", name, name)));
                }
                (
                    c.clone(),
                    Call::add("cn", &c).pod(&Pod::new("ns", "new", "un")),
                )
            },
            verify: |d, _, r| {
                assert_eq!(result_ip(r), ip("10.60.1.10"));
                let st = check_dir(&d.join(NET), COMPLETED);
                assert_eq!(st.sticky(ip("10.60.1.10")).pod, "new");
                let p1 = st.sticky(ip("10.60.1.11"));
                assert!(
                    p1.pod == "p1" && !p1.attached,
                    "p1's lease was lost: {p1:?}"
                );
                assert_eq!(st.records.len(), 2);
            },
            markers: false,
        },
        Scenario {
            name: "dual-stack ADD takes back both leases",
            setup: |d| {
                let c = Conf::new(
                    NET,
                    d,
                    json!([[{"subnet": "10.60.2.0/24"}], [{"subnet": "2001:db8:60::/64"}]]),
                );
                run_ok(Call::add("cb", &c).pod(&Pod::new("ns", "b", "ub")));
                run_ok(Call::add("ca1", &c).pod(&pod_a()));
                run_ok(Call::del("ca1", &c).pod(&pod_a()));
                (
                    c.clone(),
                    Call::add("ca2", &c).pod(&Pod::new("ns", "a", "u2")),
                )
            },
            verify: |d, _, r| {
                let want = vec![ip("10.60.2.3"), ip("2001:db8:60::3")];
                assert_eq!(result_ips(r), want);
                let st = check_dir(&d.join(NET), COMPLETED);
                let got: BTreeSet<IpAddr> = st.attached_to("ca2").into_iter().collect();
                assert_eq!(got, want.into_iter().collect());
                assert_eq!(st.records.len(), 4);
            },
            markers: false,
        },
        Scenario {
            name: "ADD without identity",
            setup: |d| {
                let c = v4(d);
                run_ok(Call::add("c0", &c));
                (c.clone(), Call::add("c1", &c))
            },
            verify: |d, _, r| {
                let st = check_dir(&d.join(NET), COMPLETED);
                assert_eq!(st.attached_to("c1"), vec![result_ip(r)]);
                assert_eq!(st.attached_to("c0"), vec![ip("10.60.0.10")]);
                assert_eq!(st.records.len(), 2);
            },
            markers: false,
        },
        Scenario {
            name: "DEL of a sticky attachment",
            setup: |d| {
                let c = v4(d);
                run_ok(Call::add("cb", &c).pod(&Pod::new("ns", "b", "ub")));
                run_ok(Call::del("cb", &c).pod(&Pod::new("ns", "b", "ub")));
                run_ok(Call::add("ca1", &c).pod(&pod_a()));
                (c.clone(), Call::del("ca1", &c).pod(&pod_a()))
            },
            verify: |d, c, _| {
                let st = check_dir(&d.join(NET), COMPLETED);
                let a = st.sticky(ip("10.60.0.11"));
                let b = st.sticky(ip("10.60.0.10"));
                assert!(!a.attached && !b.attached);
                assert!(a.release_seq > b.release_seq, "release order lost");
                let r = Plugin::sticky()
                    .run(&Call::add("ca2", c).pod(&pod_a()))
                    .ok();
                assert_eq!(result_ip(&r), ip("10.60.0.11"));
            },
            markers: false,
        },
        Scenario {
            name: "DEL of a record without identity",
            setup: |d| {
                let c = v4(d);
                run_ok(Call::add("c0", &c));
                (c.clone(), Call::del("c0", &c))
            },
            verify: |d, _, _| {
                let st = check_dir(&d.join(NET), COMPLETED);
                assert!(st.records.is_empty(), "{st:?}");
            },
            markers: false,
        },
        Scenario {
            name: "DEL with pod args of an adopted host-local record",
            setup: |d| {
                let c = v4(d);
                let net = d.join(NET);
                std::fs::create_dir_all(&net).unwrap();
                std::fs::write(net.join("10.60.0.15"), "h1\r\neth0").unwrap();
                (c.clone(), Call::del("h1", &c).pod(&pod_a()))
            },
            verify: |d, c, _| {
                let st = check_dir(&d.join(NET), COMPLETED);
                assert!(!st.sticky(ip("10.60.0.15")).attached);
                assert_eq!(st.records.len(), 1);
                let r = Plugin::sticky()
                    .run(&Call::add("ca2", c).pod(&pod_a()))
                    .ok();
                assert_eq!(result_ip(&r), ip("10.60.0.15"));
            },
            markers: false,
        },
        Scenario {
            name: "DEL with pod args of an adopted OpenYurt record",
            setup: |d| {
                let c = v4(d);
                let net = d.join(NET);
                std::fs::create_dir_all(&net).unwrap();
                std::fs::write(net.join("10.60.0.16"), "y1\r\neth0").unwrap();
                std::fs::write(net.join("10.60.0.16_ns_a"), "").unwrap();
                (c.clone(), Call::del("y1", &c).pod(&pod_a()))
            },
            verify: |d, c, _| {
                let st = check_dir(&d.join(NET), COMPLETED);
                assert!(!st.sticky(ip("10.60.0.16")).attached);
                assert_eq!(st.records.len(), 1);
                let r = Plugin::sticky()
                    .run(&Call::add("ca2", c).pod(&pod_a()))
                    .ok();
                assert_eq!(result_ip(&r), ip("10.60.0.16"));
            },
            markers: true,
        },
    ]
}

#[test]
fn every_crash_point_of_add_and_del_leaves_a_recoverable_data_dir() {
    let crash = crash_bin();
    let normal = Plugin::sticky();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for s in scenarios() {
        let mut n = 1;
        loop {
            assert!(n < 500, "{}: never completed", s.name);
            let tmp = temp_dir();
            let (conf, call) = (s.setup)(tmp.path());
            let net = tmp.path().join(NET);
            let out = crash.run(&call.clone().env("STICKY_CRASH_AT", &n.to_string()));
            if out.status.success() {
                break;
            }
            assert_eq!(
                out.status.signal(),
                Some(6),
                "{} at step {n}: expected an abort, got {:?}: {}",
                s.name,
                out.status,
                String::from_utf8_lossy(&out.stdout)
            );
            let what = format!("{} crashed at step {n}", s.name);
            let step = std::panic::catch_unwind(|| {
                // The state right after the crash parses, nothing is recorded twice.
                let after_kill = Rules {
                    allow_markers: s.markers,
                    ..AFTER_KILL
                };
                check_dir_named(&net, after_kill, &what);
                // The name index, if it would be trusted, names exactly the records.
                check_index(&net);
                // The same call again succeeds and converges.
                let r = normal.run(&call).ok();
                check_dir_named(&net, COMPLETED, &format!("{what}, after recovery"));
                assert!(
                    check_index(&net),
                    "{what}: index not restamped after recovery"
                );
                let before = snapshot(tmp.path());
                let again = normal.run(&call).ok();
                assert_eq!(again, r, "{what}: repeated call differs");
                assert_same(
                    &before,
                    &snapshot(tmp.path()),
                    &format!("{what}: repeated call"),
                );
                (s.verify)(tmp.path(), &conf, &r);
            });
            if let Err(e) = step {
                failures.push(panic_text(e));
            }
            n += 1;
        }
        assert!(
            n > 1,
            "{}: only {} crash points reached: are crash points built in?",
            s.name,
            n - 1
        );
        report.push(format!("{}: {} crash points", s.name, n - 1));
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "{} crash points left a bad state:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn check_dir_named(net: &Path, rules: Rules, what: &str) -> State {
    match std::panic::catch_unwind(|| check_dir(net, rules)) {
        Ok(s) => s,
        Err(e) => {
            let msg = panic_text(e);
            panic!(
                "{what}: {msg}\nfiles: {:?}",
                snapshot(net).keys().collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn random_sigkills_of_concurrent_adds_and_dels() {
    const PODS: usize = 10;
    const GENS: usize = 3;
    const MIN_KILLS: usize = 200;
    let tmp = temp_dir();
    let conf = Conf::new(
        NET,
        tmp.path(),
        json!([[{"subnet": "10.61.0.0/24", "rangeStart": "10.61.0.10", "rangeEnd": "10.61.0.17"}]]),
    );
    let net = tmp.path().join(NET);
    let p = Plugin::sticky();
    let (mut rng, seed) = Rng::from_time();
    eprintln!("random seed {seed}");
    let pod = |i: usize| {
        // Pods 8 and 9 have no identity: host-local records.
        (i < 8).then(|| Pod::new("ns", &format!("p{i}"), &format!("uid-p{i}")))
    };
    let call_for = |cmd: &str, i: usize, sandbox: usize| {
        let c = Call::new(cmd, &format!("p{i}s{sandbox}"), &conf.bytes());
        match pod(i) {
            Some(pod) => c.pod(&pod),
            None => c,
        }
    };
    let (mut kills, mut rounds, mut completed) = (0, 0, 0);
    while kills < MIN_KILLS {
        rounds += 1;
        assert!(
            rounds < 3000,
            "only {kills} kills landed in {rounds} rounds"
        );
        let mut children = Vec::new();
        for _ in 0..6 {
            let i = rng.below(PODS as u64) as usize;
            let sandbox = rng.below(GENS as u64) as usize;
            let cmd = if rng.below(2) == 0 { "ADD" } else { "DEL" };
            let kill_after = (rng.below(3) != 0).then(|| rng.below(6000));
            let call = call_for(cmd, i, sandbox);
            children.push((describe(&call), kill_after, p.spawn(&call)));
        }
        let start = std::time::Instant::now();
        let mut pending: Vec<_> = children
            .iter()
            .enumerate()
            .filter_map(|(k, (_, d, _))| d.map(|d| (d, k)))
            .collect();
        pending.sort();
        for (delay, k) in pending {
            let due = Duration::from_micros(delay);
            if let Some(left) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(left);
            }
            let _ = children[k].2.kill();
        }
        for (what, _, child) in children {
            let out = finish(child, what.clone());
            if out.status.signal() == Some(9) {
                kills += 1;
            } else if out.status.success() {
                completed += 1;
            } else {
                // A full range is an honest answer; anything else is a bug.
                let code = out.err_code();
                assert_eq!(
                    code,
                    100,
                    "round {rounds}: {what} failed: {}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
        }
        let st = check_dir_named(&net, AFTER_KILL, &format!("after round {rounds}"));
        check_index(&net);
        let mut seen = BTreeSet::new();
        for (name, (_, r)) in &st.records {
            let key = match r {
                Record::Sticky(s) if s.attached => (s.container_id.clone(), s.ifname.clone()),
                Record::Plain {
                    container_id,
                    ifname,
                } => (container_id.clone(), ifname.clone()),
                _ => continue,
            };
            assert!(
                seen.insert(key),
                "round {rounds}: {name}: attachment recorded twice"
            );
        }
    }
    eprintln!("{kills} kills, {completed} completed calls in {rounds} rounds");

    // Convergence: every sandbox deleted, then every identity pod re-added.
    for i in 0..PODS {
        for sandbox in 0..GENS {
            p.run(&call_for("DEL", i, sandbox)).ok_empty();
        }
    }
    let st = check_dir(&net, COMPLETED);
    assert!(
        st.records
            .values()
            .all(|(_, r)| matches!(r, Record::Sticky(s) if !s.attached)),
        "attachments left after every DEL: {st:?}"
    );
    let mut ips = BTreeSet::new();
    for i in 0..8 {
        let r = p.run(&call_for("ADD", i, 9)).ok();
        assert!(ips.insert(result_ip(&r)), "p{i}: address handed out twice");
    }
    let before = snapshot(tmp.path());
    for i in 0..8 {
        p.run(&call_for("ADD", i, 9)).ok();
    }
    assert_same(
        &before,
        &snapshot(tmp.path()),
        "repeated ADDs after convergence",
    );
    check_dir(&net, COMPLETED);
}
