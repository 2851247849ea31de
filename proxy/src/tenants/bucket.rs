//! A tenant's token-rate limit as a bucket: it holds one minute's worth of tokens, refills
//! continuously, lets a request in while it is not empty, and is charged each request's
//! generated tokens when they are counted. Plain arithmetic over the instants it is given,
//! so its behaviour is tested without waiting.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct TokenBucket {
    /// The tenant's whole rate, a minute's worth.
    whole: f64,
    /// The replicas it is split over: this bucket holds `whole / parts`.
    parts: u32,
    level: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket for `per_minute` tokens a minute, held whole.
    pub fn new(per_minute: f64, now: Instant) -> Self {
        TokenBucket { whole: per_minute, parts: 1, level: per_minute, at: now }
    }

    /// What it holds at most: this replica's part of a minute's worth.
    fn capacity(&self) -> f64 {
        self.whole / f64::from(self.parts)
    }

    /// What it earns a second.
    fn per_second(&self) -> f64 {
        self.capacity() / 60.0
    }

    /// Holds this replica's part of the rate from `now` on: `1 / parts` of it (at least
    /// one part). What was earned at the old rate stays, up to the new capacity; a
    /// bucket with fewer parts refills at its larger rate from here.
    pub fn split(&mut self, parts: u32, now: Instant) {
        let parts = parts.max(1);
        if parts == self.parts {
            return;
        }
        self.refill(now);
        self.parts = parts;
        self.level = self.level.min(self.capacity());
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.per_second()).min(self.capacity());
        self.at = self.at.max(now);
    }

    /// Whether a request may start now; if not, how long until the bucket is above zero.
    pub fn admit(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.level > 0.0 {
            return Ok(());
        }
        Err(Duration::from_secs_f64((-self.level + 1.0) / self.per_second()))
    }

    /// Charges `tokens` generated.
    pub fn spend(&mut self, tokens: u64, now: Instant) {
        self.refill(now);
        self.level -= tokens as f64;
    }

    /// Tokens in the bucket now (negative: owed).
    pub fn level(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_requests_in_until_it_is_spent_then_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(600.0, t0); // 10 tokens a second
        assert!(b.admit(t0).is_ok());
        b.spend(500, t0);
        assert!(b.admit(t0).is_ok(), "100 left");
        b.spend(300, t0); // owes 200
        let wait = b.admit(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 20.1).abs() < 1e-6, "{wait:?}: 201 tokens at 10/s");
        assert!(b.admit(t0 + Duration::from_secs(20)).is_err(), "still at 0");
        assert!(b.admit(t0 + Duration::from_millis(20_200)).is_ok());
        // It never holds more than a minute's worth, however long it rests.
        assert!((b.level(t0 + Duration::from_secs(3600)) - 600.0).abs() < 1e-9);
    }

    #[test]
    fn a_bucket_split_over_more_replicas_holds_and_earns_their_part_and_whole_again_when_they_go() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(600.0, t0);
        b.split(3, t0);
        assert!((b.level(t0) - 200.0).abs() < 1e-9, "a third of a minute's worth");
        b.spend(200, t0);
        assert!(b.admit(t0).is_err());
        // A third of 10 tokens a second.
        assert!((b.level(t0 + Duration::from_secs(30)) - 100.0).abs() < 1e-9);
        assert!((b.level(t0 + Duration::from_secs(3600)) - 200.0).abs() < 1e-9);
        // The others went: the whole rate from then on, what it held kept.
        let t1 = t0 + Duration::from_secs(3600);
        b.split(1, t1);
        assert!((b.level(t1) - 200.0).abs() < 1e-9);
        assert!((b.level(t1 + Duration::from_secs(10)) - 300.0).abs() < 1e-9);
        b.split(0, t1 + Duration::from_secs(10));
        assert!((b.level(t1 + Duration::from_secs(100)) - 600.0).abs() < 1e-9, "no parts reads as one");
    }

    #[test]
    fn an_instant_before_the_last_one_does_not_drain_it() {
        let t0 = Instant::now() + Duration::from_secs(5);
        let mut b = TokenBucket::new(60.0, t0);
        b.spend(30, t0);
        assert!((b.level(t0 - Duration::from_secs(5)) - 30.0).abs() < 1e-9);
    }
}
