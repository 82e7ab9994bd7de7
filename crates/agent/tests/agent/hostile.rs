//! The agent in a hostile cluster (issue 19): Node objects that are wrong or malicious, an API
//! that misbehaves, an operator's broken file. Each test replays a review finding against three
//! node namespaces, the test API server (tests/kube_support) and a `sticky-vxlan-agent` per
//! node, and asserts what must hold: the file written is one every node's plugin accepts, a
//! conflict moves no traffic, the agent relists after every watch failure but a broken
//! connection and backs off, the guard cannot be bypassed or drained event by event, and the
//! agent's memory stays bounded. A real Kubernetes API server is not run here.

use sticky_testkit::agent_support;
use sticky_testkit::kube_support;
use sticky_testkit::vxlan_support;

use std::time::Duration;

use agent_support::*;
use kube_support::*;
use serde_json::json;
use vxlan_support::*;

/// `sticky-vxlan reconcile` on node `n` (what a pod ADD and the boot unit do) succeeds.
fn node_accepts_its_file(c: &Cluster, n: u8) -> bool {
    let conf = c.conf_files[usize::from(n) - 1]
        .to_string_lossy()
        .into_owned();
    c.topo
        .tool(n, &["reconcile", "--config", &conf])
        .status
        .success()
}

fn show(c: &Cluster, n: u8) -> String {
    let state = c.topo.state_dir(n);
    let out = c
        .topo
        .tool(n, &["show", "--state-dir", state.to_str().unwrap()]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn peers_in_file(c: &Cluster, n: u8) -> Vec<String> {
    let text = std::fs::read_to_string(c.peers_file(n)).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or(json!([]));
    let mut ips: Vec<String> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["ip"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    ips.sort();
    ips
}

/// Nodes 1 to 3 in the API, an agent on each, all programmed, and every node's plugin having
/// accepted its file (its last-good copy is what each agent's guard keeps).
fn three_agents(c: &Cluster) -> Vec<Agent> {
    for n in 1..=3 {
        c.api.put_node(Cluster::node(n));
    }
    let agents: Vec<Agent> = (1..=3).map(|n| c.agent(n, &[])).collect();
    three_programmed(c, &agents);
    for n in 1..=3 {
        assert!(
            node_accepts_its_file(c, n),
            "node {n}'s plugin accepts its file"
        );
    }
    agents
}

fn three_programmed(c: &Cluster, agents: &[Agent]) {
    wait_for(
        "the three nodes to program each other",
        Duration::from_secs(15),
        || {
            (1..=3).all(|n| {
                (1..=3)
                    .filter(|m| *m != n)
                    .all(|m| c.routes(n, &Topo::subnet(m)))
            })
        },
    );
    for a in agents {
        assert!(!a.log_text().contains("REFUSED"), "{}", a.log_text());
    }
}

fn kept_mac(c: &Cluster, ip: &str) -> String {
    let out = c.topo.tool(1, &["mac", "--local", ip, "--vni", "1"]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Finding 1: one Node object stopped pod ADD on every node. Now each bad Node is left out
/// (logged, counted, shown) and every node's plugin accepts the file.
#[test]
#[ignore = "needs root: network namespaces"]
fn one_bad_node_object_is_left_out_and_every_node_keeps_working() {
    assert_can_run();
    let mut c = Cluster::new();
    for n in 1..=3 {
        c.api.put_node(Cluster::node(n));
    }
    // A docker0-style address that every node holds.
    for n in 1..=3 {
        let ns = c.topo.node_ns(n);
        ok(&["ip", "-n", &ns, "link", "add", "docker0", "type", "bridge"]);
        ok(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            "172.17.0.1/16",
            "dev",
            "docker0",
        ]);
    }
    let agents: Vec<Agent> = (1..=3).map(|n| c.agent(n, &[])).collect();
    three_programmed(&c, &agents);

    let stolen_mac = kept_mac(&c, "192.0.2.1");
    let bad = [
        // A flannel node whose VtepMAC is node-1's kept MAC.
        node_json(
            "bad-flannel-mac",
            "192.0.2.21",
            &["10.244.21.0/24"],
            json!({"flannel.alpha.coreos.com/backend-data": format!("{{\"VNI\":1,\"VtepMAC\":\"{stolen_mac}\"}}")}),
        ),
        // An underlay annotation naming an address every node holds.
        node_json(
            "bad-docker0",
            "192.0.2.22",
            &["10.244.22.0/24"],
            json!({"sticky-cni.io/underlay-ip": "172.17.0.1"}),
        ),
        // An InternalIP at the underlay subnet's broadcast address.
        node_json(
            "bad-broadcast",
            "192.0.2.255",
            &["10.244.23.0/24"],
            json!({}),
        ),
    ];
    for b in bad {
        c.api.put_node(b);
    }
    // A good Node after them still gets in.
    c.api.put_node(node_json(
        "good-4",
        "192.0.2.24",
        &["10.244.24.0/24"],
        json!({}),
    ));
    wait_for(
        "every node to take node good-4",
        Duration::from_secs(10),
        || (1..=3).all(|n| c.file_has(n, "192.0.2.24")),
    );
    for n in 1..=3 {
        assert_eq!(
            peers_in_file(&c, n),
            ["192.0.2.1", "192.0.2.2", "192.0.2.24", "192.0.2.3"],
            "node {n}: only the bad Nodes are left out"
        );
        assert!(
            node_accepts_its_file(&c, n),
            "node {n}'s plugin accepts its file"
        );
        let log = agents[usize::from(n) - 1].log_text();
        for name in ["bad-flannel-mac", "bad-docker0", "bad-broadcast"] {
            assert!(
                log.contains(&format!("node {name} is left out")),
                "node {n} names {name}: {log}"
            );
        }
        assert!(
            show(&c, n).contains("3 node(s) left out"),
            "{}",
            show(&c, n)
        );
    }
    // A pod ADD works on every node, and pods still reach each other.
    let mut topo_pods = Vec::new();
    for n in 1..=3u8 {
        let pod = c.topo.new_pod(n, &format!("p{n}"));
        let ip = ip_of(&c.topo.add(&pod, &c.confs[usize::from(n) - 1]), false);
        topo_pods.push((pod, ip));
    }
    assert!(c.topo.reaches(&topo_pods[0].0, &topo_pods[2].1));
}

/// Finding 2: two Nodes claiming one underlay address or one pod subnet: the name that sorted
/// first took the entry everywhere. Now the entry already accepted keeps it.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_node_claiming_another_nodes_address_or_subnet_takes_nothing() {
    assert_can_run();
    let mut c = Cluster::new();
    let agents = three_agents(&c);
    let before: Vec<String> = (1..=3)
        .map(|n| std::fs::read_to_string(c.peers_file(n)).unwrap())
        .collect();
    let p1 = c.topo.new_pod(1, "victim-client");
    let p2 = c.topo.new_pod(2, "victim");
    let ip2 = ip_of(&c.topo.add(&p2, &c.confs[1]), false);
    c.topo.add(&p1, &c.confs[0]);
    assert!(c.topo.reaches(&p1, &ip2));

    // "a-..." sorts before "node-...": the old agent let them win.
    c.api.put_node(node_json(
        "a-takes-address",
        "192.0.2.2",
        &["10.244.31.0/24"],
        json!({}),
    ));
    c.api.put_node(node_json(
        "a-takes-subnet",
        "192.0.2.32",
        &[&Topo::subnet(2)],
        json!({}),
    ));
    c.api.put_node(node_json(
        "a-takes-by-annotation",
        "192.0.2.33",
        &["10.244.33.0/24"],
        json!({"sticky-cni.io/underlay-ip": "192.0.2.3"}),
    ));
    wait_for(
        "the agents to name the three claimants",
        Duration::from_secs(10),
        || {
            agents.iter().all(|a| {
                let log = a.log_text();
                ["a-takes-address", "a-takes-subnet", "a-takes-by-annotation"]
                    .iter()
                    .all(|n| log.contains(&format!("node {n} is left out")))
            })
        },
    );
    for n in 1..=3u8 {
        assert_eq!(
            std::fs::read_to_string(c.peers_file(n)).unwrap(),
            before[usize::from(n) - 1],
            "node {n}: nothing moved"
        );
    }
    assert!(
        c.topo.reaches(&p1, &ip2),
        "the victim's pods are still reached"
    );
    // Two newcomers in conflict: neither gets in.
    c.api.put_node(node_json(
        "x-new",
        "192.0.2.40",
        &["10.244.40.0/24"],
        json!({}),
    ));
    c.api.put_node(node_json(
        "y-new",
        "192.0.2.40",
        &["10.244.41.0/24"],
        json!({}),
    ));
    wait_for("both newcomers left out", Duration::from_secs(10), || {
        let log = agents[0].log_text();
        log.contains("node x-new is left out") && log.contains("node y-new is left out")
    });
    assert!(!c.file_has(1, "192.0.2.40"));
}

/// Finding 3: watches answered `504 Too large resource version` (an API restored at a lower
/// resourceVersion) were retried forever; a new Node never reached the file and `show` said
/// the API was fine. Now any watch failure but a broken connection relists after a backoff,
/// and the status says stale meanwhile.
#[test]
#[ignore = "needs root: network namespaces"]
fn watch_errors_other_than_410_lead_to_a_relist_and_the_status_says_stale() {
    assert_can_run();
    let c = Cluster::new();
    for n in 1..=2 {
        c.api.put_node(Cluster::node(n));
    }
    for (code, message) in [
        (504, "Too large resource version: 90, current: 12"),
        (500, "etcdserver: request timed out"),
    ] {
        // A fresh agent each time: failures grow an agent's backoff for two minutes.
        let agent = c.agent(1, &[]);
        wait_for("node 1 to program node 2", Duration::from_secs(10), || {
            c.routes(1, &Topo::subnet(2))
        });
        let lists = c.api.lists();
        c.api.fail_watches(Some((code, message)));
        c.api.close_watches();
        // Each wait below is for an event behind the agent's backoff (1 s doubling to 30 s,
        // ±50%): deadlines of two capped backoffs and more, for a loaded 2-core machine.
        wait_for("the agent to relist", Duration::from_secs(60), || {
            c.api.lists() > lists
        });
        wait_for("show to say STALE", Duration::from_secs(60), || {
            show(&c, 1).contains("STALE since")
        });
        // A Node that only a new list can bring (relists after 1, 2, 4, 8 s, ±50%).
        c.api.put_node(Cluster::node(3));
        wait_for(
            "node 3 in node 1's file through a relist",
            Duration::from_secs(120),
            || c.file_has(1, "192.0.2.3"),
        );
        c.api.fail_watches(None);
        c.api.delete_node("node-3");
        wait_for("the stale mark gone", Duration::from_secs(120), || {
            !show(&c, 1).contains("STALE") && !c.file_has(1, "192.0.2.3")
        });
        assert!(
            agent.log_text().contains(&code.to_string()),
            "{}",
            agent.log_text()
        );
    }
}

/// Finding 8: an API answering every watch with 410 got ~180 list+watch cycles a second from
/// each agent. Now every relist waits a jittered, growing backoff.
#[test]
#[ignore = "needs root: network namespaces"]
fn an_api_that_fails_every_watch_is_not_hammered() {
    assert_can_run();
    let c = Cluster::new();
    for n in 1..=2 {
        c.api.put_node(Cluster::node(n));
    }
    let _agent = c.agent(1, &[]);
    wait_for("node 1 to program node 2", Duration::from_secs(10), || {
        c.routes(1, &Topo::subnet(2))
    });
    let lists = c.api.lists();
    c.api.fail_watches(Some((410, "too old resource version")));
    c.api.close_watches();
    // The first relist comes after one backoff (1 s ±50%); on a loaded machine, later.
    wait_for("the first relist", Duration::from_secs(60), || {
        c.api.lists() > lists
    });
    let (lists, watches) = (c.api.lists(), c.api.watches());
    // Then backoffs of 2, 4, 8 s (±50%): at most 5 more cycles in 8 s, however fast the
    // machine; without them, over a thousand.
    std::thread::sleep(Duration::from_secs(8));
    let cycles = c.api.lists() - lists;
    assert!(
        cycles <= 5,
        "{cycles} lists and {} watches in 8 s",
        c.api.watches() - watches
    );
}

/// Finding 4: with the peers file unreadable (mode 0664 or a hand edit with a syntax error),
/// an empty list from the API wrote `[]`. Now the guard compares with the plugin's last-good
/// copy, whatever the file holds.
#[test]
#[ignore = "needs root: network namespaces"]
fn an_unreadable_peers_file_does_not_bypass_the_guard() {
    assert_can_run();
    let c = Cluster::new();
    let agents = three_agents(&c);
    // Node 1: a hand edit with a syntax error; node 2: group-writable.
    std::fs::write(c.peers_file(1), "[{\"ip\": ").unwrap();
    ok(&["chmod", "0664", c.peers_file(2).to_str().unwrap()]);
    // An API restored from a backup that knows only node-1: for node 1's agent, two of its
    // three accepted peers would go.
    c.api.restore(vec![Cluster::node(1)]);
    wait_for(
        "agents 1 and 2 to refuse the list",
        // A relist after a backoff (the restore's 410), on a loaded machine.
        Duration::from_secs(60),
        || agents[0].log_text().contains("REFUSED") && agents[1].log_text().contains("REFUSED"),
    );
    assert!(
        agents[0].log_text().contains("remove or change 2 of the 3"),
        "{}",
        agents[0].log_text()
    );
    assert_eq!(
        std::fs::read_to_string(c.peers_file(1)).unwrap(),
        "[{\"ip\": "
    );
    assert!(c.file_has(2, "192.0.2.1"), "node 2's file is not emptied");
    assert!(show(&c, 1).contains("REFUSED"), "{}", show(&c, 1));
    // The peers stay programmed.
    assert!(c.routes(1, &Topo::subnet(2)) && c.routes(2, &Topo::subnet(3)));
}

/// Finding 5: DELETED events for 5 of 6 nodes half a second apart drained the file; a list
/// swapping every node's pod CIDRs was accepted. Now disruption counts over a window; the
/// operator can accept a real change once.
#[test]
#[ignore = "needs root: network namespaces"]
fn deletions_in_a_burst_and_a_cidr_swap_are_refused_until_the_operator_accepts() {
    assert_can_run();
    let c = Cluster::new();
    // Three more Nodes without a namespace of their own: peers all the same.
    put_nodes(&c, 6);
    let agent = c.agent(1, &[]);
    node_1_takes_all(&c, 6);
    for n in (2..=6u8).rev() {
        c.api.delete_node(&format!("node-{n}"));
        std::thread::sleep(Duration::from_millis(500));
    }
    wait_for("the guard to refuse", Duration::from_secs(10), || {
        agent.log_text().contains("REFUSED")
    });
    // 3 of 6 within the window at most: node-1..node-3 stay.
    let left = peers_in_file(&c, 1);
    assert!(left.len() >= 3, "drained to {left:?}");
    assert!(c.routes(1, &Topo::subnet(2)), "node 2 is still programmed");
    // The operator accepts: the file follows the API.
    let accept = accept_file(&c);
    std::fs::write(&accept, "").unwrap();
    wait_for("the accepted change", Duration::from_secs(15), || {
        peers_in_file(&c, 1) == ["192.0.2.1"]
    });
    assert!(!accept.exists(), "accepted once, then removed");

    // A list that swaps every pod CIDR (an API restored from another cluster's backup).
    let c2 = Cluster::new();
    let agents = three_agents(&c2);
    let before = std::fs::read_to_string(c2.peers_file(1)).unwrap();
    let swapped: Vec<serde_json::Value> = (1..=3u8)
        .map(|n| {
            node_json(
                &format!("node-{n}"),
                &Topo::node_ip(n),
                &[&Topo::subnet(n % 3 + 1)],
                json!({}),
            )
        })
        .collect();
    c2.api.restore(swapped);
    // A relist after a backoff (the restore's 410), on a loaded machine.
    wait_for("the swap refused", Duration::from_secs(60), || {
        agents[0].log_text().contains("REFUSED")
    });
    assert_eq!(std::fs::read_to_string(c2.peers_file(1)).unwrap(), before);
}

/// Finding 7: a list that always returned a new `continue` token grew 50 MB/s to 2 GB; an
/// endless body under `Content-Length: 10^12` peaked at 262 MB. Now a list stops at 200 pages,
/// 10,000 Nodes or a 1 MiB string, is refused whole, and the agent stays under 64 MiB.
#[test]
#[ignore = "needs root: network namespaces"]
fn lists_that_never_end_are_refused_and_memory_stays_bounded() {
    assert_can_run();
    let c = Cluster::new();
    for n in 1..=2 {
        c.api.put_node(Cluster::node(n));
    }
    // 300 Nodes shaped like a real cluster's, sent again on every page.
    for i in 0..300u32 {
        c.api.put_node(node_json(
            &format!("w-{i:03}"),
            &format!("198.18.{}.{}", i / 250, i % 250 + 1),
            &[&format!("10.250.{}.0/24", i % 250)],
            json!({}),
        ));
    }
    for (what, endless) in [
        ("endless continue tokens", None),
        ("endless items", Some(Endless::Items)),
        ("an endless string", Some(Endless::String)),
    ] {
        c.api.endless_continue(endless.is_none());
        c.api.endless_body(endless);
        let agent = c.agent(1, &[]);
        let mut peak = 0;
        // The refusal comes at the end of the agent's first list: 200 pages, 10,001 real-sized
        // Nodes, or 1 MiB of one string, through TLS and JSON in debug builds. About 20 s on
        // a 2-core machine with a load of 3; the bare-root CI run (the whole suite on both
        // cores) went past 60 s. A later list would wait a backoff too (up to 45 s).
        let took = wait_for(&format!("{what} refused"), Duration::from_secs(300), || {
            peak = peak.max(rss_kib(agent.pid()));
            agent.log_text().contains("the agent's memory is bounded")
        });
        peak = peak.max(rss_kib(agent.pid()));
        eprintln!("{what}: refused after {took:?}, peak resident {peak} kB");
        assert!(peak < 64 * 1024, "{what}: resident {peak} kB");
        assert!(
            !c.peers_file(1).exists(),
            "nothing written from an incomplete list"
        );
    }
}

/// `/metrics` of the agent on node `n` (serving on 127.0.0.1:9767 in its namespace).
fn metrics(c: &Cluster, n: u8) -> String {
    let netns = std::path::PathBuf::from(format!("/run/netns/{}", c.topo.node_ns(n)));
    get_in_netns(&netns, "127.0.0.1:9767", "/metrics").unwrap_or_default()
}

/// A metric's value from a `/metrics` answer (`None` when it is not there).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// The operator's `<stateDir>/<network>.accept-changes` on node 1.
fn accept_file(c: &Cluster) -> std::path::PathBuf {
    let network = c.confs[0]["name"].as_str().unwrap();
    c.topo
        .state_dir(1)
        .join(format!("{network}.accept-changes"))
}

/// Waits for node 1's agent to write all `n` nodes and its plugin to accept the file.
fn node_1_takes_all(c: &Cluster, n: u8) {
    wait_for("node 1 to take every node", Duration::from_secs(60), || {
        peers_in_file(c, 1).len() == usize::from(n)
    });
    wait_for(
        "node 1's plugin to accept them",
        Duration::from_secs(60),
        || node_accepts_its_file(c, 1) && c.routes(1, &Topo::subnet(n)),
    );
}

/// Nodes 1 to 3 (with namespaces) and 4 to `last` (peers only) in the API.
fn put_nodes(c: &Cluster, last: u8) {
    for n in 1..=3 {
        c.api.put_node(Cluster::node(n));
    }
    for n in 4..=last {
        c.api.put_node(node_json(
            &format!("node-{n}"),
            &format!("192.0.2.{n}"),
            &[&Topo::subnet(n)],
            json!({}),
        ));
    }
}

/// Issue 27, defect 3: a refusal for an unusable list (this node's own Node gone), then
/// `accept-changes`: the file was consumed and the acceptance stayed armed, so a later restore
/// removing 5 of 7 peers was written unrefused. Now the file accepts only a change the guard
/// refused when it appeared; and `show` and the log say what an acceptance accepted.
#[test]
#[ignore = "needs root: network namespaces"]
fn an_accept_file_during_an_unusable_list_accepts_nothing_later() {
    assert_can_run();
    let c = Cluster::new();
    put_nodes(&c, 7);
    let agent = c.agent(1, &[]);
    node_1_takes_all(&c, 7);
    // Node 1's own Node goes: no list this node's plugin accepts (not a guard refusal).
    c.api.delete_node("node-1");
    wait_for("the unusable list refused", Duration::from_secs(60), || {
        agent
            .log_text()
            .contains("no peer list this node's plugin accepts")
    });
    let accept = accept_file(&c);
    std::fs::write(&accept, "").unwrap();
    wait_for(
        "the accept file taken away",
        Duration::from_secs(60),
        || !accept.exists(),
    );
    c.api.put_node(Cluster::node(1));
    // An API restored from a backup that knows nodes 1 and 2 only: 5 of the 7 would go.
    c.api.restore(vec![Cluster::node(1), Cluster::node(2)]);
    // Refused or written, whichever comes first (the agent relists after its backoff).
    wait_for("the restore decided", Duration::from_secs(120), || {
        agent.log_text().contains("remove or change 5 of the 7") || peers_in_file(&c, 1).len() < 7
    });
    assert_eq!(
        peers_in_file(&c, 1).len(),
        7,
        "an acceptance outlived its refusal: {}",
        agent.log_text()
    );
    assert!(!show(&c, 1).contains("ACCEPTED"), "{}", show(&c, 1));
    // Touched now, it accepts this refusal, and says which.
    std::fs::write(&accept, "").unwrap();
    wait_for("the accepted restore", Duration::from_secs(60), || {
        peers_in_file(&c, 1) == ["192.0.2.1", "192.0.2.2"]
    });
    let log = agent.log_text();
    assert!(
        log.contains("the operator accepts the change the guard refused")
            && log.contains("remove or change 5 of the 7"),
        "{log}"
    );
    let shown = show(&c, 1);
    assert!(
        shown.contains("ACCEPTED") && shown.contains("5 of the 7"),
        "{shown}"
    );
}

/// Issue 27, defect 6: a server sending a blank line every few seconds held a watch open
/// forever; a Node removed from its list stayed in the peers file, `stale` 0. Now a watch has a
/// deadline (its `timeoutSeconds` plus a margin, keepalive bytes are no answer), after which the
/// agent relists.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_watch_held_open_by_keepalives_is_dropped_at_its_deadline_and_the_agent_relists() {
    assert_can_run();
    let c = Cluster::new();
    put_nodes(&c, 3);
    let agent = c.agent(
        1,
        &["--watch-timeout", "5", "--metrics-addr", "127.0.0.1:9767"],
    );
    wait_for(
        "node 1 to program nodes 2 and 3",
        Duration::from_secs(60),
        || c.routes(1, &Topo::subnet(2)) && c.routes(1, &Topo::subnet(3)),
    );
    let watches = c.api.watches();
    c.api.keepalive_watches(Some(Duration::from_secs(2)));
    c.api.close_watches();
    wait_for("a watch held open", Duration::from_secs(60), || {
        c.api.watches() > watches
    });
    let failures = metric(&metrics(&c, 1), "sticky_vxlan_agent_watch_failures_total").unwrap();
    c.api.delete_node_unseen("node-3");
    // The deadline is 5 s + the margin; the relist follows one backoff.
    wait_for(
        "node 3 to leave node 1's peers file",
        Duration::from_secs(120),
        || !c.file_has(1, "192.0.2.3"),
    );
    assert!(
        agent.log_text().contains("no end within"),
        "{}",
        agent.log_text()
    );
    let m = metrics(&c, 1);
    assert!(
        metric(&m, "sticky_vxlan_agent_watch_failures_total").unwrap() > failures,
        "{m}"
    );
}

/// Issue 27, defect 8: a flannel-annotation PATCH that failed (a 403 before RBAC is fixed, a
/// 5xx) waited for the Node's next change. Now it is retried with a capped backoff until it
/// succeeds; each failure is logged and counted.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_refused_annotation_patch_is_retried_until_it_is_published() {
    assert_can_run();
    let c = Cluster::new();
    put_nodes(&c, 2);
    c.api.refuse_patches(3);
    let agent = c.agent(
        1,
        &[
            "--publish-flannel-annotations",
            "--metrics-addr",
            "127.0.0.1:9767",
        ],
    );
    // Nothing changes node-1 meanwhile: only the agent's retries can publish.
    wait_for("node-1's annotations", Duration::from_secs(120), || {
        c.api.node("node-1").is_some_and(|n| {
            n["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-type"] == "vxlan"
        })
    });
    // The agent logs the publish once the PATCH has returned: after the API has it.
    wait_for("the publish logged", Duration::from_secs(30), || {
        agent.log_text().contains("published flannel annotations")
    });
    assert_eq!(c.api.patches_refused(), 3);
    let m = metrics(&c, 1);
    assert_eq!(
        metric(&m, "sticky_vxlan_agent_publish_failures_total"),
        Some(3.0),
        "{m}"
    );
    let log = agent.log_text();
    assert_eq!(log.matches("HTTP 403").count(), 3, "{log}");
}
