//! Property tests (proptest, bounded for CI) over the untrusted-input parsers: the network
//! config (common part and `ipam` section), `CNI_ARGS`, and record files.
//!
//! - The parsers, called directly: never a panic; a rejection always maps to a CNI error with
//!   the documented code; what is accepted round-trips.
//! - Fewer cases through the built binary, as a runtime runs it: the process never panics (exit
//!   status 0 or 1, never 101 or a signal), a failure prints one JSON error with a numeric
//!   code, and a rejected call leaves the data dir byte-for-byte unchanged.

use sticky_testkit::support;

use std::path::{Path, PathBuf};

use cni_protocol::{Args, CniError, NetConf};
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value, json};
use sticky_ipam::Error as IpamError;
use sticky_ipam::config::IpamConfig;
use sticky_ipam::identity::KNOWN_ARGS;
use sticky_ipam::record::{Body, LEASE_FORMAT, Lease, Record, State, parse_name};
use support::*;

const NET: &str = "prop";

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Shrunk failures are printed; no regression files in the shared tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies

const IPS: &[&str] = &[
    "10.50.0.0/24",
    "10.50.0.0/16",
    "10.50.0.0/30",
    "10.50.0.0/31",
    "10.50.0.0/32",
    "10.50.0.0/33",
    "10.50.0.1",
    "10.50.0.5",
    "10.50.0.9",
    "10.50.0.255",
    "10.50.0.0",
    "10.51.0.0/24",
    "10.50.0.5/24",
    "2001:db8::/64",
    "2001:db8::5",
    "2001:db8::/127",
    "0.0.0.0/0",
    "::/0",
    "300.1.1.1/24",
    "010.50.0.1",
    "",
    "x",
];

const DURATIONS: &[&str] = &[
    "1h",
    "90s",
    "1h30m",
    "7d",
    "0s",
    "",
    "h",
    "10",
    "-1h",
    "1x",
    "99999999999999999999d",
    "9999999999999999s9999999999999999d",
];

fn text() -> BoxedStrategy<String> {
    prop_oneof![
        "[ -~]{0,12}",
        ".{0,8}",
        select(vec!["", "_", "..", "/", "%", "a_b", "\u{0}", "é"]).prop_map(str::to_string),
    ]
    .boxed()
}

fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        select(IPS).prop_map(Value::from),
        text().prop_map(Value::from),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(vec![
            "cniVersion", "name", "type", "ipam", "prevResult", "runtimeConfig", "args",
            "ranges", "subnet", "rangeStart", "rangeEnd", "gateway", "routes", "dst", "gw",
            "ips", "address", "ipRanges", "sticky", "leaseHold", "whenExhausted",
        ])
        .prop_map(str::to_string),
        1 => text(),
    ]
    .boxed()
}

/// Any JSON value, small, with the config's own keys over-represented.
fn value() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(key(), inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
        .boxed()
}

fn ip_text() -> BoxedStrategy<Value> {
    prop_oneof![6 => select(IPS).prop_map(Value::from), 1 => value()].boxed()
}

fn object(entries: Vec<(String, Value)>) -> Value {
    Value::Object(entries.into_iter().collect::<Map<_, _>>())
}

fn range() -> BoxedStrategy<Value> {
    prop::collection::vec(
        (
            select(vec!["subnet", "rangeStart", "rangeEnd", "gateway"]).prop_map(str::to_string),
            ip_text(),
        ),
        0..5,
    )
    .prop_map(object)
    .boxed()
}

fn ranges() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => Just(json!([[{ "subnet": "10.50.0.0/24" }]])),
        2 => range().prop_map(|mut r| {
            r["subnet"] = json!("10.50.0.0/24");
            json!([[r]])
        }),
        4 => prop::collection::vec(prop::collection::vec(range(), 0..3), 0..3)
            .prop_map(|sets| json!(sets)),
        1 => value(),
    ]
    .boxed()
}

fn either(picks: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    prop_oneof![4 => picks, 1 => value()].boxed()
}

