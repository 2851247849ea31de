//! This replica's places at one engine, granted by the engine's hook
//! (`admission.places = "engine"`, `meridian_core::channel::places`, ADR 0013).
//!
//! Before a request is sent, admission claims a place for it; the place is the request's
//! until its in-flight guard drops, which gives it back. Every message to one engine
//! states this replica's whole holding, and they go one at a time (the holding's lock is
//! held across each round trip, in a task of its own, so a request that goes away
//! mid-claim does not cut a message short), so the engine's table always ends up with
//! the holding the replica last stated, whatever was lost on the way.
//!
//! After a refusal the engine counts as full here for [`RETRY_AFTER_REFUSAL`], or until
//! one of this replica's own places there frees: another replica's request ending shows
//! only at the engine, so a full engine is asked again at that pace while requests wait
//! for it. An engine whose hook cannot take claims (none configured, an older hook, a
//! wrong secret) leaves this replica to decide alone, by its reading and its part of the
//! limit, until a renewal is answered again; one that does not answer for a moment (a
//! timeout) counts as full, and only after [`FAILURES_BEFORE_ALONE`] in a row as absent.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use meridian_core::channel::{Claim, Granted};
use tokio::sync::Notify;

use super::Upstream;
use crate::hook::{HookChannel, HookError};

/// How long a refused engine counts as full before it is asked again. Short next to a
/// request's life (places free as requests end), long next to a claim's round trip, so a
/// full engine is asked at most a few dozen times a second by each replica while
/// requests wait for it.
pub const RETRY_AFTER_REFUSAL: Duration = Duration::from_millis(25);
/// How long the engine keeps this replica's places without a word from it: a replica
/// that died frees its places this long after its last message.
pub const LEASE: Duration = Duration::from_secs(5);
/// How often every holding is restated, well inside [`LEASE`].
pub const RENEW_EVERY: Duration = Duration::from_secs(1);
/// The longest a message about places waits for the hook's answer (at most the
/// channel's own `hook.timeout_s`): renewals to every engine fit inside [`LEASE`].
pub const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// Claims the hook does not answer in a row before this replica decides that engine's
/// room alone: a moment's fault holds requests back, a hook gone lets them go.
pub const FAILURES_BEFORE_ALONE: u32 = 3;

/// What every claim of this replica states besides its holding.
pub struct PlaceTerms {
    pub channel: HookChannel,
    /// This replica's name at the engines, unique among the replicas.
    pub holder: String,
    /// `admission.max_streams`.
    pub limit: u32,
}

impl std::fmt::Debug for PlaceTerms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The channel holds the secret.
        f.debug_struct("PlaceTerms").field("holder", &self.holder).field("limit", &self.limit).finish()
    }
}

impl PlaceTerms {
    fn claim(&self, held: u32, want: u32, turn: Turn) -> Claim {
        Claim {
            holder: self.holder.clone(),
            held,
            want,
            limit: self.limit,
            lease_s: LEASE.as_secs_f64(),
            waited_s: turn.waited.as_secs_f64(),
            class: turn.class,
        }
    }
}

/// Where a request asking for a place stands among the requests waiting at every replica:
/// its admission class (0 first) and how long it has waited so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Turn {
    pub class: u8,
    pub waited: Duration,
}

/// How a claim ended.
#[derive(Debug)]
pub enum Claimed {
    Granted,
    /// The engine's places are all held, or kept for requests that go first.
    Refused,
    /// Not asked: the engine refused the last claim, and another claim is asking it again
    /// now; this one waits as if refused with it.
    Behind,
    /// The hook did not answer. `alone`: it cannot take claims, or has not answered
    /// several in a row, so this replica decides alone for now; otherwise the engine
    /// counts as full for a moment, as after a refusal.
    Unanswered {
        error: HookError,
        alone: bool,
    },
}

/// This replica's places at one engine.
#[derive(Debug, Default)]
pub struct EnginePlaces {
    /// Places held; the lock also puts this replica's messages to the engine in order.
    held: tokio::sync::Mutex<u32>,
    /// Until when the engine counts as full after a refusal.
    full_until: Mutex<Option<Instant>>,
    /// This replica decides the engine's room alone (its hook takes no claims).
    alone: AtomicBool,
    /// Messages in a row the hook did not answer.
    failures: AtomicU32,
    /// The engine refused the last claim (and granted none since).
    refused: AtomicBool,
    /// A claim is asking an engine that refused the last one.
    probing: AtomicBool,
}

