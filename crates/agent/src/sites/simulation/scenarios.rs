//! The scenarios (issue 33's six and issue 36's healing), each a test whose name contains
//! `simulation`, each run with the seeds of [`seeds`]: `STICKY_SIM_SEED=<n>` replays one. The
//! bounds are the shipped settings' promises (docs/sites.md, "Healing"): a failing scenario
//! prints its seed, what it measured and every agent's log.

use std::time::Duration;

use super::{CLUSTER, Nat, World};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The seeds each scenario runs with: `STICKY_SIM_SEED`, or three.
fn seeds() -> Vec<u64> {
    match std::env::var("STICKY_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => vec![1, 2, 3],
    }
}

/// Runs `scenario` for every seed; a failure names its seed and shows the logs.
fn each_seed(scenario: impl Fn(&mut World) -> Result<(), String>, a: Nat, b: Nat) {
    for seed in seeds() {
        let mut w = World::new(seed, &CLUSTER, a, b);
        if let Err(why) = settle(&mut w).and_then(|()| scenario(&mut w)) {
            panic!(
                "seed {seed} (replay: STICKY_SIM_SEED={seed}): at {:.1} s: {why}\n{}",
                w.t.as_secs_f64(),
                w.logs()
            );
        }
    }
}

/// The cluster comes up with the API: every pair of sites talks within two minutes; then a
/// minute for what the gateways publish (where their dial-in peers come from) to reach every
/// node.
fn settle(w: &mut World) -> Result<(), String> {
    w.run_until(secs(120), all_talk)
        .ok_or("the cluster did not come up within 120 s")?;
    w.run(secs(60));
    Ok(())
}

/// A pod on each site's member reaches one on every other site's.
fn all_talk(w: &mut World) -> bool {
    w.ping("a2", "c2") && w.ping("a2", "b2") && w.ping("b2", "c2")
}

/// Runs until `ok`, at most `within`: the time it took, or why not.
fn heals(
    w: &mut World,
    what: &str,
    within: Duration,
    ok: impl FnMut(&mut World) -> bool,
) -> Result<Duration, String> {
    let took = w
        .run_until(within, ok)
        .ok_or_else(|| format!("{what}: not within {} s", within.as_secs()))?;
    // What each scenario measured, for `--no-capture`.
    eprintln!("SIM {what}: {:.1} s", took.as_secs_f64());
    Ok(took)
}

/// Every second for `d`: `ok` holds.
fn holds(
    w: &mut World,
    what: &str,
    d: Duration,
    ok: impl FnMut(&mut World) -> bool,
) -> Result<(), String> {
    holds_but_for(w, what, d, 0, ok)
}

/// Every second for `d`: `ok` holds, or fails for at most `seconds` in a row.
fn holds_but_for(
    w: &mut World,
    what: &str,
    d: Duration,
    seconds: u32,
    mut ok: impl FnMut(&mut World) -> bool,
) -> Result<(), String> {
    let end = w.t + d;
    let mut broken = 0;
    while w.t < end {
        broken = if ok(w) { 0 } else { broken + 1 };
        if broken > seconds {
            return Err(format!("{what}: broke for more than {seconds} s"));
        }
        w.run(secs(1));
    }
    Ok(())
}

/// A and B punch a direct tunnel (both gateways say so, and their pods talk) within 180 s.
fn punched(w: &mut World) -> Result<Duration, String> {
    heals(w, "A and B punch a direct tunnel", secs(180), |w| {
        w.path("a1", "edge-b").as_deref() == Some("direct (punched)")
            && w.path("b1", "edge-a").as_deref() == Some("direct (punched)")
            && w.ping("a2", "b2")
    })
}

fn expect_active(w: &World, nodes: &[&str], want: &str) -> Result<(), String> {
    for n in nodes {
        let got = w.active(n);
        if got.as_deref() != Some(want) {
            return Err(format!(
                "{n} takes {got:?} as edge-a's active gateway, not {want}"
            ));
        }
    }
    Ok(())
}

