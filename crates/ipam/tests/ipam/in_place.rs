//! A lease rewritten under its own name (DEL: attached → released; a returning pod: released
//! → attached) is rewritten in place when it fits in one sector: the same inode, the
//! directory untouched, the index still trusted. What does not qualify — a body longer than
//! a sector, a lease written unpadded by an older release, a file with another hard link —
//! is replaced whole by the temp-file path, as before.

use sticky_testkit::support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::json;
use support::*;

const NET: &str = "inplace";

fn conf(data: &Path) -> Conf {
    Conf::new(NET, data, json!([[{"subnet": "10.63.0.0/24"}]]))
}

/// What a rename or a create in the directory would change.
fn dir_state(net: &Path) -> (i64, i64, i64, i64, Vec<String>) {
    let m = std::fs::metadata(net).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(net)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec(), names)
}

/// The one lease file of `ip` (a long pod name is shortened in the file name).
fn record_at(net: &Path, ip: std::net::IpAddr) -> std::path::PathBuf {
    let prefix = format!("{ip}_");
    let mut found = std::fs::read_dir(net)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&prefix)
        });
    let file = found.next().expect("no lease file");
    assert!(found.next().is_none(), "two lease files for {ip}");
    file
}

#[test]
fn del_and_return_rewrite_the_lease_in_place_and_leave_the_directory_alone() {
    let tmp = temp_dir();
    let c = conf(tmp.path());
    let net = tmp.path().join(NET);
    let p = Plugin::sticky();
    // The first release of the data dir creates its release counter: a change of its own.
    let first = Pod::new("ns", "first", "uid-first");
    p.run(&Call::add("c0", &c).pod(&first)).ok();
    p.run(&Call::del("c0", &c).pod(&first)).ok_empty();
    let pod = Pod::new("ns", "web", "uid-web");
    let ip = result_ip(&p.run(&Call::add("c1", &c).pod(&pod)).ok());
    let file = record_at(&net, ip);
    let added = std::fs::metadata(&file).unwrap();
    assert_eq!(added.len() % 64, 0, "a new lease is padded to its slot");
    assert!(added.len() <= 512, "a short lease fits one sector");
    let before = dir_state(&net);

    p.run(&Call::del("c1", &c).pod(&pod)).ok_empty();
    let released = std::fs::metadata(&file).unwrap();
    assert_eq!(
        released.ino(),
        added.ino(),
        "DEL replaced the file instead of rewriting it"
    );
    assert_eq!(released.len(), added.len());
    assert_eq!(dir_state(&net), before, "DEL changed the directory");
    assert!(
        check_index(&net),
        "the index is no longer trusted after an in-place DEL"
    );
    let st = check_dir(&net, COMPLETED);
    assert!(!st.sticky(ip).attached, "the lease is not released");

    // The pod comes back: its lease, attached again, in the same file.
    let again = result_ip(&p.run(&Call::add("c2", &c).pod(&pod)).ok());
    assert_eq!(again, ip);
    assert_eq!(std::fs::metadata(&file).unwrap().ino(), added.ino());
    assert_eq!(
        dir_state(&net),
        before,
        "the returning ADD changed the directory"
    );
    let st = check_dir(&net, COMPLETED);
    assert_eq!(st.attached_to("c2"), vec![ip]);
    assert!(check_index(&net));
}

#[test]
fn a_lease_longer_than_a_sector_is_replaced_whole() {
    let tmp = temp_dir();
    let c = conf(tmp.path());
    let net = tmp.path().join(NET);
    let p = Plugin::sticky();
    let long = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    // A namespace of 63 and a pod of 253 characters: the body is over 512 bytes.
    let pod = Pod::new(&"n".repeat(63), &long, "uid-long");
    let ip = result_ip(&p.run(&Call::add("c1", &c).pod(&pod)).ok());
    let file = record_at(&net, ip);
    let added = std::fs::metadata(&file).unwrap();
    assert!(added.len() > 512, "the test needs a body over one sector");

    p.run(&Call::del("c1", &c).pod(&pod)).ok_empty();
    assert_ne!(
        std::fs::metadata(&file).unwrap().ino(),
        added.ino(),
        "rewritten in place"
    );
    let st = check_dir(&net, COMPLETED);
    assert!(!st.sticky(ip).attached);
    assert!(check_index(&net));
}

#[test]
fn an_unpadded_lease_of_an_older_release_that_cannot_take_the_release_is_replaced_whole() {
    let tmp = temp_dir();
    let c = conf(tmp.path());
    let net = tmp.path().join(NET);
    let ip = ip("10.63.0.9");
    // As 0.1.0 wrote it: the JSON line, no padding.
    let mut rec = released("ns", "old", 1);
    rec.container_id = "c-old".into();
    rec.attached = true;
    rec.release_seq = 0;
    rec.released_at = 0;
    seed_sticky(&net, ip, &rec);
    // The next release number has one digit more than the `0` it replaces.
    std::fs::write(net.join("release_seq"), "41").unwrap();
    let file = net.join(sticky_name(ip, "ns", "old"));
    let seeded = std::fs::metadata(&file).unwrap();

    let pod = Pod::new("ns", "old", "uid-old");
    Plugin::sticky()
        .run(&Call::del("c-old", &c).pod(&pod))
        .ok_empty();
    let after = std::fs::metadata(&file).unwrap();
    assert_ne!(
        after.ino(),
        seeded.ino(),
        "a longer body was written over a shorter file"
    );
    let st = check_dir(&net, COMPLETED);
    assert!(!st.sticky(ip).attached);
}

#[test]
fn a_hard_linked_lease_is_replaced_never_written_through() {
    let tmp = temp_dir();
    let c = conf(tmp.path());
    let net = tmp.path().join(NET);
    let p = Plugin::sticky();
    let pod = Pod::new("ns", "web", "uid-web");
    let ip = result_ip(&p.run(&Call::add("c1", &c).pod(&pod)).ok());
    let file = record_at(&net, ip);
    let other = tmp.path().join("someone-elses");
    std::fs::hard_link(&file, &other).unwrap();
    let theirs = std::fs::read(&other).unwrap();

    p.run(&Call::del("c1", &c).pod(&pod)).ok_empty();
    assert_eq!(
        std::fs::read(&other).unwrap(),
        theirs,
        "DEL wrote through a hard link"
    );
    assert_eq!(std::fs::metadata(&file).unwrap().nlink(), 1);
    let st = check_dir(&net, COMPLETED);
    assert!(!st.sticky(ip).attached);
}
