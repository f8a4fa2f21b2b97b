//! The lease as the init keeps it: `deadline = last renewal + TTL`, fenced by
//! epoch, on `CLOCK_BOOTTIME`.
//!
//! `CLOCK_BOOTTIME` keeps counting while the machine is suspended (where
//! `CLOCK_MONOTONIC` stops), so a suspend longer than the TTL means a lapsed
//! lease on resume: the unit ends, never half-alive. A host that is stopped
//! (SIGSTOP), hung or dead is the same to the init: no renewal, lapse. There is
//! no grace period after resume; the host renews every TTL/3, so a suspend
//! shorter than two thirds of the TTL is survived.
//!
//! A lapse is final: a renewal that arrives after the deadline is refused even
//! if the init has not yet acted on the lapse.

use std::time::Duration;

/// The longest lease a renewal may set; longer asks are cut to it (a unit
/// must not outlive a dead host by more than a day, whatever the host said).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Why a renewal was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RenewError {
    /// The renewal's epoch is below the highest accepted: a fenced-off host.
    #[error("renewal from epoch {epoch} refused: epoch {current} has taken over")]
    Stale {
        /// The renewal's epoch.
        epoch: u64,
        /// The highest epoch accepted.
        current: u64,
    },
    /// The deadline had passed before the renewal arrived.
    #[error("renewal refused: the lease had already lapsed")]
    Lapsed,
}

/// A lease on a timeline of [`boottime_now`] readings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    deadline: Duration,
    epoch: u64,
}

impl Lease {
    /// A lease of `ttl` from `now`, at epoch 0 (any host's first renewal is
    /// accepted).
    pub fn new(now: Duration, ttl: Duration) -> Self {
        Self {
            deadline: now + ttl.min(MAX_TTL),
            epoch: 0,
        }
    }

    /// Re-arms the lease to `now + ttl` for a host at `epoch`; returns the time
    /// left. Equal epochs are accepted (one host renewing again), lower ones
    /// are not.
    pub fn renew(
        &mut self,
        now: Duration,
        ttl: Duration,
        epoch: u64,
    ) -> Result<Duration, RenewError> {
        if self.has_lapsed(now) {
            return Err(RenewError::Lapsed);
        }
        if epoch < self.epoch {
            return Err(RenewError::Stale {
                epoch,
                current: self.epoch,
            });
        }
        self.epoch = epoch;
        let ttl = ttl.min(MAX_TTL);
        self.deadline = now + ttl;
        Ok(ttl)
    }

    /// Time left at `now` (zero once lapsed).
    pub fn remaining(&self, now: Duration) -> Duration {
        self.deadline.saturating_sub(now)
    }

    /// Whether the deadline has passed at `now`.
    pub fn has_lapsed(&self, now: Duration) -> bool {
        now >= self.deadline
    }

    /// The highest epoch accepted.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// Now on `CLOCK_BOOTTIME` (time since boot, suspend included).
pub fn boottime_now() -> Duration {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(now) => Duration::new(
            now.tv_sec().unsigned_abs(),
            now.tv_nsec().unsigned_abs() as u32,
        ),
        // CLOCK_BOOTTIME exists on every Linux since 2.6.39; should it fail,
        // the monotonic clock is the nearest honest substitute.
        Err(_) => match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
            Ok(now) => Duration::new(
                now.tv_sec().unsigned_abs(),
                now.tv_nsec().unsigned_abs() as u32,
            ),
            Err(_) => unreachable!("CLOCK_MONOTONIC is always available on Linux"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    #[test]
    fn a_renewal_rearms_the_deadline_from_now() {
        let mut lease = Lease::new(secs(100), secs(30));
        assert_eq!(lease.remaining(secs(110)), secs(20));
        assert_eq!(lease.renew(secs(120), secs(30), 1), Ok(secs(30)));
        assert_eq!(lease.remaining(secs(140)), secs(10));
        assert!(!lease.has_lapsed(secs(149)));
        assert!(lease.has_lapsed(secs(150)));
        assert_eq!(lease.remaining(secs(151)), Duration::ZERO);
    }

    #[test]
    fn renewals_from_a_lower_epoch_are_fenced_off() {
        let mut lease = Lease::new(secs(0), secs(30));
        assert_eq!(lease.renew(secs(1), secs(30), 3), Ok(secs(30)));
        assert_eq!(
            lease.renew(secs(2), secs(30), 3),
            Ok(secs(30)),
            "same host again"
        );
        assert_eq!(
            lease.renew(secs(3), secs(30), 2),
            Err(RenewError::Stale {
                epoch: 2,
                current: 3
            })
        );
        assert_eq!(
            lease.remaining(secs(3)),
            secs(29),
            "a refused renewal changes nothing"
        );
        assert_eq!(lease.renew(secs(4), secs(30), 4), Ok(secs(30)));
        assert_eq!(lease.epoch(), 4);
        assert_eq!(
            lease.renew(secs(5), secs(30), 3),
            Err(RenewError::Stale {
                epoch: 3,
                current: 4
            })
        );
    }

    #[test]
    fn a_lapse_is_final() {
        let mut lease = Lease::new(secs(0), secs(30));
        assert_eq!(lease.renew(secs(30), secs(30), 1), Err(RenewError::Lapsed));
        assert!(lease.has_lapsed(secs(30)));
    }

    #[test]
    fn a_lease_is_never_longer_than_a_day() {
        let mut lease = Lease::new(secs(0), Duration::MAX);
        assert_eq!(lease.remaining(secs(0)), MAX_TTL);
        assert_eq!(lease.renew(secs(1), Duration::MAX, 1), Ok(MAX_TTL));
    }

    #[test]
    fn boottime_moves_forward() {
        let before = boottime_now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(boottime_now() >= before + Duration::from_millis(5));
    }
}
