//! ADD killed at each of its crash points (the `crash-points` feature, off in release builds):
//! the runtime's DEL afterwards leaves nothing behind, and the retried ADD works.
//!
//! Run with `cargo test --features crash-points --test vxlan_crash`; without the feature this
//! file has no tests.

#![cfg(feature = "crash-points")]

use sticky_testkit::vxlan_support;

use serde_json::json;
use vxlan_support::*;

#[test]
#[ignore = "needs root: network namespaces"]
fn add_killed_at_every_crash_point_then_del_leaves_nothing_and_retry_works() {
    assert_can_run();
    let mut topo = Topo::new(1500);
    topo.add_node(1, 1500);
    let conf = topo.conf(1, json!({"peers": [Topo::peer(1, false)]}));
    let probe = topo.new_pod(1, "probe");
    // Each ADD starts as a node's first does (no stamp: a full reconcile, which writes one), so
    // it passes every crash point there is; the points are counted until one ADD passes them all.
    let name = conf["name"].as_str().unwrap();
    let stamp = topo.state_dir(1).join(format!("{name}.stamp"));
    let mut reached = Vec::new();
    for n in 1.. {
        assert!(n < 20, "ADD still crashing at crash point {n}: {reached:?}");
        let step = n.to_string();
        let pod = topo.new_pod(1, &format!("c{step}"));
        let _ = std::fs::remove_file(&stamp);
        let out = topo.cni_env(
            1,
            "ADD",
            &pod,
            &pod.path(),
            &conf,
            "",
            &[("STICKY_CRASH_AT", &step)],
        );
        if out.status.success() {
            assert!(topo.del(&pod, &pod.path(), &conf).status.success());
            break;
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let point = stderr.lines().find(|l| l.starts_with("crash point "));
        reached.push(
            point
                .unwrap_or_else(|| panic!("not a crash at {step}: {stderr}"))
                .to_string(),
        );
        // The runtime cleans up a failed ADD with DEL: nothing is left, neither veth nor
        // allocation...
        assert!(topo.del(&pod, &pod.path(), &conf).status.success());
        assert_eq!(topo.pod_veths(1), 0, "after crash at {step}");
        assert_eq!(topo.allocations(1).len(), 0, "after crash at {step}");
        // ...and the retried ADD works.
        let r = topo.add(&pod, &conf);
        topo.add(&probe, &conf);
        assert!(
            topo.reaches(&probe, &ip_of(&r, false)),
            "after crash at {step}"
        );
        assert!(topo.del(&probe, &probe.path(), &conf).status.success());
        assert!(topo.del(&pod, &pod.path(), &conf).status.success());
    }
    for point in [
        "(temp file written)",
        "(vxlan add: node ready)",
        "(vxlan add: veth created)",
    ] {
        assert!(
            reached
                .iter()
                .any(|r| r.ends_with(&format!("{point}: aborting"))),
            "{point} never reached: {reached:?}"
        );
    }
}
