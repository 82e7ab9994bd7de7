//! Parallel calls, as a node starting many pods at once makes them: the flock serialises whole
//! commands, so no address is handed out twice and nothing is lost.

use sticky_testkit::support;

use std::collections::BTreeSet;
use std::net::IpAddr;

use support::*;

const NET: &str = "par";
const N: usize = 64;

#[test]
fn sixty_four_parallel_adds_then_sixty_four_parallel_dels() {
    let tmp = temp_dir();
    let conf = Conf::v4(NET, tmp.path(), "10.40.0.0/24");
    let p = Plugin::sticky();
    // Two thirds with a pod identity (sticky records), one third without (host-local records).
    let pod = |i: usize| {
        (!i.is_multiple_of(3)).then(|| Pod::new("ns", &format!("p{i}"), &format!("u{i}")))
    };
    let call = |cmd: &str, i: usize| {
        let c = Call::new(cmd, &format!("c{i}"), &conf.bytes());
        match pod(i) {
            Some(p) => c.pod(&p),
            None => c,
        }
    };

    // Start every process before waiting for any.
    let children: Vec<_> = (0..N).map(|i| p.spawn(&call("ADD", i))).collect();
    let mut ips: Vec<IpAddr> = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = finish(child, format!("ADD c{i}"));
        ips.push(result_ip(&out.ok()));
    }
    let distinct: BTreeSet<_> = ips.iter().collect();
    assert_eq!(distinct.len(), N, "addresses handed out twice: {ips:?}");
    let st = check_dir(&tmp.path().join(NET), COMPLETED);
    assert_eq!(st.records.len(), N);
    for (i, a) in ips.iter().enumerate() {
        assert_eq!(st.attached_to(&format!("c{i}")), vec![*a], "c{i}");
    }

    let children: Vec<_> = (0..N).map(|i| p.spawn(&call("DEL", i))).collect();
    for (i, child) in children.into_iter().enumerate() {
        finish(child, format!("DEL c{i}")).ok_empty();
    }
    let st = check_dir(&tmp.path().join(NET), COMPLETED);
    for (i, a) in ips.iter().enumerate() {
        match pod(i) {
            Some(_) => assert!(!st.sticky(*a).attached, "c{i}: {a} still attached"),
            None => assert!(st.by_ip(*a).is_none(), "c{i}: {a} not freed"),
        }
    }
    let with_identity = (0..N).filter(|i| pod(*i).is_some()).count();
    assert_eq!(st.records.len(), with_identity);
    let seqs: BTreeSet<u64> = st
        .records
        .values()
        .filter_map(|(_, r)| match r {
            Record::Sticky(s) => Some(s.release_seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs.len(), with_identity, "each release has its own order");

    // Every pod comes back on its own address, again all at once.
    let children: Vec<_> = (0..N)
        .filter(|i| pod(*i).is_some())
        .map(|i| {
            (
                i,
                p.spawn(&call("ADD", i + 1000).args(pod(i).unwrap().kubelet_args("x"))),
            )
        })
        .collect();
    for (i, child) in children {
        let out = finish(child, format!("re-ADD p{i}"));
        assert_eq!(result_ip(&out.ok()), ips[i], "p{i} lost its lease");
    }
    check_dir(&tmp.path().join(NET), COMPLETED);
}
