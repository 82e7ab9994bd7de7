//! ADD killed at each of its crash points (the `crash-points` feature, off in release builds):
//! the runtime's DEL afterwards leaves nothing behind, and the retried ADD works.
//!
//! Run with `cargo test --features crash-points --test vxlan_crash`; without the feature this
//! file has no tests.

#![cfg(feature = "crash-points")]

mod vxlan_support;

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
    for step in ["1", "2"] {
        let pod = topo.new_pod(1, &format!("c{step}"));
        let out = topo.cni_env(
            1,
            "ADD",
            &pod,
            &pod.path(),
            &conf,
            "",
            &[("STICKY_CRASH_AT", step)],
        );
        assert!(!out.status.success(), "crash point {step} was not reached");
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
}
