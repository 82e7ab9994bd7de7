//! The daemon's decisions, pure so they are tested without root: whether the device it serves
//! is still the one it attached to, how long to wait before attaching again, and what to do
//! with a socket file found where its own goes.

use std::io::ErrorKind;
use std::time::Duration;

/// What the watch over the attached device concludes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// Same link, same index: nothing to do.
    Same,
    /// The link is gone (`ip link del`): make it again and attach a fresh device.
    Gone,
    /// A link of that name with another index (deleted and made again by someone): attach anew.
    Replaced { now: u32 },
}

/// Compares the index attached to with the index the name has now (`None`: no such link).
pub fn device(attached: u32, now: Option<u32>) -> Device {
    match now {
        None => Device::Gone,
        Some(now) if now != attached => Device::Replaced { now },
        Some(_) => Device::Same,
    }
}

/// The shortest life of one attachment before the next is made at once: a device that fails
/// again sooner than this (gotatun stopping with a fatal error at every start) is attached
/// again only after this much time, so the loop never spins.
pub const MIN_ATTACHMENT: Duration = Duration::from_secs(1);

/// How long to wait before attaching again, after an attachment that lasted `lasted`.
pub fn pause_before_reattach(lasted: Duration) -> Duration {
    MIN_ATTACHMENT.saturating_sub(lasted)
}

/// What to do with the socket path before binding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Socket {
    /// Nothing there: bind.
    Bind,
    /// A socket file nobody answers on (a dead instance's): remove it, then bind.
    ReplaceStale,
    /// Something answers on it: another sticky-wg serves this device. Refuse to start.
    Refuse,
}

/// Decides from a connect attempt to the path: `Ok` when something accepted the connection,
/// else the error's kind.
pub fn socket(connect: Result<(), ErrorKind>) -> Socket {
    match connect {
        Ok(()) => Socket::Refuse,
        Err(ErrorKind::NotFound) => Socket::Bind,
        // ECONNREFUSED: a socket file with no listener. Anything else (a regular file, a
        // directory) is not a live daemon either; bind's own error will say if it is in the way.
        Err(_) => Socket::ReplaceStale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_is_attached_again_when_its_link_is_gone_or_has_a_new_index() {
        assert_eq!(device(7, Some(7)), Device::Same);
        assert_eq!(device(7, None), Device::Gone);
        assert_eq!(device(7, Some(9)), Device::Replaced { now: 9 });
    }

    #[test]
    fn a_short_lived_attachment_waits_out_the_rest_of_a_second_and_a_long_one_not_at_all() {
        assert_eq!(pause_before_reattach(Duration::ZERO), MIN_ATTACHMENT);
        assert_eq!(
            pause_before_reattach(Duration::from_millis(300)),
            Duration::from_millis(700)
        );
        assert_eq!(
            pause_before_reattach(Duration::from_secs(3600)),
            Duration::ZERO
        );
    }

    #[test]
    fn a_socket_someone_answers_on_is_refused_and_a_dead_one_replaced() {
        assert_eq!(socket(Ok(())), Socket::Refuse);
        assert_eq!(socket(Err(ErrorKind::NotFound)), Socket::Bind);
        assert_eq!(
            socket(Err(ErrorKind::ConnectionRefused)),
            Socket::ReplaceStale
        );
    }
}