/// Site A's active gateway cut off with the API away: A's pods reach the other sites through
/// the standby within 10 s; back, the old gateway does not take over (no flapping); the
/// standby cut off in turn: back on the first within 10 s again.
#[test]
fn simulation_failover_and_return() {
    each_seed(
        |w| {
            w.api_up = false;
            w.run(secs(10));
            w.link("a1", false);
            heals(w, "a2 reaches c2 and b2 after a1 is cut", secs(10), |w| {
                w.ping("a2", "c2") && w.ping("a2", "b2")
            })?;
            expect_active(w, &["a2", "a3"], "a3")?;
            w.link("a1", true);
            heals(w, "a1 takes its site's choice", secs(20), |w| {
                w.active("a1").as_deref() == Some("a3")
            })?;
            holds(w, "no flapping after a1 is back", secs(60), |w| {
                all_talk(w) && expect_active(w, &["a1", "a2", "a3"], "a3").is_ok()
            })?;
            w.link("a3", false);
            heals(w, "a2 reaches c2 and b2 after a3 is cut", secs(10), |w| {
                w.ping("a2", "c2") && w.ping("a2", "b2")
            })?;
            expect_active(w, &["a1", "a2"], "a1")
        },
        Nat::Cone,
        Nat::Symmetric,
    );
}

/// Site A's active gateway cut off while A↔B is punched, the API away (issue 36): A's pods
/// reach the cloud and B again within 6 s. B cannot hear the standby (its NAT holds no mapping
/// towards it), so it must leave its direct path to a1 for the relay by itself: a punch peer is
/// kept alive every second and is dead after three seconds of silence.
#[test]
fn simulation_failover_with_a_punched_path() {
    each_seed(
        |w| {
            punched(w)?;
            w.api_up = false;
            w.link("a1", false);
            heals(w, "a2 reaches c2 and b2 after a1 is cut", secs(6), |w| {
                w.ping("a2", "c2") && w.ping("a2", "b2")
            })?;
            holds(w, "after the failover", secs(60), all_talk)?;
            // And again: a1 back (it takes its site's choice), then a3 cut.
            w.link("a1", true);
            heals(w, "a1 takes its site's choice", secs(20), |w| {
                w.active("a1").as_deref() == Some("a3")
            })?;
            w.run(secs(10));
            w.link("a3", false);
            heals(w, "a2 reaches c2 and b2 after a3 is cut", secs(6), |w| {
                w.ping("a2", "c2") && w.ping("a2", "b2")
            })?;
            // a1 and b1 punch again from what they cached. The move from the relay to the
            // direct path drops what crosses before the far side has moved its allowed IPs (up
            // to a round, 1 s): docs/sites.md, "Routing and allowed IPs", the limit.
            holds_but_for(w, "after the second failover", secs(60), 1, all_talk)
        },
        Nat::Cone,
        Nat::Cone,
    );
}

/// With the API away, member a2 loses a1 alone for 5 s (a LAN fault between the two): it
/// moves to the standby while the rest of the site stays; when the fault is gone it follows
/// its site back to a1 within 10 s, and pods talk.
#[test]
fn simulation_a_member_that_lost_its_gateway_alone_follows_its_site_back() {
    each_seed(
        |w| {
            w.api_up = false;
            w.run(secs(10));
            w.net.block("a1", "a2", true);
            heals(w, "a2 moves to a3 alone", secs(10), |w| {
                w.active("a2").as_deref() == Some("a3")
            })?;
            expect_active(w, &["a1", "a3"], "a1")?;
            w.net.block("a1", "a2", false);
            heals(w, "a2 follows its site back to a1", secs(10), |w| {
                w.active("a2").as_deref() == Some("a1") && all_talk(w)
            })?;
            holds(w, "after the fault", secs(60), all_talk)
        },
        Nat::Cone,
        Nat::Symmetric,
    );
}

/// Two cone NATs: the gateways punch a direct tunnel; when site B moves behind a NAT that
/// defeats it (a carrier's CGNAT), A↔B falls back to the relay within 30 s.
#[test]
fn simulation_punch_and_fallback_to_the_relay() {
    each_seed(
        |w| {
            punched(w)?;
            let r = w.net.routers.get_mut("edge-b").ok_or("no router B")?;
            r.nat = Nat::Symmetric;
            r.forget();
            heals(w, "a2 reaches b2 through the relay", secs(30), |w| {
                w.ping("a2", "b2")
            })?;
            let path = w.path("a1", "edge-b").unwrap_or_default();
            if !path.starts_with("relayed via cloud") {
                return Err(format!("a1 says edge-b is {path:?}"));
            }
            // The relay forwards A and B's own session: no device's peer carries another
            // site's subnets (issue 34).
            holds(w, "the relay carries A and B", secs(120), |w| {
                all_talk(w) && w.relay_reads().is_none()
            })
        },
        Nat::Cone,
        Nat::Cone,
    );
}

