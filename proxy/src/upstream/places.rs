//! This replica's places at one engine, granted by the engine's hook
//! (`admission.places = "engine"`, `meridian_core::channel::places`, ADR 0013).
//!
//! Before a request is sent, admission claims a place for it; the place is the request's
//! until its in-flight guard drops, which gives it back. Every message to one engine
//! states this replica's whole holding, and they go one at a time (the holding's lock is
//! held across each round trip), so the engine's table always ends up with the holding
//! the replica last stated, whatever was lost on the way.
//!
//! After a refusal the engine counts as full here for [`RETRY_AFTER_REFUSAL`], or until
//! one of this replica's own places there frees: another replica's request ending shows
//! only at the engine, so a full engine is asked again at that pace while requests wait
//! for it. An engine whose hook does not answer a claim (none configured, unreachable, an
//! older hook) leaves this replica to decide alone, by its reading and its part of the
//! limit, until a renewal is answered again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use meridian_core::channel::{Claim, Granted};

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
    /// The engine's places are all held.
    Refused,
    /// Not asked: the engine refused the last claim, and another claim is asking it again
    /// now; this one waits as if refused with it.
    Behind,
    /// The engine could not be asked; this replica decides alone for now.
    Unanswered(HookError),
}

/// This replica's places at one engine.
#[derive(Debug, Default)]
pub struct EnginePlaces {
    /// Places held; the lock also puts this replica's messages to the engine in order.
    held: tokio::sync::Mutex<u32>,
    /// Until when the engine counts as full after a refusal.
    full_until: Mutex<Option<Instant>>,
    /// The last message went unanswered.
    unanswered: AtomicBool,
    /// The engine refused the last claim (and granted none since).
    refused: AtomicBool,
    /// A claim is asking an engine that refused the last one.
    probing: AtomicBool,
}

/// Marks a claim as the one asking a full engine again, until dropped (also when the
/// claim's request goes away mid-claim, so the next claim may ask).
struct Probe<'a>(&'a AtomicBool);

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl EnginePlaces {
    /// Claims one place at the hook at `addr`. While the engine's last answer was a
    /// refusal, one claim at a time asks it again; the others are [`Claimed::Behind`]
    /// (requests let through together would each be refused).
    pub async fn claim(&self, terms: &PlaceTerms, addr: &str, turn: Turn) -> Claimed {
        let _probe = match self.refused.load(Ordering::Acquire) {
            true if self.probing.swap(true, Ordering::AcqRel) => return Claimed::Behind,
            true => Some(Probe(&self.probing)),
            false => None,
        };
        let mut held = self.held.lock().await;
        match terms.channel.claim(addr, &terms.claim(*held, 1, turn)).await {
            Ok(Granted { granted: true, .. }) => {
                *held += 1;
                self.unanswered.store(false, Ordering::Relaxed);
                self.refused.store(false, Ordering::Release);
                Claimed::Granted
            }
            Ok(_) => {
                self.unanswered.store(false, Ordering::Relaxed);
                self.refused.store(true, Ordering::Release);
                self.set_full_until(Some(Instant::now() + RETRY_AFTER_REFUSAL));
                Claimed::Refused
            }
            Err(e) => {
                self.unanswered.store(true, Ordering::Relaxed);
                Claimed::Unanswered(e)
            }
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
        let answered = terms.channel.claim(addr, &terms.claim(held, 0, Turn::default())).await;
        if let Err(e) = &answered {
            tracing::debug!(engine = addr, error = %e, "places: holding not reported");
        }
        self.unanswered.store(answered.is_err(), Ordering::Relaxed);
    }

    /// Whether the engine counts as full here: a refusal still stands, or a claim is
    /// asking it again after one.
    pub fn held_back(&self) -> bool {
        self.probing.load(Ordering::Acquire)
            || self.full_until.lock().map(|g| g.is_some_and(|t| Instant::now() < t)).unwrap_or(false)
    }

    /// Whether the engine left the last message unanswered (this replica decides alone).
    pub fn unanswered(&self) -> bool {
        self.unanswered.load(Ordering::Relaxed)
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
