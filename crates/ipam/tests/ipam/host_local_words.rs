//! Drop-in means drop-in: where sticky-ipam and host-local refuse the same input for the same
//! reason, sticky-ipam's message is host-local's word for word (Debian's
//! containernetworking-plugins 1.1.1, `/usr/lib/cni/host-local`), so scripts and tests written
//! against host-local keep matching. Every case runs both plugins on the same input, each in a
//! data dir of its own. The codes differ on purpose (host-local answers 999 for almost
//! everything; README, "Error codes"): each case also pins sticky-ipam's own code. The list of
//! messages is in docs/ipam.md, "Drop-in wording".

use sticky_testkit::support;

use std::path::Path;

use serde_json::{Value, json};
use support::*;

/// One shared refusal: calls that set it up (all must succeed), then the refused call.
struct Case {
    name: &'static str,
    calls: fn(&Path) -> Vec<Call>,
    /// sticky-ipam's code for it.
    code: u64,
}

fn conf(data: &Path, ranges: Value) -> Conf {
    Conf::new("words", data, ranges)
}

fn v4(data: &Path) -> Conf {
    conf(data, json!([[{"subnet": "10.1.2.0/24"}]]))
}

fn add(conf: &Conf, cid: &str, args: &str) -> Call {
    Call::add(cid, conf).args(args)
}

fn ranges(data: &Path, ranges: Value) -> Vec<Call> {
    vec![add(&conf(data, ranges), "c1", "IgnoreUnknown=1")]
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "requested IP outside every range",
            calls: |d| vec![add(&v4(d), "c1", "IgnoreUnknown=1;IP=10.9.9.9")],
            code: 101,
        },
        Case {
            name: "requested IP outside every range (runtimeConfig)",
            calls: |d| {
                let c = v4(d).top("runtimeConfig", json!({"ips": ["10.9.9.9/24"]}));
                vec![add(&c, "c1", "IgnoreUnknown=1")]
            },
            code: 101,
        },
        Case {
            name: "requested IP is the gateway",
            calls: |d| vec![add(&v4(d), "c1", "IgnoreUnknown=1;IP=10.1.2.1")],
            code: 101,
        },
        Case {
            name: "requested IP is taken",
            calls: |d| {
                vec![
                    add(&v4(d), "c0", "IgnoreUnknown=1;IP=10.1.2.77"),
                    add(&v4(d), "c1", "IgnoreUnknown=1;IP=10.1.2.77"),
                ]
            },
            code: 101,
        },
        Case {
            name: "range exhausted",
            calls: |d| {
                let c = conf(d, json!([[{"subnet": "10.1.2.0/30"}]]));
                vec![
                    add(&c, "c0", "IgnoreUnknown=1"),
                    add(&c, "c1", "IgnoreUnknown=1"),
                ]
            },
            code: 100,
        },
        Case {
            name: "two addresses of a family for CNI 0.2.0",
            calls: |d| {
                let c = conf(
                    d,
                    json!([[{"subnet": "10.1.2.0/24"}], [{"subnet": "10.1.3.0/24"}]]),
                )
                .version("0.2.0");
                vec![add(&c, "c1", "IgnoreUnknown=1")]
            },
            code: 7,
        },
        Case {
            name: "no ranges",
            calls: |d| ranges(d, json!([])),
            code: 7,
        },
        Case {
            name: "no ipam key",
            calls: |d| {
                let mut c = v4(d);
                c.value.as_object_mut().unwrap().remove("ipam");
                vec![add(&c, "c1", "IgnoreUnknown=1")]
            },
            code: 7,
        },
        Case {
            name: "range sets overlap",
            calls: |d| {
                ranges(
                    d,
                    json!([[{"subnet": "10.1.2.0/24"}], [{"subnet": "10.1.2.0/25"}]]),
                )
            },
            code: 7,
        },
        Case {
            name: "ranges in one set overlap",
            calls: |d| {
                ranges(
                    d,
                    json!([[{"subnet": "10.1.2.0/24"}, {"subnet": "10.1.2.0/25"}]]),
                )
            },
            code: 7,
        },
        Case {
            name: "a /31",
            calls: |d| ranges(d, json!([[{"subnet": "10.1.2.0/31"}]])),
            code: 7,
        },
        Case {
            name: "host bits set",
            calls: |d| ranges(d, json!([[{"subnet": "10.1.2.5/24"}]])),
            code: 7,
        },
        Case {
            name: "not a CIDR",
            calls: |d| ranges(d, json!([[{"subnet": "10.1.2.0/33"}]])),
            code: 7,
        },
        Case {
            name: "rangeStart outside the subnet",
            calls: |d| {
                ranges(
                    d,
                    json!([[{"subnet": "10.1.2.0/24", "rangeStart": "10.1.3.5"}]]),
                )
            },
            code: 7,
        },
        Case {
            name: "rangeEnd outside the subnet",
            calls: |d| {
                ranges(
                    d,
                    json!([[{"subnet": "10.1.2.0/24", "rangeEnd": "10.1.3.5"}]]),
                )
            },
            code: 7,
        },
        Case {
            name: "mixed families in a range set",
            calls: |d| {
                ranges(
                    d,
                    json!([[{"subnet": "10.1.2.0/24"}, {"subnet": "fd00::/64"}]]),
                )
            },
            code: 7,
        },
        Case {
            name: "an empty range set",
            calls: |d| ranges(d, json!([[]])),
            code: 7,
        },
        Case {
            name: "IP= is not an address",
            calls: |d| vec![add(&v4(d), "c1", "IgnoreUnknown=1;IP=foo")],
            code: 7,
        },
        Case {
            name: "unknown CNI_ARGS without IgnoreUnknown",
            calls: |d| vec![add(&v4(d), "c1", "FOO=bar")],
            code: 4,
        },
        Case {
            name: "resolvConf missing",
            calls: |d| {
                let c = v4(d).ipam("resolvConf", json!("/nonexistent/resolv.conf"));
                vec![add(&c, "c1", "IgnoreUnknown=1")]
            },
            code: 5,
        },
        Case {
            name: "CNI_CONTAINERID missing",
            calls: |d| {
                let mut c = add(&v4(d), "c1", "IgnoreUnknown=1");
                c.container_id = None;
                vec![c]
            },
            code: 4,
        },
        Case {
            name: "CNI_CONTAINERID invalid",
            calls: |d| vec![add(&v4(d), "-bad", "IgnoreUnknown=1")],
            code: 4,
        },
        Case {
            name: "CNI_IFNAME too long",
            calls: |d| vec![add(&v4(d), "c1", "IgnoreUnknown=1").ifname("0123456789abcdefX")],
            code: 4,
        },
        Case {
            name: "CNI_IFNAME with a slash",
            calls: |d| vec![add(&v4(d), "c1", "IgnoreUnknown=1").ifname("a/b")],
            code: 4,
        },
        Case {
            name: "unknown CNI_COMMAND",
            calls: |d| {
                let mut c = add(&v4(d), "c1", "IgnoreUnknown=1");
                c.command = "FOO".into();
                vec![c]
            },
            code: 4,
        },
        Case {
            name: "unsupported cniVersion",
            calls: |d| vec![add(&v4(d).version("9.9.9"), "c1", "IgnoreUnknown=1")],
            code: 1,
        },
    ]
}