/// Router B reboots (30 s down, every mapping gone, new ports after) while A↔B is punched
/// and the API is away (no new NAT discovery to learn from): every pair talks again within
/// 15 s of its return, A↔B through the relay.
#[test]
fn simulation_router_reboot() {
    each_seed(
        |w| {
            punched(w)?;
            w.api_up = false;
            let r = w.net.routers.get_mut("edge-b").ok_or("no router B")?;
            r.up = false;
            r.forget();
            w.run(secs(30));
            if let Some(r) = w.net.routers.get_mut("edge-b") {
                r.up = true;
            }
            heals(
                w,
                "every pair talks after router B is back",
                secs(15),
                all_talk,
            )?;
            holds(w, "after the reboot", secs(60), all_talk)
        },
        Nat::Cone,
        Nat::Cone,
    );
}

/// Router A gets a new public address (a PPPoE reconnect: every mapping gone) with the API
/// away: A reaches the cloud within 15 s and B within 30 s.
#[test]
fn simulation_wan_renumbering() {
    each_seed(
        |w| {
            w.api_up = false;
            w.run(secs(10));
            let r = w.net.routers.get_mut("edge-a").ok_or("no router A")?;
            r.public = "203.0.113.11".parse().map_err(|_| "address")?;
            r.forget();
            heals(w, "a2 reaches c2", secs(15), |w| w.ping("a2", "c2"))?;
            heals(w, "a2 reaches b2", secs(30), |w| w.ping("a2", "b2"))?;
            holds(w, "after the renumbering", secs(60), all_talk)
        },
        Nat::Cone,
        Nat::Symmetric,
    );
}

/// Router A gets a new public address while A↔B is punched and the API is up (issue 36): A
/// reaches the cloud within 15 s and B within 30 s (through the relay, then punched again
/// from the new mappings the cloud publishes).
#[test]
fn simulation_wan_renumbering_with_the_api_up() {
    each_seed(
        |w| {
            punched(w)?;
            let r = w.net.routers.get_mut("edge-a").ok_or("no router A")?;
            r.public = "203.0.113.11".parse().map_err(|_| "address")?;
            r.forget();
            heals(w, "a2 reaches c2 (API up)", secs(15), |w| {
                w.ping("a2", "c2")
            })?;
            heals(w, "a2 reaches b2 (API up)", secs(30), |w| {
                w.ping("a2", "b2")
            })?;
            holds(w, "after the renumbering (API up)", secs(60), all_talk)?;
            punched(w).map(|_| ())
        },
        Nat::Cone,
        Nat::Cone,
    );
}

/// The relay's gateway restarts with the API away (its agent from the cache, `sticky-wg` with
/// an empty device): the relayed pair talks again within 10 s.
#[test]
fn simulation_relay_restart() {
    each_seed(
        |w| {
            w.api_up = false;
            w.run(secs(10));
            w.restart("c1");
            heals(
                w,
                "a2 reaches b2 through the restarted relay",
                secs(10),
                |w| w.ping("a2", "b2"),
            )?;
            holds(w, "after the restart", secs(60), all_talk)
        },
        Nat::Cone,
        Nat::Symmetric,
    );
}

/// An hour with the API away and 1 % of datagrams lost: no gateway changes, no tunnel goes
/// down, and pods talk (a ping crosses two to four lossy datagrams, so some fail: 95 % pass).
#[test]
fn simulation_api_away_for_an_hour() {
    each_seed(
        |w| {
            punched(w)?;
            w.api_up = false;
            w.net.loss = 0.01;
            let logged = w.logs().lines().count();
            let (mut pings, mut passed, mut relayed) = (0u32, 0u32, 0u32);
            let end = w.t + secs(3600);
            while w.t < end {
                w.run(secs(10));
                pings += 3;
                passed += u32::from(w.ping("a2", "c2"))
                    + u32::from(w.ping("a2", "b2"))
                    + u32::from(w.ping("b2", "c2"));
                relayed += u32::from(w.path("a1", "edge-b").as_deref() != Some("direct (punched)"));
            }
            eprintln!(
                "SIM an hour at 1 % loss: {passed} of {pings} pings passed, A-B not punched at \
                 {relayed} of {} samples",
                pings / 3
            );
            // A lost keepalive or two must not read as a dead direct path.
            if relayed > 0 {
                return Err(format!("A-B left the punched path at {relayed} samples"));
            }
            expect_active(w, &["a1", "a2", "a3"], "a1")?;
            let logs = w.logs();
            let new: Vec<&str> = logs.lines().skip(logged).collect();
            if let Some(l) = new
                .iter()
                .find(|l| l.contains("DOWN") || l.contains("steps down"))
            {
                return Err(format!("within the hour: {l}"));
            }
            let rate = f64::from(passed) / f64::from(pings);
            if rate < 0.95 {
                return Err(format!("{passed} of {pings} pings passed"));
            }
            Ok(())
        },
        Nat::Cone,
        Nat::Cone,
    );
}