/// One key of the `ipam` section with a value of roughly the right shape (or anything).
fn ipam_entry() -> BoxedStrategy<(String, Value)> {
    let k = |s: &'static str| Just(s.to_string());
    prop_oneof![
        4 => (k("ranges"), ranges()),
        2 => (k("subnet"), ip_text()),
        1 => (k("rangeStart"), ip_text()),
        1 => (k("rangeEnd"), ip_text()),
        1 => (k("gateway"), ip_text()),
        1 => (k("routes"), either(prop::collection::vec(
            prop::collection::vec((select(vec!["dst", "gw", "mtu"]).prop_map(str::to_string), ip_text()), 0..3)
                .prop_map(object), 0..3).prop_map(Value::Array).boxed())),
        1 => (k("sticky"), either(any::<bool>().prop_map(Value::from).boxed())),
        1 => (k("whenExhausted"), either(select(vec!["reclaim", "refuse", "maybe", ""]).prop_map(Value::from).boxed())),
        1 => (k("leaseHold"), either(select(DURATIONS).prop_map(Value::from).boxed())),
        1 => (k("statusFailsWhenFull"), either(any::<bool>().prop_map(Value::from).boxed())),
        1 => (k("dataDir"), either(select(vec!["/abs/dir", "rel", "", "/"]).prop_map(Value::from).boxed())),
        1 => (k("resolvConf"), value()),
        1 => (k("metricsFile"), value()),
        1 => (k("type"), value()),
        1 => (text(), value()),
    ]
    .boxed()
}

/// Keys of the `ipam` section with values that are valid for a 10.50.0.0/24 range.
fn plausible_entry() -> BoxedStrategy<(String, Value)> {
    let k = |s: &'static str| Just(s.to_string());
    let pick = |v: Vec<Value>| select(v).boxed();
    prop_oneof![
        (k("sticky"), pick(vec![json!(true), json!(false)])),
        (
            k("whenExhausted"),
            pick(vec![json!("reclaim"), json!("refuse")])
        ),
        (
            k("leaseHold"),
            pick(vec![json!("1h"), json!("90s"), json!("7d")])
        ),
        (
            k("statusFailsWhenFull"),
            pick(vec![json!(true), json!(false)])
        ),
        (
            k("routes"),
            pick(vec![json!([{ "dst": "0.0.0.0/0" }]), json!([])])
        ),
        (
            k("rangeStart"),
            pick(vec![json!("10.50.0.10"), json!("10.50.0.2")])
        ),
        (
            k("type"),
            pick(vec![json!("sticky-ipam"), json!("host-local")])
        ),
    ]
    .boxed()
}

fn ipam() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => prop::collection::vec(plausible_entry(), 0..4).prop_map(|e| {
            let mut v = object(e);
            let start = v.as_object_mut().unwrap().remove("rangeStart");
            let mut r = json!({ "subnet": "10.50.0.0/24" });
            if let Some(start) = start {
                r["rangeStart"] = start;
            }
            v["ranges"] = json!([[r]]);
            v
        }),
        6 => (ranges(), prop::collection::vec(ipam_entry(), 0..5)).prop_map(|(r, mut e)| {
            e.insert(0, ("ranges".to_string(), r));
            object(e)
        }),
        2 => prop::collection::vec(ipam_entry(), 0..6).prop_map(object),
        1 => value(),
    ]
    .boxed()
}

