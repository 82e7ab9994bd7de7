use super::*;
use std::os::unix::fs::{PermissionsExt, symlink};

fn dir() -> (tempfile::TempDir, KeyDir) {
    let t = tempfile::tempdir().unwrap();
    let uid = fs::metadata(t.path()).unwrap().uid();
    let k = KeyDir::new(t.path().join("keys"), uid);
    (t, k)
}

/// A key file's text, as `wg genkey` writes it.
fn key_text(byte: u8) -> String {
    PrivateKey::from_bytes([byte; 32])
        .to_file_text()
        .to_string()
}

/// The previous key kept by a rotation, if any (checked as the key file is).
fn previous(k: &KeyDir, name: &str) -> Result<Option<PrivateKey>, Error> {
    k.check_dir()?;
    k.load(&k.previous_path(name)?)
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn rotated_is_redacted_in_debug() {
    let k = PrivateKey::from_bytes([0xab; 32]);
    let secret = key_text(0xab);
    let r = Rotated {
        new: k.clone(),
        previous: k.public_key(),
    };
    assert!(!format!("{r:?}").contains(secret.trim_end()));
}

#[test]
fn created_once_then_kept() {
    let (_t, k) = dir();
    let a = k.load_or_create("wg0.key").unwrap();
    let path = k.dir.join("wg0.key");
    let meta = fs::symlink_metadata(&path).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.uid(), k.owner);
    assert_eq!(fs::metadata(&k.dir).unwrap().mode() & 0o777, 0o700);
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.len(), 45);
    assert!(text.ends_with('\n'));
    let b = k.load_or_create("wg0.key").unwrap();
    assert_eq!(a, b);
    assert_eq!(a.public_key(), b.public_key());
    // No temp file left behind.
    assert_eq!(names(&k.dir), ["wg0.key"]);
}

#[test]
fn stale_temp_files_are_removed() {
    let (_t, k) = dir();
    fs::create_dir_all(&k.dir).unwrap();
    let stale = [".wg0.key.tmp", ".wg0.key.new.0123456789abcdef"];
    for name in stale {
        fs::write(k.dir.join(name), "half").unwrap();
    }
    // Another's file of a similar name is not ours to remove.
    fs::write(k.dir.join(".wg0.key.rpmsave"), "keep").unwrap();
    let a = k.load_or_create("wg0.key").unwrap();
    assert_eq!(k.load_or_create("wg0.key").unwrap(), a);
    assert_eq!(names(&k.dir), [".wg0.key.rpmsave", "wg0.key"]);
}

#[test]
fn bad_files_are_refused_and_kept() {
    let (t, k) = dir();
    fs::create_dir_all(&k.dir).unwrap();
    let path = k.dir.join("wg0.key");
    let good = key_text(9);
    let write_0600 = |p: &Path, text: &str| {
        fs::write(p, text).unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(0o600)).unwrap();
    };
    type Setup<'a> = Box<dyn Fn(&Path) + 'a>;
    let cases: Vec<(&str, Setup, &str)> = vec![
        (
            "mode 0644",
            Box::new(|p: &Path| {
                fs::write(p, &good).unwrap();
                fs::set_permissions(p, fs::Permissions::from_mode(0o644)).unwrap();
            }),
            "mode 0644",
        ),
        (
            "a directory",
            Box::new(|p: &Path| fs::create_dir(p).unwrap()),
            "not a regular file",
        ),
        (
            "a symlink",
            Box::new(|p: &Path| {
                let target = t.path().join("elsewhere");
                write_0600(&target, &good);
                symlink(&target, p).unwrap();
            }),
            "symbolic link",
        ),
        (
            "short",
            Box::new(|p: &Path| write_0600(p, "abc\n")),
            "holds 4 bytes",
        ),
        (
            "long",
            Box::new(|p: &Path| write_0600(p, &format!("{good}{good}"))),
            "holds 90 bytes",
        ),
        (
            "not base64",
            Box::new(|p: &Path| write_0600(p, &format!("{}\n", "!".repeat(44)))),
            "not base64",
        ),
    ];
    for (name, setup, expect) in cases {
        let _ = fs::remove_file(&path);
        let _ = fs::remove_dir(&path);
        setup(&path);
        let before = fs::symlink_metadata(&path).unwrap();
        let err = k.load_or_create("wg0.key").unwrap_err();
        assert!(matches!(err, Error::BadFile { .. }), "{name}: {err}");
        assert!(err.to_string().contains(expect), "{name}: {err}");
        assert!(err.to_string().contains("wg0.key"), "{name}: {err}");
        let after = fs::symlink_metadata(&path).unwrap();
        assert_eq!(before.ino(), after.ino(), "{name}: file replaced");
    }
}