/// Marks a claim as the one asking a full engine again, until dropped.
struct Probe<'a>(&'a AtomicBool);

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl EnginePlaces {
    /// Claims one place at `upstream`'s hook at `addr`. While the engine's last answer
    /// was a refusal, one claim at a time asks it again; the others are
    /// [`Claimed::Behind`] (requests let through together would each be refused). The
    /// round trip runs in a task of its own: a request that goes away mid-claim leaves
    /// the message whole, and a place granted to it goes back at once. `wake` (the
    /// pool's capacity notice) is told when waiters may try the engine again.
    pub async fn claim(
        upstream: &Arc<Upstream>,
        addr: &str,
        terms: &Arc<PlaceTerms>,
        turn: Turn,
        wake: &Arc<Notify>,
    ) -> Claimed {
        let places = &upstream.places;
        let probe = match places.refused.load(Ordering::Acquire) {
            true if places.probing.swap(true, Ordering::AcqRel) => return Claimed::Behind,
            probe => probe,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (upstream, addr, terms, wake) =
            (Arc::clone(upstream), addr.to_owned(), Arc::clone(terms), Arc::clone(wake));
        tokio::spawn(async move {
            let places = &upstream.places;
            let _probe = probe.then(|| Probe(&places.probing));
            let mut held = places.held.lock().await;
            // A refusal that landed while this claim waited for its turn stands for it too.
            if !probe && places.refused.load(Ordering::Acquire) {
                let _ = tx.send(Claimed::Behind);
                return;
            }
            let answer = terms.channel.claim(&addr, &terms.claim(*held, 1, turn), ANSWER_WITHIN).await;
            let claimed = places.settle(answer, &mut held);
            match &claimed {
                Claimed::Refused | Claimed::Unanswered { alone: false, .. } => {
                    places.set_full_until(Some(Instant::now() + RETRY_AFTER_REFUSAL));
                    let wake = Arc::clone(&wake);
                    tokio::spawn(async move {
                        tokio::time::sleep(RETRY_AFTER_REFUSAL).await;
                        wake.notify_one();
                    });
                }
                // Waiters held back behind this claim may try the engine now.
                _ => wake.notify_one(),
            }
            if let Err(Claimed::Granted) = tx.send(claimed) {
                // Its request went away mid-claim: the place goes back.
                *held = held.saturating_sub(1);
                places.report(&terms, &addr, *held).await;
            }
        });
        rx.await.unwrap_or(Claimed::Behind)
    }

    /// What a claim's answer makes of the holding and of this engine's state.
    fn settle(&self, answer: Result<Granted, HookError>, held: &mut u32) -> Claimed {
        match answer {
            Ok(Granted { granted: true, .. }) => {
                *held += 1;
                self.answered();
                self.refused.store(false, Ordering::Release);
                Claimed::Granted
            }
            Ok(_) => {
                self.answered();
                self.refused.store(true, Ordering::Release);
                Claimed::Refused
            }
            Err(error) => Claimed::Unanswered { alone: self.unanswered_by(&error), error },
        }
    }

    /// Gives a place back and says so to the engine.
    pub async fn release(&self, terms: &PlaceTerms, addr: &str) {
        let mut held = self.held.lock().await;
        *held = held.saturating_sub(1);
        self.set_full_until(None);
        self.report(terms, addr, *held).await;
    }

    /// Restates the holding, so the lease stays (and an engine that missed a message
    /// learns the truth).
    pub async fn renew(&self, terms: &PlaceTerms, addr: &str) {
        let held = self.held.lock().await;
        self.report(terms, addr, *held).await;
    }

    async fn report(&self, terms: &PlaceTerms, addr: &str, held: u32) {
        match terms.channel.claim(addr, &terms.claim(held, 0, Turn::default()), ANSWER_WITHIN).await {
            Ok(_) => self.answered(),
            Err(error) => {
                tracing::debug!(engine = addr, %error, "places: holding not reported");
                self.unanswered_by(&error);
            }
        }
    }

    fn answered(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.alone.store(false, Ordering::Relaxed);
    }

    /// Counts a message the hook did not answer; whether this replica now decides alone:
    /// at once when the hook cannot take claims (it answered, with a refusal of the
    /// message itself), after [`FAILURES_BEFORE_ALONE`] in a row when it did not answer.
    fn unanswered_by(&self, error: &HookError) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let cannot = !matches!(error, HookError::Unreachable { .. });
        let alone = cannot || failures >= FAILURES_BEFORE_ALONE;
        if alone {
            self.alone.store(true, Ordering::Relaxed);
        }
        alone
    }

    /// Whether the engine counts as full here: a refusal still stands, or a claim is
    /// asking it again after one.
    pub fn held_back(&self) -> bool {
        self.probing.load(Ordering::Acquire)
            || self.full_until.lock().map(|g| g.is_some_and(|t| Instant::now() < t)).unwrap_or(false)
    }

    /// Whether this replica decides the engine's room alone (its hook takes no claims).
    pub fn alone(&self) -> bool {
        self.alone.load(Ordering::Relaxed)
    }

    fn set_full_until(&self, until: Option<Instant>) {
        if let Ok(mut g) = self.full_until.lock() {
            *g = until;
        }
    }
}

/// A place held for one request, given back when dropped (with the request's in-flight
/// guard).
#[derive(Debug)]
pub struct Place {
    pub(super) terms: Arc<PlaceTerms>,
}

impl Place {
    pub fn new(terms: Arc<PlaceTerms>) -> Self {
        Place { terms }
    }
}
