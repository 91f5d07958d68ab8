//! [`Backoff`]: the one exponential backoff every retry loop in herald uses (the watch client's
//! resubscribe, the gateway's upstream reconnect and relay resubscribe, the k8s watcher's
//! reconnect, the watch sink's delivery retries).
//!
//! It is pure: no clock, no sleeping. A caller asks for the next delay, sleeps it itself, and
//! tells the backoff how long a run lasted ([`Backoff::ran_for`]) so that a healthy run starts
//! the sequence over. That keeps every retry loop's timing testable without time passing.

use std::time::Duration;

/// Delays of `base × 2ⁿ`, capped at `max`, where `n` counts the failures since the last
/// reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    /// A run at least this long resets the sequence (see [`Backoff::ran_for`]).
    healthy: Duration,
    failures: u32,
}

impl Backoff {
    /// Starts at `base`, doubles per failure, never exceeds `max`. Without
    /// [`Backoff::reset_after`], only [`Backoff::reset`] starts it over.
    pub const fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max,
            healthy: Duration::MAX,
            failures: 0,
        }
    }

    /// A run that lasted `healthy` or longer resets the sequence.
    pub const fn reset_after(mut self, healthy: Duration) -> Backoff {
        self.healthy = healthy;
        self
    }

    /// The delay before attempt `n` (0-based) of a sequence: `base × 2ⁿ`, at most `max`.
    /// Saturates instead of overflowing, whatever `n`.
    pub fn delay(&self, n: u32) -> Duration {
        // 2³¹ still fits a u32; past it the delay is astronomically long anyway.
        self.base
            .saturating_mul(2u32.saturating_pow(n.min(31)))
            .min(self.max)
    }

    /// The delay to wait now, after one more failure; the next one doubles.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.delay(self.failures);
        self.failures = self.failures.saturating_add(1);
        d
    }

    /// Starts the sequence over: the next delay is `base` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Records how long the last run (a connection, a subscription, a watch stream) lasted: a
    /// healthy one resets the sequence, a short one (a crash loop) keeps it growing.
    pub fn ran_for(&mut self, ran: Duration) {
        if ran >= self.healthy {
            self.reset();
        }
    }

    /// Failures since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn take(b: &mut Backoff, n: usize) -> Vec<Duration> {
        (0..n).map(|_| b.next_delay()).collect()
    }

    #[test]
    fn doubles_from_base_up_to_max() {
        let mut b = Backoff::new(MS(250), Duration::from_secs(30));
        assert_eq!(
            take(&mut b, 9),
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000].map(MS)
        );
        assert_eq!(b.failures(), 9);
    }

    #[test]
    fn the_watch_clients_resubscribe_sequence() {
        // 1, 2, 4, 8, 16 s (no cap), as `WatchConfig::default` promises.
        let mut b = Backoff::new(Duration::from_secs(1), Duration::MAX);
        assert_eq!(take(&mut b, 5), [1, 2, 4, 8, 16].map(Duration::from_secs));
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::new(MS(200), Duration::from_secs(30));
        take(&mut b, 4);
        b.reset();
        assert_eq!(b.failures(), 0);
        assert_eq!(take(&mut b, 2), [MS(200), MS(400)]);
    }

    #[test]
    fn a_healthy_run_resets_and_a_short_one_does_not() {
        let mut b = Backoff::new(MS(250), Duration::from_secs(30)).reset_after(MS(10_000));
        take(&mut b, 3);
        b.ran_for(MS(9_999));
        assert_eq!(b.next_delay(), MS(2000), "a short run keeps it growing");
        b.ran_for(MS(10_000));
        assert_eq!(b.next_delay(), MS(250), "a healthy run starts it over");
    }

    #[test]
    fn without_reset_after_no_run_resets() {
        let mut b = Backoff::new(MS(1), MS(100));
        take(&mut b, 3);
        b.ran_for(Duration::from_secs(86_400));
        assert_eq!(b.next_delay(), MS(8));
    }

    #[test]
    fn huge_counts_saturate_instead_of_panicking() {
        let b = Backoff::new(Duration::from_secs(3600), Duration::MAX);
        assert!(b.delay(u32::MAX) >= b.delay(31));
        let capped = Backoff::new(MS(250), Duration::from_secs(30));
        assert_eq!(capped.delay(u32::MAX), Duration::from_secs(30));
        let mut b = Backoff::new(MS(1), MS(2));
        b.failures = u32::MAX;
        assert_eq!(b.next_delay(), MS(2));
        assert_eq!(b.failures(), u32::MAX);
    }
}
