//! Exponential backoff with jitter, shared by the watcher (reconnects) and the work
//! queue (per-key retries).

use std::time::{Duration, Instant};

use rand::Rng;

/// Exponential backoff parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// First delay.
    pub min: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Growth per attempt.
    pub factor: f64,
    /// Random spread added to each delay, as a fraction of it (0.0 – 1.0).
    pub jitter: f64,
    /// A run this long without errors starts the next failure from `min` again.
    pub reset_after: Duration,
}

impl Backoff {
    /// client-go's watch reconnect parameters: 800 ms → 30 s, ×2, jitter, reset after
    /// 120 s healthy.
    pub const WATCH: Backoff = Backoff {
        min: Duration::from_millis(800),
        max: Duration::from_secs(30),
        factor: 2.0,
        jitter: 0.2,
        reset_after: Duration::from_secs(120),
    };

    /// Per-key reconcile retries: 1 s → 5 min, ×2, jitter.
    pub const RECONCILE: Backoff = Backoff {
        min: Duration::from_secs(1),
        max: Duration::from_secs(300),
        factor: 2.0,
        jitter: 0.1,
        reset_after: Duration::from_secs(300),
    };

    /// The delay before retry number `attempt` (1-based), without jitter.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(64) as i32;
        let secs = self.min.as_secs_f64() * self.factor.powi(exp);
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The delay before retry number `attempt` (1-based), with jitter, never above `max`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.base_delay(attempt);
        if self.jitter <= 0.0 {
            return base;
        }
        let spread = base.as_secs_f64() * self.jitter.min(1.0);
        let extra = rand::thread_rng().gen_range(0.0..=spread);
        Duration::from_secs_f64(base.as_secs_f64() + extra).min(self.max)
    }
}

/// A running backoff: counts consecutive failures, resets after a healthy period.
#[derive(Debug)]
pub(crate) struct BackoffState {
    params: Backoff,
    attempt: u32,
    healthy_since: Option<Instant>,
}

impl BackoffState {
    pub(crate) fn new(params: Backoff) -> Self {
        Self {
            params,
            attempt: 0,
            healthy_since: None,
        }
    }

    /// Things work again (a list or watch succeeded).
    pub(crate) fn healthy(&mut self) {
        if self.healthy_since.is_none() {
            self.healthy_since = Some(Instant::now());
        }
    }

    /// A failure: the delay to wait before the next try.
    pub(crate) fn failure(&mut self) -> Duration {
        if let Some(since) = self.healthy_since.take() {
            if since.elapsed() >= self.params.reset_after {
                self.attempt = 0;
            }
        }
        self.attempt = self.attempt.saturating_add(1);
        self.params.delay(self.attempt)
    }

    pub(crate) fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_caps_and_jitters_within_bounds() {
        let b = Backoff::WATCH;
        assert_eq!(b.base_delay(1), Duration::from_millis(800));
        assert_eq!(b.base_delay(2), Duration::from_millis(1600));
        assert_eq!(b.base_delay(10), Duration::from_secs(30));
        assert_eq!(b.base_delay(1000), Duration::from_secs(30));
        for a in 1..20 {
            let d = b.delay(a);
            assert!(d >= b.base_delay(a) && d <= b.max, "{a}: {d:?}");
        }
    }

    #[test]
    fn state_resets_after_healthy_period() {
        let mut s = BackoffState::new(Backoff {
            reset_after: Duration::ZERO,
            jitter: 0.0,
            ..Backoff::WATCH
        });
        assert_eq!(s.failure(), Duration::from_millis(800));
        assert_eq!(s.failure(), Duration::from_millis(1600));
        s.healthy();
        assert_eq!(s.failure(), Duration::from_millis(800));
    }
}
