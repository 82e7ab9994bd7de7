//! The operator's tool, run as an operator runs it: the built binary without `CNI_COMMAND`.
//! Every subcommand in both output formats with its exit codes, the CLI looping while 32
//! ADD/DEL processes run, and the metrics file against the data dir.

use sticky_testkit::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use support::*;

const NET: &str = "edge";

/// What one CLI run produced.
#[derive(Debug)]
struct Cli {
    code: i32,
    stdout: String,
    stderr: String,
    what: String,
}

fn cli(args: &[&str]) -> Cli {
    let mut cmd = Command::new(sticky_bin());
    cmd.args(args);
    let (code, stdout, stderr) = run_tool(cmd);
    Cli {
        code,
        stdout,
        stderr,
        what: format!("sticky-ipam {}", args.join(" ")),
    }
}

impl Cli {
    fn code(&self, want: i32) -> &Cli {
        assert_eq!(
            self.code, want,
            "{}: exit code\nstdout:\n{}\nstderr:\n{}",
            self.what, self.stdout, self.stderr
        );
        self
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{}: stdout is not JSON ({e}):\n{}", self.what, self.stdout))
    }

    /// The table row (whitespace-split cells) that starts with `ip`.
    fn row(&self, ip: IpAddr) -> Vec<String> {
        let row = self
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&ip.to_string()))
            .unwrap_or_else(|| panic!("{}: no row for {ip}:\n{}", self.what, self.stdout));
        row.split_whitespace().map(str::to_string).collect()
    }
}

/// A data dir, its network config on stdin and as a conflist file for `--config`.
struct Net {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    conf: Conf,
    conflist: PathBuf,
}

impl Net {
    fn new(subnet: &str, ipam: Value) -> Net {
        let tmp = temp_dir();
        let data = tmp.path().join("data");
        let mut conf = Conf::v4(NET, &data, subnet);
        if let Value::Object(extra) = ipam {
            for (k, v) in extra {
                conf = conf.ipam(&k, v);
            }
        }
        let list = json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "plugins": [
                { "type": "bridge", "bridge": "cni0", "ipam": conf.value["ipam"].clone() },
                { "type": "portmap", "capabilities": { "portMappings": true } }
            ]
        });
        let conflist = tmp.path().join("10-edge.conflist");
        std::fs::write(&conflist, serde_json::to_vec_pretty(&list).unwrap()).unwrap();
        Net {
            _tmp: tmp,
            data,
            conf,
            conflist,
        }
    }

    fn dir(&self) -> PathBuf {
        self.data.join(NET)
    }

    fn data_arg(&self) -> &str {
        self.data.to_str().unwrap()
    }

    fn config_arg(&self) -> &str {
        self.conflist.to_str().unwrap()
    }

    fn add(&self, cid: &str, pod: Option<&Pod>) -> IpAddr {
        let call = Call::add(cid, &self.conf);
        let call = match pod {
            Some(p) => call.pod(p),
            None => call,
        };
        result_ip(&Plugin::sticky().run(&call).ok())
    }

    fn del(&self, cid: &str, pod: Option<&Pod>) {
        let call = Call::del(cid, &self.conf);
        let call = match pod {
            Some(p) => call.pod(p),
            None => call,
        };
        Plugin::sticky().run(&call).ok_empty();
    }
}

/// web attached, db released, an anonymous host-local record, an OpenYurt pair and a lone
/// OpenYurt marker.
struct Populated {
    net: Net,
    web: IpAddr,
    db: IpAddr,
    anon: IpAddr,
    yurt: IpAddr,
    marker: IpAddr,
}