/// The refused call's error JSON, after the set-up calls succeeded.
fn refusal(p: &Plugin, calls: Vec<Call>) -> Value {
    let (last, setup) = calls.split_last().unwrap();
    for call in setup {
        p.run(call).ok();
    }
    let out = p.run(last);
    assert!(!out.status.success(), "{} succeeded", describe(last));
    out.json.clone().unwrap()
}

#[test]
fn shared_refusals_use_host_locals_words() {
    let (hl, sticky) = (Plugin::at(host_local_bin()), Plugin::sticky());
    let mut differ = Vec::new();
    for case in cases() {
        let (a, b) = (temp_dir(), temp_dir());
        let with_path = |calls: Vec<Call>| -> Vec<Call> {
            calls
                .into_iter()
                .map(|mut c| {
                    // host-local's skeleton insists on CNI_PATH; the spec does not.
                    c.path = Some("/usr/lib/cni".into());
                    c
                })
                .collect()
        };
        let theirs = refusal(&hl, with_path((case.calls)(a.path())));
        let ours = refusal(&sticky, with_path((case.calls)(b.path())));
        if ours["msg"] != theirs["msg"] {
            differ.push(format!(
                "{}:\n  host-local:  {}\n  sticky-ipam: {}",
                case.name, theirs["msg"], ours["msg"]
            ));
        }
        assert_eq!(ours["code"], json!(case.code), "{}: code", case.name);
    }
    assert!(
        differ.is_empty(),
        "{} refusal(s) worded differently:\n{}",
        differ.len(),
        differ.join("\n")
    );
}
