//! Statistics and units shared by the benchmarks (each bench target includes
//! this module; not every target uses every helper).

#![allow(dead_code)]

use std::time::Duration;

/// The sample at `fraction` (0.5 = the median) of `samples`, in any order.
pub fn percentile(samples: &[Duration], fraction: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * fraction).round() as usize]
}

/// The median of `samples`.
pub fn median(samples: &[Duration]) -> Duration {
    percentile(samples, 0.5)
}

/// The fastest of `samples` (zero when there are none).
pub fn fastest(samples: &[Duration]) -> Duration {
    samples.iter().copied().min().unwrap_or_default()
}

/// Microseconds, for printing.
pub fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// Milliseconds, for printing.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// A size from the environment, or `default`.
pub fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}