fn populated() -> Populated {
    let net = Net::new("10.50.0.0/24", json!({}));
    let web = net.add("cweb", Some(&Pod::new("ns", "web", "uid-web")));
    let db_pod = Pod::new("ns", "db", "uid-db");
    let db = net.add("cdb", Some(&db_pod));
    net.del("cdb", Some(&db_pod));
    let anon = net.add("canon", None);
    let (yurt, marker) = (ip("10.50.0.200"), ip("10.50.0.201"));
    std::fs::write(net.dir().join("10.50.0.200"), "cyurt\r\neth0").unwrap();
    std::fs::write(net.dir().join("10.50.0.200_kube-system_coredns"), "").unwrap();
    std::fs::write(net.dir().join("10.50.0.201_ns_gone"), "").unwrap();
    Populated {
        net,
        web,
        db,
        anon,
        yurt,
        marker,
    }
}

fn by_ip(rows: &Value) -> BTreeMap<IpAddr, Value> {
    let mut out = BTreeMap::new();
    for row in rows.as_array().expect("an array") {
        let a: IpAddr = row["ip"].as_str().unwrap().parse().unwrap();
        assert!(out.insert(a, row.clone()).is_none(), "{a} listed twice");
    }
    out
}

#[test]
fn list_in_both_formats() {
    let p = populated();
    let d = p.net.data_arg();
    let before = snapshot(&p.net.data);

    let rows = by_ip(&cli(&["--data-dir", d, "list", "--json"]).code(0).json());
    assert_eq!(rows.len(), 5, "{rows:?}");
    let web = &rows[&p.web];
    assert_eq!(web["state"], "attached");
    assert_eq!(
        (&web["namespace"], &web["pod"], &web["containerId"]),
        (&json!("ns"), &json!("web"), &json!("cweb"))
    );
    assert_eq!(
        (&web["ifname"], &web["podUid"]),
        (&json!("eth0"), &json!("uid-web"))
    );
    assert_eq!(web["boot"], current_boot_id());
    assert_eq!(web["releaseSeq"], Value::Null);
    assert_eq!(web["network"], NET);
    let db = &rows[&p.db];
    assert_eq!(
        (&db["state"], &db["releaseSeq"]),
        (&json!("released"), &json!(1))
    );
    assert!(db["releasedAgo"].as_u64().is_some_and(|s| s < 60), "{db}");
    let anon = &rows[&p.anon];
    assert_eq!(
        (&anon["state"], &anon["pod"]),
        (&json!("host-local"), &Value::Null)
    );
    let yurt = &rows[&p.yurt];
    assert_eq!(yurt["state"], "host-local");
    assert_eq!(
        (&yurt["namespace"], &yurt["pod"]),
        (&json!("kube-system"), &json!("coredns"))
    );
    assert_eq!(yurt["files"].as_array().unwrap().len(), 2);
    assert_eq!(rows[&p.marker]["state"], "marker");
    for row in rows.values() {
        for key in [
            "network",
            "ip",
            "state",
            "namespace",
            "pod",
            "containerId",
            "ifname",
            "podUid",
            "boot",
            "releaseSeq",
            "releasedAgo",
            "files",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
    }

    // The table: a header, one aligned row per record; all networks listed with NETWORK.
    let t = cli(&["--data-dir", d, "list"]);
    t.code(0);
    let header: Vec<&str> = t
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NETWORK",
            "IP",
            "POD",
            "STATE",
            "CONTAINER",
            "IFNAME",
            "UID"
        ]
    );
    assert_eq!(t.stdout.lines().count(), 6, "{}", t.stdout);
    let t = cli(&["--data-dir", d, "--network", NET, "list"]);
    t.code(0);
    assert_eq!(
        t.row(p.web)[1..],
        ["ns/web", "attached", "cweb", "eth0", "uid-web"]
    );
    assert_eq!(t.row(p.db)[2..4], ["released", "#1"]);
    assert_eq!(t.row(p.anon)[1..3], ["-", "host-local"]);
    assert_eq!(
        t.row(p.yurt)[1..4],
        ["kube-system/coredns", "host-local", "(openyurt)"]
    );
    assert_eq!(t.row(p.marker)[1..3], ["ns/gone", "marker"]);
    let col = t.stdout.lines().next().unwrap().find("STATE").unwrap();
    for line in t.stdout.lines().skip(1) {
        assert_eq!(
            line.get(col - 2..col),
            Some("  "),
            "columns aligned: {line:?}"
        );
    }
    // Via --config: network and data dir from the conflist.
    let c = cli(&["--config", p.net.config_arg(), "list", "--json"])
        .code(0)
        .json();
    assert_eq!(by_ip(&c).len(), 5);

    // Nothing was written, not even by resolving crash leftovers.
    assert_same(&before, &snapshot(&p.net.data), "list");

    // Exit codes: not found, usage errors quoting the input.
    let e = cli(&["--data-dir", d, "--network", "nope", "list"]);
    e.code(4);
    assert!(e.stderr.contains("\"nope\""), "{}", e.stderr);
    let e = cli(&["--data-dir", d, "list", "--jsn"]);
    e.code(2);
    assert!(e.stderr.contains("\"--jsn\""), "{}", e.stderr);
    assert!(e.stdout.is_empty());
    cli(&["--data-dir", d, "--network", "../x", "list"]).code(2);
    cli(&["--data-dir", d, "list", "extra"]).code(2);
    let empty = temp_dir();
    let e = cli(&[
        "--data-dir",
        empty.path().to_str().unwrap(),
        "list",
        "--json",
    ]);
    assert_eq!(e.code(0).json(), json!([]));
}

