//! Sysctls, written through `/proc/sys` (which shows the namespace of the calling thread).

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sysctl key {0:?} is invalid: expected slash-separated names like net/ipv4/ip_forward")]
    BadKey(String),
    #[error("setting sysctl {path} to {value:?}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("reading sysctl {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// `/proc/sys/<key>`, refusing keys that could climb out of `/proc/sys`.
pub fn path(key: &str) -> Result<PathBuf, Error> {
    let ok = !key.is_empty()
        && key
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if ok {
        Ok(PathBuf::from("/proc/sys").join(key))
    } else {
        Err(Error::BadKey(key.to_string()))
    }
}

pub fn read(key: &str) -> Result<String, Error> {
    let path = path(key)?;
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|source| Error::Read { path, source })
}

/// Writes `value` unless it is already set (so a read-only `/proc/sys` is fine when nothing
/// needs to change).
pub fn write(key: &str, value: &str) -> Result<(), Error> {
    if read(key).is_ok_and(|current| current == value) {
        return Ok(());
    }
    let path = path(key)?;
    std::fs::write(&path, value).map_err(|source| Error::Write {
        path,
        value: value.to_string(),
        source,
    })
}

/// [`write`], when the key exists. A device's key is missing when the kernel keeps no such
/// settings for it: `net/ipv6/conf/<device>/...` on a kernel without IPv6, or for a device
/// whose MTU is below IPv6's minimum (1280).
pub fn write_if_present(key: &str, value: &str) -> Result<(), Error> {
    if path(key)?.exists() {
        write(key, value)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_under_proc_sys() {
        assert_eq!(
            path("net/ipv4/ip_forward").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/ip_forward")
        );
        for bad in ["", "../etc/passwd", "net//x", "net/./x", "/net/x", "net/x/"] {
            assert!(path(bad).is_err(), "{bad}");
        }
    }
}