/// A whole network config: mostly well-formed around a fuzzed `ipam` section.
fn netconf() -> BoxedStrategy<Value> {
    let version = prop_oneof![
        10 => select(vec!["1.1.0", "1.0.0", "0.4.0", "0.3.1", "0.3.0", "0.2.0", "0.1.0"])
            .prop_map(Value::from),
        1 => select(vec!["9.9.9", "", "1.1"]).prop_map(Value::from),
        1 => value(),
    ];
    let name = prop_oneof![
        10 => Just(Value::from(NET)),
        1 => select(vec!["", "../x", "a b", ".x"]).prop_map(Value::from),
        1 => value(),
    ];
    let runtime = prop_oneof![
        2 => Just(None),
        1 => prop::collection::vec(
            prop_oneof![
                (Just("ipRanges".to_string()), ranges()),
                (Just("ips".to_string()), prop::collection::vec(ip_text(), 0..3).prop_map(Value::Array)),
            ],
            0..3,
        )
        .prop_map(|e| Some(object(e))),
        1 => value().prop_map(Some),
    ];
    let cni_ips = prop_oneof![
        3 => Just(None),
        1 => prop::collection::vec(ip_text(), 0..3).prop_map(|v| Some(json!({ "cni": { "ips": v } }))),
    ];
    (version, name, ipam(), runtime, cni_ips)
        .prop_map(|(version, name, ipam, runtime, cni_ips)| {
            let mut c =
                json!({ "cniVersion": version, "name": name, "type": "bridge", "ipam": ipam });
            if let Some(r) = runtime {
                c["runtimeConfig"] = r;
            }
            if let Some(a) = cni_ips {
                c["args"] = a;
            }
            c
        })
        .boxed()
}

/// CNI_ARGS: well-formed pairs with hostile values, and malformed text.
fn cni_args() -> BoxedStrategy<String> {
    let pair = (
        prop_oneof![
            4 => select(vec![
                "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID", "K8S_POD_INFRA_CONTAINER_ID",
                "IgnoreUnknown", "IP", "FOO",
            ])
            .prop_map(str::to_string),
            1 => "[A-Za-z_=]{0,6}",
        ],
        prop_oneof![
            select(vec![
                "1",
                "0",
                "true",
                "maybe",
                "",
                "10.50.0.7",
                "10.50.0.7,10.50.0.8",
                "x_y",
                "..",
                "a/b"
            ])
            .prop_map(str::to_string),
            "[^;]{0,20}",
            "[a-z0-9]{60,90}",
        ],
    )
        .prop_map(|(k, v)| format!("{k}={v}"));
    prop_oneof![
        4 => prop::collection::vec(pair, 0..6).prop_map(|p| p.join(";")),
        1 => ".{0,40}",
    ]
    .boxed()
}

fn record_name() -> BoxedStrategy<String> {
    let ip = select(vec![
        "10.50.0.9",
        "2001:db8::9",
        "010.50.0.9",
        "10.50.0.9x",
        "::ffff:10.50.0.9",
    ]);
    let part = "[a-z0-9%._~-]{0,10}";
    prop_oneof![
        (ip.clone(), part, part).prop_map(|(ip, ns, p)| format!("{ip}_{ns}_{p}")),
        ip.clone().prop_map(str::to_string),
        (ip, part).prop_map(|(ip, p)| format!("{ip}_{p}")),
        ".{0,20}",
    ]
    .boxed()
}

fn lease_json() -> BoxedStrategy<Vec<u8>> {
    (
        text(),
        text(),
        text(),
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
        value(),
    )
        .prop_map(|(cid, pod, boot, attached, seq, at, junk)| {
            let mut v = json!({
                "format": LEASE_FORMAT, "containerId": cid, "ifname": "eth0", "namespace": "ns",
                "pod": pod, "podUid": "u", "boot": boot,
                "state": if attached { "attached" } else { "released" },
                "releaseSeq": seq, "releasedAt": at,
            });
            // Now and then one field replaced by anything.
            if let (Some(k), Some(obj)) = (junk.as_str().map(str::to_string), v.as_object_mut())
                && let Some(field) = obj.keys().nth(k.len() % 10).cloned()
            {
                obj.insert(field, junk);
            }
            let mut bytes = serde_json::to_vec(&v).unwrap();
            bytes.push(b'\n');
            bytes
        })
        .boxed()
}

fn record_body() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        ".{0,30}".prop_map(String::into_bytes),
        ("[ -~]{0,12}", "[ -~\r\n]{0,12}").prop_map(|(a, b)| format!("{a}\r\n{b}").into_bytes()),
        lease_json(),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// The parsers, called directly