#[test]
fn show_explains_the_next_add_in_both_formats() {
    let p = populated();
    let (d, c) = (p.net.data_arg(), p.net.config_arg());
    let before = snapshot(&p.net.data);

    // Released lease: taken back.
    let v = cli(&["--config", c, "show", "ns/db", "--json"])
        .code(0)
        .json();
    assert_eq!(
        (&v["network"], &v["namespace"], &v["pod"]),
        (&json!(NET), &json!("ns"), &json!("db"))
    );
    assert_eq!(v["ifname"], "eth0");
    assert_eq!(v["records"][0]["ip"], p.db.to_string());
    let step = &v["next"]["addresses"][0];
    assert_eq!(
        (&step["action"], &step["ip"]),
        (&json!("take"), &json!(p.db.to_string()))
    );
    assert_eq!(step["rangeSet"], "10.50.0.1-10.50.0.254");
    assert_eq!(v["next"]["error"], Value::Null);
    let t = cli(&["--config", c, "show", "ns/db"]);
    t.code(0);
    assert!(
        t.stdout
            .contains(&format!("takes back its released lease {}", p.db)),
        "{}",
        t.stdout
    );
    assert_eq!(t.row(p.db)[1], "ns/db");

    // Attached lease: taken over with the same UID; without it, a live sandbox may hold it.
    let v = cli(&[
        "--config", c, "show", "ns/web", "--uid", "uid-web", "--json",
    ])
    .code(0)
    .json();
    assert_eq!(v["next"]["addresses"][0]["action"], "takeover");
    let t = cli(&["--config", c, "show", "ns/web", "--uid=uid-web"]);
    assert!(
        t.code(0)
            .stdout
            .contains(&format!("takes over attached lease {} (same UID)", p.web))
    );
    let v = cli(&[
        "--config",
        c,
        "show",
        "ns/web",
        "--uid",
        "uid-other",
        "--json",
    ])
    .code(0)
    .json();
    let step = &v["next"]["addresses"][0];
    assert_eq!(step["action"], "new");
    assert_ne!(step["ip"], p.web.to_string());
    assert!(
        step["explanation"]
            .as_str()
            .unwrap()
            .contains("gets a new address")
    );

    // A pod without records: the preview is printed, exit 4.
    let e = cli(&["--config", c, "show", "ns/newcomer", "--json"]);
    let v = e.code(4).json();
    assert_eq!(v["records"], json!([]));
    assert_eq!(v["next"]["addresses"][0]["action"], "new");
    assert!(
        e.stderr.contains("ns/newcomer has no records"),
        "{}",
        e.stderr
    );
    // The OpenYurt pair and marker.
    let t = cli(&["--config", c, "show", "kube-system/coredns"]);
    assert!(
        t.code(0)
            .stdout
            .contains("takes over its adopted OpenYurt record 10.50.0.200")
    );
    let t = cli(&["--config", c, "show", "ns/gone"]);
    assert!(
        t.code(0).stdout.contains("reserved by its OpenYurt marker"),
        "{}",
        t.stdout
    );

    // Without --config the ranges are unknown: records only.
    let v = cli(&["--data-dir", d, "show", "ns/db", "--json"])
        .code(0)
        .json();
    assert_eq!(v["next"], Value::Null);
    let t = cli(&["--data-dir", d, "show", "ns/db"]);
    assert!(t.code(0).stdout.contains("next ADD: unknown"));
    cli(&["--data-dir", d, "show", "ns/db", "--ifname", "net1"]).code(4);
    cli(&["--data-dir", d, "show"]).code(2);
    cli(&["--data-dir", d, "show", "a/b/c"]).code(2);
    assert_same(&before, &snapshot(&p.net.data), "show");

    // The preview is what the next ADD does.
    let db_again = p.net.add("cdb2", Some(&Pod::new("ns", "db", "uid-db2")));
    assert_eq!(db_again, p.db);
    let v = cli(&["--config", c, "show", "ns/fresh", "--json"])
        .code(4)
        .json();
    let promised: IpAddr = v["next"]["addresses"][0]["ip"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        p.net.add("cfresh", Some(&Pod::new("ns", "fresh", "u"))),
        promised
    );
}