/// A link planted at the key's name, at the previous key's name or at the directory's is
/// refused, and nothing is written where it points, even when that is nothing yet.
#[test]
fn planted_links_are_refused_and_never_written_through() {
    let (t, k) = dir();
    fs::create_dir_all(&k.dir).unwrap();
    let target = t.path().join("target");
    symlink(&target, k.dir.join("wg0.key")).unwrap();
    let err = k.load_or_create("wg0.key").unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(!target.exists(), "written through the link");
    assert!(
        fs::symlink_metadata(k.dir.join("wg0.key"))
            .unwrap()
            .is_symlink()
    );

    fs::remove_file(k.dir.join("wg0.key")).unwrap();
    let old = k.load_or_create("wg0.key").unwrap();
    symlink(&target, k.dir.join("wg0.key.previous")).unwrap();
    assert!(matches!(
        k.rotate("wg0.key"),
        Err(Error::RotationPending { .. })
    ));
    let err = previous(&k, "wg0.key").unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(k.forget_previous("wg0.key").is_err());
    assert!(!target.exists(), "written through the link");
    assert_eq!(k.load_or_create("wg0.key").unwrap(), old);

    let real = t.path().join("real");
    fs::create_dir(&real).unwrap();
    let linked = KeyDir::new(t.path().join("linked"), k.owner);
    symlink(&real, &linked.dir).unwrap();
    for result in [
        linked.load_or_create("wg0.key").map(drop),
        linked.rotate("wg0.key").map(drop),
        previous(&linked, "wg0.key").map(drop),
        linked.forget_previous("wg0.key"),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, Error::BadDir { .. }), "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }
    assert!(
        names(&real).is_empty(),
        "written through the linked directory"
    );
}

#[test]
fn unsafe_directory_is_refused() {
    let (t, k) = dir();
    fs::create_dir(&k.dir).unwrap();
    fs::set_permissions(&k.dir, fs::Permissions::from_mode(0o777)).unwrap();
    let err = k.load_or_create("wg0.key").unwrap_err();
    assert!(
        matches!(err, Error::BadDir { .. }) && err.to_string().contains("0777"),
        "{err}"
    );
    assert!(!k.dir.join("wg0.key").exists());
    let file = t.path().join("file");
    fs::write(&file, "").unwrap();
    let err = KeyDir::new(&file, k.owner)
        .load_or_create("wg0.key")
        .unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    let real = t.path().join("real");
    fs::create_dir(&real).unwrap();
    let other = KeyDir::new(real, k.owner + 1);
    assert!(
        other
            .load_or_create("wg0.key")
            .unwrap_err()
            .to_string()
            .contains("owned by uid")
    );
}

#[test]
fn wrong_owner_is_refused() {
    let (_t, k) = dir();
    k.load_or_create("wg0.key").unwrap();
    let path = k.dir.join("wg0.key");
    // Giving the file away needs root (the suite runs as root); as another user the
    // directory-owner case in `unsafe_directory_is_refused` covers the rule.
    if std::os::unix::fs::chown(&path, Some(k.owner + 1), None).is_err() {
        return;
    }
    let err = k.load_or_create("wg0.key").unwrap_err();
    assert!(matches!(err, Error::BadFile { .. }), "{err}");
    assert!(err.to_string().contains("owned by uid"), "{err}");
}

#[test]
fn names_must_be_plain() {
    let (_t, k) = dir();
    for name in ["", ".", "..", "a/b", ".hidden"] {
        assert!(
            matches!(k.load_or_create(name), Err(Error::BadName { .. })),
            "{name:?}"
        );
    }
}

#[test]
fn rotation_keeps_previous_until_forgotten() {
    let (_t, k) = dir();
    assert!(matches!(
        k.rotate("wg0.key"),
        Err(Error::NothingToRotate { .. })
    ));
    let old = k.load_or_create("wg0.key").unwrap();
    let r = k.rotate("wg0.key").unwrap();
    assert_eq!(r.previous, old.public_key());
    assert_ne!(r.new, old);
    assert_eq!(k.load_or_create("wg0.key").unwrap(), r.new);
    assert_eq!(previous(&k, "wg0.key").unwrap(), Some(old));
    let meta = fs::symlink_metadata(k.dir.join("wg0.key.previous")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(names(&k.dir), ["wg0.key", "wg0.key.previous"]);
    assert!(matches!(
        k.rotate("wg0.key"),
        Err(Error::RotationPending { .. })
    ));
    k.forget_previous("wg0.key").unwrap();
    assert_eq!(previous(&k, "wg0.key").unwrap(), None);
    k.forget_previous("wg0.key").unwrap();
    assert!(k.rotate("wg0.key").is_ok());
}
