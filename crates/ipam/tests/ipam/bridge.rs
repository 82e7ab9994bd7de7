//! Debian's reference `bridge` plugin chained with `"ipam": {"type": "sticky-ipam"}`, in network
//! namespaces the test creates (root only): real packets flow between two pods, and a pod
//! recreated under the same namespace/name (new netns, new container id) is back on its
//! address with working connectivity. The "node" is itself a namespace: the machine's own
//! network is never touched.

use sticky_testkit::support;

use std::path::Path;

use serde_json::json;
use support::*;

fn ping(from: &Netns, to: std::net::IpAddr) -> bool {
    from.try_exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", &to.to_string()])
}

#[test]
#[ignore = "needs root: network namespaces"]
fn bridge_with_sticky_ipam_brings_a_recreated_pod_back_on_its_address() {
    assert_root("network namespaces");
    let bridge = reference_plugin("bridge");
    let tmp = temp_dir();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(sticky_bin(), bin.join("sticky-ipam")).unwrap();
    std::os::unix::fs::symlink(&bridge, bin.join("bridge")).unwrap();
    let data = tmp.path().join("data");

    // Dropped in reverse order: pods first, then the node (which takes the bridge with it).
    let node = Netns::new("node");
    let brname = format!("stkbr{}", std::process::id() % 100_000);
    let conf = Conf::new("stkbridge", &data, json!([[{"subnet": "10.77.0.0/24"}]]))
        .top("type", json!("bridge"))
        .top("bridge", json!(brname))
        .top("isGateway", json!(true));
    let plugin = Plugin {
        bin: bin.join("bridge"),
        wrapper: vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            node.name.clone(),
        ],
    };
    let call_with = |conf: &Conf, cmd: &str, cid: &str, ns: &Netns, pod: &Pod| {
        Call::new(cmd, cid, &conf.bytes())
            .netns(&ns.path())
            .pod(pod)
            .env("CNI_PATH", bin.to_str().unwrap())
    };
    let call = |cmd: &str, cid: &str, ns: &Netns, pod: &Pod| call_with(&conf, cmd, cid, ns, pod);
    let web = Pod::new("default", "web-0", "uid-web-1");
    let db = Pod::new("default", "db-0", "uid-db-1");

    let pod_a = Netns::new("pa");
    let pod_b = Netns::new("pb");
    let ra = plugin.run(&call("ADD", "a1", &pod_a, &web)).ok();
    let rb = plugin.run(&call("ADD", "b1", &pod_b, &db)).ok();
    let (ip_a, ip_b) = (result_ip(&ra), result_ip(&rb));
    assert_ne!(ip_a, ip_b);
    // The pod's interface really has the address sticky-ipam handed out.
    let shown = pod_a.exec(&["ip", "-4", "-o", "addr", "show", "dev", "eth0"]);
    assert!(
        shown.contains(&format!("{ip_a}/24")),
        "eth0 in pod A: {shown}"
    );
    assert!(ping(&pod_a, ip_b), "no ping from A ({ip_a}) to B ({ip_b})");
    assert!(
        !Path::new(&format!("/sys/class/net/{brname}")).exists(),
        "the bridge leaked into the machine's own namespace"
    );
    // CHECK runs through bridge into sticky-ipam with the cached result.
    let prev = conf.clone().prev_result(&ra);
    plugin
        .run(&call_with(&prev, "CHECK", "a1", &pod_a, &web))
        .ok_empty();

    // The pod is deleted (as kubelet does: DEL, then the sandbox's netns goes) ...
    plugin
        .run(&call_with(&prev, "DEL", "a1", &pod_a, &web))
        .ok_empty();
    drop(pod_a);
    assert!(!ping(&pod_b, ip_a), "{ip_a} still answers after DEL");
    // ... another pod starts meanwhile and must not get A's address ...
    let pod_c = Netns::new("pc");
    let rc = plugin
        .run(&call(
            "ADD",
            "c1",
            &pod_c,
            &Pod::new("default", "other", "uid-o"),
        ))
        .ok();
    assert!(![ip_a, ip_b].contains(&result_ip(&rc)));
    // ... and A is recreated: new netns, new container id, new UID, same namespace/name.
    let pod_a2 = Netns::new("pa2");
    let web2 = Pod::new("default", "web-0", "uid-web-2");
    let ra2 = plugin.run(&call("ADD", "a2", &pod_a2, &web2)).ok();
    assert_eq!(result_ip(&ra2), ip_a, "the recreated pod changed address");
    assert!(ping(&pod_a2, ip_b), "no ping from recreated A to B");
    assert!(ping(&pod_b, ip_a), "no ping from B to recreated A");
    let st = check_dir(&data.join("stkbridge"), COMPLETED);
    assert_eq!(st.attached_to("a2"), vec![ip_a]);

    for (cid, ns, pod) in [("a2", &pod_a2, &web2), ("b1", &pod_b, &db)] {
        plugin.run(&call("DEL", cid, ns, pod)).ok_empty();
    }
    let st = check_dir(&data.join("stkbridge"), COMPLETED);
    assert_eq!(st.released_count(), 2);
}
