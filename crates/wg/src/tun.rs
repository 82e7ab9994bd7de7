//! The persistent TUN device: made once with the kernel's TUN ioctls, so the link and what the
//! agent puts on it (MTU, addresses, routes) outlive any one sticky-wg. The only `unsafe` of
//! the crate is here.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

/// Where the kernel's TUN driver is opened.
const CLONE_DEVICE: &str = "/dev/net/tun";

/// A TUN ioctl that failed, or a name the kernel cannot take.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{name:?} is not a valid interface name (1 to 15 bytes, no '/', no NUL)")]
    BadName { name: String },
    #[error("opening {CLONE_DEVICE}: {source}")]
    Open { source: io::Error },
    #[error(
        "attaching to TUN {name:?} (TUNSETIFF, IFF_TUN|IFF_NO_PI): {source} \
         (busy: another process holds it; invalid: a link of that name that is not such a TUN)"
    )]
    Attach { name: String, source: io::Error },
    #[error("making TUN {name:?} persistent (TUNSETPERSIST): {source}")]
    Persist { name: String, source: io::Error },
}

/// Checks an interface name as the kernel does (IFNAMSIZ is 16 with the NUL).
pub fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace());
    if ok {
        Ok(())
    } else {
        Err(Error::BadName {
            name: name.to_string(),
        })
    }
}

/// Makes `name` a persistent TUN (layer 3, no packet information header) when it is absent;
/// when it exists as such a TUN this only attaches and detaches again. The file descriptor is
/// closed before returning: gotatun opens its own by name.
pub fn ensure_persistent(name: &str) -> Result<(), Error> {
    check_name(name)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(CLONE_DEVICE)
        .map_err(|source| Error::Open { source })?;
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: the fd is open for the life of `file`; TUNSETIFF reads and writes one `ifreq`,
    // which `req` is, and the name is NUL-terminated (checked shorter than IFNAMSIZ, zeroed).
    if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
        return Err(Error::Attach {
            name: name.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: TUNSETPERSIST takes an integer argument (1 = persistent), no pointer.
    if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) } < 0 {
        return Err(Error::Persist {
            name: name.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The interface index of `name` in this network namespace, `None` when there is no such link.
pub fn index(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_kernel_refuses_are_refused_with_the_name_quoted() {
        assert!(check_name("stickywg0").is_ok());
        assert!(check_name("a23456789012345").is_ok());
        for bad in ["", "a234567890123456", "a/b", "a b", ".", ".."] {
            let err = check_name(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn a_missing_link_has_no_index() {
        assert_eq!(index("stickywg-none"), None);
        assert_eq!(index("lo"), Some(1));
    }
}
