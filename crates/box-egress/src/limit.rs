//! The bandwidth cap: a token bucket shared by every connection of a unit.
//!
//! A sender takes tokens for what it is about to write and may run the bucket into
//! debt; it then sleeps until the debt would be repaid at the rate. Concurrent senders
//! queue behind each other's debt, so their sum stays at the rate however many
//! connections share the bucket. The bucket holds at most one second of tokens.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One direction's cap for one unit.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    bytes_per_second: f64,
    state: Mutex<State>,
    /// Nanoseconds senders waited on this cap, added up (shared with the
    /// unit's other direction and read by whoever reports the unit's limits).
    throttled: Arc<AtomicU64>,
}

/// The bucket's level; pure arithmetic, so the pacing is tested without a clock.
#[derive(Debug)]
struct State {
    /// Negative when senders are in debt.
    tokens: f64,
    refilled: Instant,
}

impl State {
    /// Take `bytes` at `now`; how long the sender must wait before writing them.
    fn take(&mut self, now: Instant, bytes: usize, bytes_per_second: f64) -> Duration {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * bytes_per_second).min(bytes_per_second);
        self.refilled = now;
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / bytes_per_second)
        }
    }
}

impl TokenBucket {
    pub(crate) fn new(bytes_per_second: NonZeroU64, throttled: Arc<AtomicU64>) -> Self {
        let rate = bytes_per_second.get() as f64;
        Self {
            bytes_per_second: rate,
            throttled,
            state: Mutex::new(State {
                tokens: rate,
                refilled: Instant::now(),
            }),
        }
    }

    /// How much to read at once under this cap: an eighth of a second's worth, between
    /// 1 KiB and 64 KiB, so a slow cap paces smoothly and a fast one copies in bulk.
    pub(crate) fn chunk(&self) -> usize {
        ((self.bytes_per_second / 8.0) as usize).clamp(1024, 64 * 1024)
    }

    /// Take `bytes` tokens, waiting as long as the cap requires.
    pub(crate) async fn take(&self, bytes: usize) {
        let wait = {
            // Nothing awaits under this lock; a poisoned lock only means another sender
            // panicked mid-update, and the level is still usable.
            let mut state = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state.take(Instant::now(), bytes, self.bytes_per_second)
        };
        if !wait.is_zero() {
            let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            self.throttled.fetch_add(nanos, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Senders that each write `writes` times `bytes` as fast as the bucket lets them;
    /// the simulated seconds until the last one is done.
    fn simulate(rate: f64, senders: usize, writes: usize, bytes: usize) -> f64 {
        let start = Instant::now();
        let mut state = State {
            tokens: rate,
            refilled: start,
        };
        let mut ready = vec![start; senders];
        let mut left = vec![writes; senders];
        while let Some(sender) = (0..senders)
            .filter(|&s| left[s] > 0)
            .min_by_key(|&s| ready[s])
        {
            let wait = state.take(ready[sender], bytes, rate);
            ready[sender] += wait;
            left[sender] -= 1;
        }
        ready
            .iter()
            .max()
            .map_or(0.0, |end| end.duration_since(start).as_secs_f64())
    }

    #[test]
    fn one_second_of_burst_then_the_rate() {
        // 1000 bytes free, then 3000 at 1000 a second.
        let elapsed = simulate(1000.0, 1, 1 + 10, 364);
        assert!((2.9..3.1).contains(&elapsed), "{elapsed}");
        assert_eq!(simulate(1000.0, 1, 1, 1000), 0.0);
    }

    #[test]
    fn concurrent_senders_share_the_rate() {
        // 40 000 bytes at 10 000 a second, the first 10 000 free.
        let elapsed = simulate(10_000.0, 4, 10, 1000);
        assert!((2.9..3.1).contains(&elapsed), "{elapsed}");
    }

    #[test]
    fn an_idle_bucket_refills_to_one_second_only() {
        let start = Instant::now();
        let mut state = State {
            tokens: 0.0,
            refilled: start,
        };
        let later = start + Duration::from_secs(10);
        assert_eq!(state.take(later, 1000, 1000.0), Duration::ZERO);
        assert_eq!(state.take(later, 500, 1000.0), Duration::from_millis(500));
    }

    #[test]
    fn reads_are_sized_to_the_cap() {
        let bucket = |rate| TokenBucket::new(NonZeroU64::new(rate).unwrap(), Arc::default());
        assert_eq!(bucket(1000).chunk(), 1024);
        assert_eq!(bucket(80 * 1024).chunk(), 10 * 1024);
        assert_eq!(bucket(100 << 20).chunk(), 64 * 1024);
    }
}
