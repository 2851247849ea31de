//! A silence of some length on a stream: the upstream's (its idle timeout) and the
//! client's (its heartbeat). What was heard is noted in place; the timer is moved only
//! when it fires early, never per chunk: moving a tokio timer takes its driver's lock,
//! which on a busy stream would cost more than the rest of a chunk's relaying.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

pub(crate) struct Silence {
    timer: Pin<Box<Sleep>>,
    last_heard: Instant,
    length: Duration,
}

impl Silence {
    /// A silence of `length`, counted from now.
    pub(crate) fn new(length: Duration) -> Self {
        let now = Instant::now();
        Silence { timer: Box::pin(tokio::time::sleep_until(now + length)), last_heard: now, length }
    }

    pub(crate) fn length(&self) -> Duration {
        self.length
    }

    /// Something was heard at `at`: the silence counts from there.
    pub(crate) fn heard(&mut self, at: Instant) {
        self.last_heard = at;
    }

    /// Ready once nothing has been heard for the length; the task is woken then.
    pub(crate) fn poll_over(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let over_at = self.last_heard + self.length;
            if over_at <= self.timer.deadline() {
                return Poll::Ready(());
            }
            // Heard since the timer was set: it waits again, and is polled to say so.
            self.timer.as_mut().reset(over_at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_silence_is_over_only_its_length_after_it_was_last_heard() {
        let length = Duration::from_millis(60);
        let mut silence = Silence::new(length);
        tokio::time::sleep(Duration::from_millis(30)).await;
        let heard = Instant::now();
        silence.heard(heard);
        // The timer set at the start fires first; the silence then waits again.
        std::future::poll_fn(|cx| silence.poll_over(cx)).await;
        assert!(heard.elapsed() >= length, "over {:?} after it was last heard", heard.elapsed());

        let mut silence = Silence::new(Duration::from_secs(30));
        silence.heard(Instant::now());
        let now = std::future::poll_fn(|cx| Poll::Ready(silence.poll_over(cx))).await;
        assert!(now.is_pending(), "just heard");
    }
}