#[test]
fn show_finds_podman_names_without_namespace() {
    let net = Net::new("10.51.0.0/24", json!({}));
    let call = Call::add("cpod", &net.conf).args(podman_args("happy_turing"));
    let a = result_ip(&Plugin::sticky().run(&call).ok());
    for spelling in ["happy_turing", "/happy_turing"] {
        let v = cli(&["--config", net.config_arg(), "show", spelling, "--json"])
            .code(0)
            .json();
        assert_eq!(v["records"][0]["ip"], a.to_string(), "{spelling}");
        assert_eq!(v["records"][0]["namespace"], "");
        // podman names are unique among live containers: no UID on either side.
        assert_eq!(v["next"]["addresses"][0]["action"], "takeover");
    }
    let t = cli(&["--config", net.config_arg(), "show", "happy_turing"]);
    assert!(
        t.code(0).stdout.contains("(no UID on either side)"),
        "{}",
        t.stdout
    );
}

#[test]
fn forget_refuses_attached_leases_without_force() {
    let p = populated();
    let d = p.net.data_arg();
    let web_file = p.net.dir().join(format!("{}_ns_web", p.web));

    let before = snapshot(&p.net.data);
    let e = cli(&["--data-dir", d, "forget", "ns/web"]);
    e.code(3);
    assert!(e.stderr.contains(&p.web.to_string()) && e.stderr.contains("--force"));
    assert!(e.stdout.is_empty());
    assert_same(&before, &snapshot(&p.net.data), "refused forget");

    let v = cli(&["--data-dir", d, "forget", "ns/web", "--force", "--json"])
        .code(0)
        .json();
    assert_eq!(v["forgotten"][0]["ip"], p.web.to_string());
    assert_eq!(v["forgotten"][0]["state"], "attached");
    assert!(!web_file.exists());

    // A released lease needs no --force; the table names what was dropped.
    let t = cli(&["--data-dir", d, "forget", "ns/db"]);
    t.code(0);
    assert!(
        t.stdout
            .starts_with("forgot (deleted) 1 record(s) of ns/db"),
        "{}",
        t.stdout
    );
    assert_eq!(t.row(p.db)[1], "ns/db");
    cli(&["--data-dir", d, "forget", "ns/db"]).code(4);
    cli(&["--data-dir", d, "forget", "ns/nope", "--json"]).code(4);
    // OpenYurt: the adopted `<ip>` is an attachment; --force drops it with its marker.
    cli(&["--data-dir", d, "forget", "kube-system/coredns"]).code(3);
    cli(&["--data-dir", d, "forget", "kube-system/coredns", "--force"]).code(0);
    cli(&["--data-dir", d, "forget", "ns/gone"]).code(0);
    cli(&["--data-dir", d, "forget"]).code(2);
    cli(&["--data-dir", d, "forget", "ns/web", "--force=yes"]).code(2);

    let st = check_dir(&p.net.dir(), COMPLETED);
    assert_eq!(
        st.ips(),
        BTreeSet::from([p.anon]),
        "only the anonymous record is left"
    );
}