fn ipam_code(e: impl Into<IpamError>) -> u32 {
    let err: CniError = e.into().into();
    assert!(!err.msg.is_empty(), "error without a message");
    err.code
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn cni_args_parser_never_panics_and_refuses_with_code_4(text in cni_args()) {
        match Args::parse(&text) {
            Err(e) => prop_assert_eq!(ipam_code(e), 4),
            Ok(args) => {
                // Every non-empty item is a pair whose key reads back its value.
                for item in text.split(';').filter(|i| !i.is_empty()) {
                    let (k, v) = item.split_once('=').unwrap();
                    prop_assert_eq!(args.get(k), Some(v));
                }
                if let Err(e) = args.check_known(&KNOWN_ARGS) {
                    prop_assert_eq!(ipam_code(e), 4);
                }
            }
        }
    }

    #[test]
    fn cni_args_pairs_round_trip(
        pairs in prop::collection::btree_map("[A-Za-z_][A-Za-z0-9_]{0,8}", "[^;]{0,16}", 0..6)
    ) {
        let text: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let args = Args::parse(&text.join(";")).unwrap();
        for (k, v) in &pairs {
            prop_assert_eq!(args.get(k), Some(v.as_str()));
        }
    }

    #[test]
    fn netconf_parser_never_panics_on_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        if let Err(e) = NetConf::parse(&bytes) {
            let err = CniError::from(e);
            prop_assert!([1, 6, 7].contains(&err.code), "code {} for {:?}", err.code, err.msg);
        }
    }

    #[test]
    fn config_parsers_never_panic_and_refuse_with_a_config_code(
        conf in netconf(),
        args in cni_args(),
    ) {
        let bytes = serde_json::to_vec(&conf).unwrap();
        let net = match NetConf::parse(&bytes) {
            Ok(net) => net,
            Err(e) => {
                let err = CniError::from(e);
                prop_assert!([1, 6, 7].contains(&err.code), "code {} for {:?}", err.code, err.msg);
                return Ok(());
            }
        };
        let Ok(args) = Args::parse(&args) else { return Ok(()) };
        match IpamConfig::from_netconf(&net, &args) {
            Err(e) => prop_assert_eq!(ipam_code(e), 7),
            Ok(c) => {
                prop_assert!(!c.range_sets.is_empty());
                prop_assert!(c.data_dir.is_absolute());
                // The network's own name (the generator sometimes gives another valid one).
                prop_assert_eq!(c.network_dir(), c.data_dir.join(&net.name));
            }
        }
    }

    #[test]
    fn record_parser_never_panics_and_is_a_fixed_point(name in record_name(), body in record_body()) {
        let parsed = Record::parse(&name, &body);
        prop_assert_eq!(parsed.is_some(), parse_name(&name).is_some());
        if let Some(r) = parsed {
            prop_assert_eq!(&r.name, &name);
            // What the plugin would write back reads as the same record (a held record is
            // never written back).
            if !matches!(r.body, Body::Held(_)) {
                prop_assert_eq!(Record::parse(&name, &r.to_bytes()), Some(r.clone()));
            }
            if name.contains('_') {
                let host_local = matches!(r.body, Body::HostLocal { .. });
                prop_assert!(!host_local, "{:?}", r);
            } else {
                let host_local = matches!(r.body, Body::HostLocal { .. });
                prop_assert!(host_local, "{:?}", r);
            }
        }
    }

    #[test]
    fn leases_round_trip_byte_for_byte(
        cid in text(), pod in text(), boot in text(), attached in any::<bool>(),
        seq in any::<u64>(), at in any::<u64>(),
    ) {
        let lease = Lease {
            format: LEASE_FORMAT.into(), container_id: cid, ifname: "eth0".into(),
            namespace: "ns".into(), pod, pod_uid: "u".into(), boot,
            state: if attached { State::Attached } else { State::Released },
            release_seq: seq, release_clock: at,
        };
        let name = "10.50.0.9_ns_p";
        let r = Record::parse(name, &Record { ip: "10.50.0.9".parse().unwrap(), name: name.into(), body: Body::Lease(lease.clone()) }.to_bytes()).unwrap();
        prop_assert_eq!(r.body, Body::Lease(lease));
    }
}