#[test]
fn gc_dry_run_shows_the_boot_sweep_and_expiry_without_writing() {
    let net = Net::new("10.52.0.0/24", json!({ "leaseHold": "1h" }));
    std::fs::create_dir_all(net.dir()).unwrap();
    let old_boot = StickyRecord {
        attached: true,
        release_seq: 0,
        released_at: 0,
        boot: "an-earlier-boot".into(),
        container_id: "cold".into(),
        ..released("ns", "old", 1)
    };
    seed_sticky(&net.dir(), ip("10.52.0.5"), &old_boot);
    seed_sticky(
        &net.dir(),
        ip("10.52.0.6"),
        &StickyRecord {
            released_at: 100,
            ..released("ns", "expired", 1)
        },
    );
    seed_sticky(
        &net.dir(),
        ip("10.52.0.7"),
        &StickyRecord {
            released_at: 9_000,
            ..released("ns", "recent", 2)
        },
    );
    std::fs::write(net.dir().join("release_seq"), "2").unwrap();
    // host-local creates `lock` on first use; taking the lock is the tool's only touch.
    std::fs::write(net.dir().join("lock"), "").unwrap();
    std::fs::write(net.dir().join("boot_id"), "an-earlier-boot").unwrap();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    std::fs::write(net.dir().join("lease_clock"), format!("10000 {wall} -")).unwrap();
    let c = net.config_arg();
    let before = snapshot(&net.data);

    let v = cli(&["--config", c, "gc", "--dry-run", "--json"])
        .code(0)
        .json();
    assert_eq!(v["network"], NET);
    assert_eq!(v["leaseHold"], 3600);
    assert_eq!(v["boot"], current_boot_id());
    let changes: Vec<(String, String, String)> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["ip"].as_str().unwrap().to_string(),
                c["action"].as_str().unwrap().to_string(),
                c["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("10.52.0.5".into(), "release".into(), "earlier-boot".into()),
            ("10.52.0.6".into(), "free".into(), "expired".into()),
        ]
    );
    assert_eq!(v["changes"][0]["pod"], "old");
    assert_eq!(v["changes"][1]["file"], "10.52.0.6_ns_expired");

    let t = cli(&["--config", c, "gc", "--dry-run"]);
    t.code(0);
    assert!(t.stdout.contains("leaseHold 60m"), "{}", t.stdout);
    assert_eq!(
        t.row(ip("10.52.0.5"))[1..4],
        ["ns/old", "release", "earlier-boot"]
    );
    assert_eq!(
        t.row(ip("10.52.0.6"))[1..4],
        ["ns/expired", "free", "expired"]
    );
    assert!(!t.stdout.contains("10.52.0.7"));
    // Without --config, leaseHold is unknown: only the boot sweep.
    let t = cli(&["--data-dir", net.data_arg(), "gc", "--dry-run"]);
    assert!(t.code(0).stdout.contains("expiry not evaluated"));
    assert!(!t.stdout.contains("10.52.0.6"));
    // A real GC needs the runtime's attachment list.
    let e = cli(&["--config", c, "gc"]);
    e.code(2);
    assert!(e.stderr.contains("--dry-run"), "{}", e.stderr);
    assert_same(&before, &snapshot(&net.data), "gc --dry-run");

    // The real recovery (at the next ADD) does what the dry run said.
    net.add("cnew", Some(&Pod::new("ns", "new", "u")));
    let st = check_dir(&net.dir(), COMPLETED);
    assert!(!st.sticky(ip("10.52.0.5")).attached);
    assert!(st.by_ip(ip("10.52.0.6")).is_none());
    assert!(!st.sticky(ip("10.52.0.7")).attached);
}

#[test]
fn help_version_and_usage() {
    let h = cli(&["--help"]);
    h.code(0);
    for word in [
        "list",
        "show",
        "forget",
        "gc",
        "downgrade",
        "--data-dir",
        "Exit codes",
    ] {
        assert!(h.stdout.contains(word), "--help lacks {word}");
    }
    for verb in ["list", "show", "forget", "gc", "downgrade"] {
        let h = cli(&[verb, "--help"]);
        h.code(0);
        assert!(
            h.stdout
                .starts_with(&format!("Usage: sticky-ipam [global options] {verb}")),
            "{verb}: {}",
            h.stdout
        );
        assert!(h.stdout.contains("Exit codes:"));
        assert_eq!(cli(&["-h", verb]).stdout, h.stdout);
    }
    let v = cli(&["--version"]);
    assert_eq!(
        v.code(0).stdout,
        format!("sticky-ipam {}\n", env!("CARGO_PKG_VERSION"))
    );
    for args in [
        &[][..],
        &["frobnicate"],
        &["--data-dir"],
        &["list", "--network"],
    ] {
        let e = cli(args);
        e.code(2);
        assert!(
            e.stdout.is_empty(),
            "{args:?}: usage errors print nothing on stdout"
        );
        assert!(e.stderr.contains("--help"), "{args:?}: {}", e.stderr);
    }
    assert!(cli(&["frobnicate"]).stderr.contains("\"frobnicate\""));
}