// ---------------------------------------------------------------------------------------------
// Through the binary

/// A data dir (`<tmp>/data/prop`) holding an attached lease (10.50.0.2), a released lease
/// (10.50.0.3) and a record without identity (10.50.0.4), built once and copied per case.
fn template() -> &'static Path {
    static DIR: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, data) = DIR.get_or_init(|| {
        let tmp = temp_dir();
        let data = tmp.path().join("data");
        let conf = base_conf(&data);
        let p = Plugin::sticky();
        p.run(&Call::add("ca", &conf).pod(&Pod::new("ns", "a", "uid-a")))
            .ok();
        p.run(&Call::add("cb", &conf).pod(&Pod::new("ns", "b", "uid-b")))
            .ok();
        p.run(&Call::del("cb", &conf).pod(&Pod::new("ns", "b", "uid-b")))
            .ok_empty();
        p.run(&Call::add("cn", &conf)).ok();
        check_dir(&data.join(NET), COMPLETED);
        (tmp, data)
    });
    data
}

fn base_conf(data: &Path) -> Conf {
    Conf::v4(NET, data, "10.50.0.0/24").version("1.1.0")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A fresh copy of the template: (guard, data dir).
fn fresh() -> (tempfile::TempDir, PathBuf) {
    let tmp = temp_dir();
    let data = tmp.path().join("data");
    copy_dir(template(), &data);
    (tmp, data)
}

/// Codes of a refusal by the parsers (version, unsupported field, env/CNI_ARGS, decode,
/// config): nothing may have been touched.
const INPUT_CODES: [u64; 5] = [1, 2, 4, 6, 7];

/// Runs `call`; asserts the process did not panic, and on failure that it printed a CNI error.
/// A refusal of the input leaves everything under `root` byte-for-byte as it was; any other
/// failure (range exhausted, requested address taken) leaves a data dir that passes the
/// invariant checks. Returns whether the call succeeded.
fn run_checked(call: &Call, root: &Path) -> Result<bool, TestCaseError> {
    let before = snapshot(root);
    let out = Plugin::sticky().run(call);
    let status = out.status.code();
    prop_assert!(
        status == Some(0) || status == Some(1),
        "{}: exit status {:?} (panic or signal); stderr {}",
        out.what,
        out.status,
        out.stderr
    );
    prop_assert!(
        !out.stderr.contains("panicked"),
        "{}: {}",
        out.what,
        out.stderr
    );
    if status == Some(0) {
        return Ok(true);
    }
    let code = out.err_code();
    if INPUT_CODES.contains(&code) {
        assert_same(
            &before,
            &snapshot(root),
            &format!("{} refused with code {code}", out.what),
        );
    } else {
        check_dir(&root.join("data").join(NET), COMPLETED);
    }
    Ok(false)
}

/// Pins every path of a generated config inside `data` (never the machine's
/// /var/lib/cni/networks), keeping a relative `dataDir` now and then to be refused.
fn confine(mut conf: Value, data: &Path, keep_relative: bool) -> Value {
    if let Some(ipam) = conf.get_mut("ipam").and_then(Value::as_object_mut) {
        let relative = ipam.get("dataDir").and_then(Value::as_str) == Some("rel");
        if !(relative && keep_relative) {
            ipam.insert("dataDir".into(), json!(data));
        }
        ipam.remove("metricsFile");
        if ipam.contains_key("resolvConf") {
            ipam.insert("resolvConf".into(), json!(data.join("no-resolv.conf")));
        }
    }
    conf
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn binary_refuses_bad_configs_with_a_code_and_changes_nothing(
        conf in netconf(),
        keep_relative in any::<bool>(),
    ) {
        let (tmp, data) = fresh();
        let conf = confine(conf, &data, keep_relative);
        let stdin = serde_json::to_vec(&conf).unwrap();
        let pod = Pod::new("ns", "new", "uid-new");
        let add = Call::new("ADD", "cnew", &stdin).pod(&pod);
        if run_checked(&add, tmp.path())? {
            // Accepted: then the attached lease of a was not handed out again.
            let st = check_dir(&data.join(NET), COMPLETED);
            prop_assert_eq!(st.attached_to("ca"), vec![ip("10.50.0.2")]);
        }
        run_checked(&Call::new("DEL", "ca", &stdin).pod(&Pod::new("ns", "a", "uid-a")), tmp.path())?;
        let mut status = Call::new("STATUS", "", &stdin);
        status.container_id = None;
        status.ifname = None;
        status.netns = None;
        run_checked(&status, tmp.path())?;
    }

    #[test]
    fn binary_refuses_bad_cni_args_with_a_code_and_changes_nothing(args in cni_args()) {
        // An environment variable cannot hold NUL: no runtime can send it.
        prop_assume!(!args.contains('\0'));
        let (tmp, data) = fresh();
        let conf = base_conf(&data);
        let ok = run_checked(&Call::add("cnew", &conf).args(args.clone()), tmp.path())?;
        if ok {
            let st = check_dir(&data.join(NET), COMPLETED);
            prop_assert_eq!(st.attached_to("ca"), vec![ip("10.50.0.2")]);
        }
        run_checked(&Call::del("ca", &conf).args(args), tmp.path())?;
    }

    #[test]
    fn binary_survives_any_record_file_and_never_hands_its_address_out(
        name in record_name(),
        body in record_body(),
    ) {
        let (tmp, data) = fresh();
        let net = data.join(NET);
        let path = net.join(&name);
        // Names that would leave the directory or are not file names are not records.
        prop_assume!(!name.is_empty() && !name.contains('/') && !name.contains('\0') && name != "." && name != "..");
        prop_assume!(!path.exists());
        std::fs::write(&path, &body).unwrap();
        let conf = base_conf(&data);
        let pod = Pod::new("ns", "new", "uid-new");
        let before = snapshot(tmp.path());
        let out = Plugin::sticky().run(&Call::add("cnew", &conf).pod(&pod));
        prop_assert!(matches!(out.status.code(), Some(0 | 1)), "{:?} {}", out.status, out.stderr);
        if out.status.success() {
            let got = result_ip(&out.json.clone().unwrap());
            if let Some((taken, _)) = parse_name(&name) {
                prop_assert_ne!(got, taken, "the address of {:?} was handed out", name);
            }
            for held in ["10.50.0.2", "10.50.0.3", "10.50.0.4"] {
                prop_assert_ne!(got, ip(held));
            }
        } else {
            let code = out.err_code();
            prop_assert!(INPUT_CODES.contains(&code), "ADD refused with {}: {}", code, out.stderr);
            assert_same(&before, &snapshot(tmp.path()), "refused ADD");
        }
        run_checked(&Call::del("ca", &conf).pod(&Pod::new("ns", "a", "uid-a")), tmp.path())?;
        let gc = conf.clone().top("cni.dev/valid-attachments", json!([]));
        let mut call = Call::new("GC", "", &gc.bytes());
        call.container_id = None;
        call.ifname = None;
        call.netns = None;
        run_checked(&call, tmp.path())?;
    }

    #[test]
    fn binary_refuses_malformed_gc_lists_and_changes_nothing(list in value()) {
        let (tmp, data) = fresh();
        let conf = base_conf(&data).top("cni.dev/valid-attachments", list.clone());
        let mut call = Call::new("GC", "", &conf.bytes());
        call.container_id = None;
        call.ifname = None;
        call.netns = None;
        // `null` is libcni's spelling of an empty list (a nil Go slice).
        let well_formed = list.is_null() || serde_json::from_value::<Vec<Map<String, Value>>>(list.clone())
            .is_ok_and(|v| v.iter().all(|a| a.get("containerID").is_some_and(Value::is_string) && a.get("ifname").is_some_and(Value::is_string)));
        let ok = run_checked(&call, tmp.path())?;
        prop_assert_eq!(ok, well_formed, "GC list {}", list);
    }
}