#[test]
fn cli_runs_concurrently_with_32_add_del_processes() {
    const WORKERS: usize = 32;
    const ROUNDS: usize = 3;
    let net = Net::new("10.53.0.0/24", json!({}));
    let (d, c) = (net.data_arg().to_string(), net.config_arg().to_string());
    // One ADD first so the network exists for `--network`.
    net.add("cseed", None);
    let done = AtomicBool::new(false);
    let listings = std::thread::scope(|s| {
        let lister = s.spawn(|| {
            let mut n = 0;
            while !done.load(Ordering::SeqCst) || n < 3 {
                let l = cli(&["--data-dir", &d, "--network", NET, "list", "--json"]);
                let rows = l.code(0).json();
                by_ip(&rows); // parses; no address twice
                for row in rows.as_array().unwrap() {
                    let state = row["state"].as_str().unwrap();
                    assert!(
                        ["attached", "released", "host-local"].contains(&state),
                        "{row}"
                    );
                }
                let v = cli(&["--config", &c, "show", "ns/p1", "--json"]);
                assert!([0, 4].contains(&v.code), "{v:?}");
                v.json();
                cli(&["--config", &c, "gc", "--dry-run", "--json"])
                    .code(0)
                    .json();
                n += 1;
            }
            n
        });
        let workers: Vec<_> = (0..WORKERS)
            .map(|i| {
                let net = &net;
                s.spawn(move || {
                    // Two thirds named pods, one third host-local style.
                    let pod =
                        (i % 3 != 0).then(|| Pod::new("ns", &format!("p{i}"), &format!("u{i}")));
                    let mut mine = BTreeSet::new();
                    for round in 0..ROUNDS {
                        let cid = format!("c{i}r{round}");
                        mine.insert(net.add(&cid, pod.as_ref()));
                        net.del(&cid, pod.as_ref());
                    }
                    if pod.is_some() {
                        assert_eq!(mine.len(), 1, "p{i} kept its address: {mine:?}");
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
        lister.join().unwrap()
    });
    assert!(listings >= 3);
    let st = check_dir(&net.dir(), COMPLETED);
    let rows = by_ip(&cli(&["--data-dir", &d, "list", "--json"]).code(0).json());
    let listed: BTreeSet<IpAddr> = rows.keys().copied().collect();
    assert_eq!(listed, st.ips(), "list agrees with the data dir");
    assert_eq!(st.released_count(), 21, "one released lease per named pod");
}

#[test]
fn metrics_file_counts_match_the_data_dir() {
    let tmp = temp_dir();
    let metrics = tmp.path().join("sticky.prom");
    let net = Net::new(
        "10.54.0.0/28",
        json!({ "metricsFile": metrics.to_str().unwrap() }),
    );
    let (a, b) = (Pod::new("ns", "a", "ua"), Pod::new("ns", "b", "ub"));
    net.add("ca1", Some(&a)); // miss
    net.add("cb1", Some(&b)); // miss
    net.add("canon", None); // not counted
    net.del("ca1", Some(&a));
    net.add("ca2", Some(&a)); // hit
    net.add("ca2", Some(&a)); // hit (idempotent)
    net.del("cb1", Some(&b));

    let text = std::fs::read_to_string(&metrics).unwrap();
    let samples = parse_prometheus(&text);
    let set = "10.54.0.1-10.54.0.14";
    let get = |name: &str, labels: &str| {
        samples
            .get(&format!("{name}{{{labels}}}"))
            .copied()
            .unwrap_or_else(|| panic!("no {name}{{{labels}}} in\n{text}"))
    };
    let rows = by_ip(
        &cli(&["--data-dir", net.data_arg(), "list", "--json"])
            .code(0)
            .json(),
    );
    let count = |state: &str| rows.values().filter(|r| r["state"] == state).count() as u64;
    let attached = count("attached") + count("host-local");
    let released = count("released");
    assert_eq!((attached, released), (2, 1));
    let labels = |state: &str| format!("network=\"{NET}\",range_set=\"{set}\",state=\"{state}\"");
    assert_eq!(get("sticky_ipam_addresses", &labels("attached")), attached);
    assert_eq!(get("sticky_ipam_addresses", &labels("released")), released);
    assert_eq!(
        get("sticky_ipam_addresses", &labels("free")),
        13 - attached - released
    );
    let result = |r: &str| format!("network=\"{NET}\",result=\"{r}\"");
    assert_eq!(get("sticky_ipam_sticky_total", &result("hit")), 2);
    assert_eq!(get("sticky_ipam_sticky_total", &result("miss")), 2);
    for line in [
        "# TYPE sticky_ipam_addresses gauge",
        "# TYPE sticky_ipam_sticky_total counter",
        "# HELP sticky_ipam_addresses ",
        "# HELP sticky_ipam_sticky_total ",
    ] {
        assert!(text.contains(line), "{line:?} missing in\n{text}");
    }
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["sticky.prom"], "no temp file left beside it");

    // A metrics file that cannot be written never fails the call.
    let broken = Net::new(
        "10.55.0.0/28",
        json!({ "metricsFile": "/nonexistent-dir/sticky.prom" }),
    );
    broken.add("cx", Some(&a));
}

/// `name{labels} value` lines → value, by `name{labels}`.
fn parse_prometheus(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (key, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let v: u64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        assert!(
            out.insert(key.to_string(), v).is_none(),
            "duplicate sample {key}"
        );
    }
    out
}

#[test]
fn show_explains_reclaim_and_exhaustion() {
    // .2 .. .6 are assignable.
    let net = Net::new("10.56.0.0/29", json!({}));
    let pods: Vec<Pod> = (0..5)
        .map(|i| Pod::new("ns", &format!("p{i}"), &format!("u{i}")))
        .collect();
    let ips: Vec<IpAddr> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| net.add(&format!("c{i}"), Some(p)))
        .collect();
    net.del("c3", Some(&pods[3]));
    net.del("c1", Some(&pods[1]));
    let c = net.config_arg();
    let v = cli(&["--config", c, "show", "ns/late", "--json"])
        .code(4)
        .json();
    let step = &v["next"]["addresses"][0];
    assert_eq!(step["action"], "reclaim");
    assert_eq!(
        step["ip"],
        ips[3].to_string(),
        "released first, reclaimed first"
    );
    let t = cli(&["--config", c, "show", "ns/late"]);
    assert!(
        t.code(4).stdout.contains(&format!(
            "reclaims {}, the lease released longest ago from ns/p3",
            ips[3]
        )),
        "{}",
        t.stdout
    );

    // whenExhausted: refuse — the ADD would fail, and show says why.
    let mut list: Value = serde_json::from_slice(&std::fs::read(&net.conflist).unwrap()).unwrap();
    list["plugins"][0]["ipam"]["whenExhausted"] = json!("refuse");
    let strict = net.conflist.with_file_name("strict.conflist");
    std::fs::write(&strict, serde_json::to_vec(&list).unwrap()).unwrap();
    let v = cli(&[
        "--config",
        strict.to_str().unwrap(),
        "show",
        "ns/late",
        "--json",
    ])
    .code(4)
    .json();
    assert_eq!(v["next"]["addresses"], json!([]));
    assert!(
        v["next"]["error"]
            .as_str()
            .unwrap()
            .contains("no IP addresses available"),
        "{v}"
    );
    let t = cli(&["--config", strict.to_str().unwrap(), "show", "ns/late"]);
    assert!(
        t.code(4)
            .stdout
            .contains("fails: failed to allocate for range 0: no IP addresses available")
    );
}

#[test]
fn choosing_a_network() {
    let net = Net::new("10.57.0.0/24", json!({}));
    net.add("c1", None);
    let other = Conf::v4("other", &net.data, "10.58.0.0/24");
    Plugin::sticky().run(&Call::add("c2", &other)).ok();
    let d = net.data_arg();
    // Two networks: list shows both; other commands need a choice.
    let rows = cli(&["--data-dir", d, "list", "--json"]).code(0).json();
    let nets: BTreeSet<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["network"].as_str().unwrap())
        .collect();
    assert_eq!(nets, BTreeSet::from([NET, "other"]));
    let e = cli(&["--data-dir", d, "forget", "ns/x"]);
    e.code(2);
    assert!(e.stderr.contains("--network"), "{}", e.stderr);
    cli(&["--data-dir", d, "--network", "other", "forget", "ns/x"]).code(4);
    // --network must agree with --config.
    let e = cli(&["--config", net.config_arg(), "--network", "other", "list"]);
    e.code(2);
    assert!(e.stderr.contains("\"other\""), "{}", e.stderr);
    // A missing or broken --config is a usage error quoting the file.
    cli(&["--config", "/nonexistent.conflist", "list"]).code(2);
    let bad = net.conflist.with_file_name("bad.conflist");
    std::fs::write(
        &bad,
        r#"{"name":"x","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}"#,
    )
    .unwrap();
    let e = cli(&["--config", bad.to_str().unwrap(), "list"]);
    e.code(2);
    assert!(e.stderr.contains("sticky-ipam"), "{}", e.stderr);
    let empty = temp_dir();
    cli(&["--data-dir", empty.path().to_str().unwrap(), "show", "ns/x"]).code(4);
}

#[test]
fn a_missing_data_dir_is_not_found_not_empty() {
    let tmp = temp_dir();
    let missing = tmp.path().join("no-such-dir");
    let d = missing.to_str().unwrap();
    cli(&["--data-dir", d, "list"]).code(4);
    cli(&["--data-dir", d, "list", "--json"]).code(4);
    assert!(!missing.exists(), "listing must not create the data dir");
}
