//! A refused replica's turn at a full engine: the wait that tells it when a place frees
//! there ([`EnginePlaces::wait_for_place`]), and the withdrawal of a turn it no longer
//! needs ([`EnginePlaces::withdraw`]). The module's opening says why both exist.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use meridian_core::channel::Claim;
use tokio::sync::Notify;

use super::{ANSWER_WITHIN, EnginePlaces, KEPT_FOR, PlaceTerms, RETRY_AFTER_REFUSAL, Turn, WAIT_FOR_PLACE};
use crate::hook::HookError;
use crate::upstream::Upstream;

impl EnginePlaces {
    /// Waits on the engine, in a task of its own, until a place frees there, and then
    /// tells the pool (`wake`) so the waiting requests ask again at once; waits again
    /// while requests here are still refused. One wait per engine at a time; none where
    /// the hook holds no waits. It ends when a claim is granted, when a wait passes with
    /// no refusal here (nobody waits for this engine any more), or when a wait fails (the
    /// retries go on, and the next refusal waits again).
    pub(super) fn wait_for_place(
        upstream: &Arc<Upstream>,
        addr: &str,
        terms: &Arc<PlaceTerms>,
        wake: &Arc<Notify>,
    ) {
        let places = &upstream.places;
        if places.holds_no_waits.load(Ordering::Relaxed) || places.waiting.swap(true, Ordering::SeqCst) {
            return;
        }
        let (upstream, addr, terms, wake) =
            (Arc::clone(upstream), addr.to_owned(), Arc::clone(terms), Arc::clone(wake));
        tokio::spawn(async move {
            let places = &upstream.places;
            let mut seen = places.refusals.load(Ordering::SeqCst);
            loop {
                while places.refused.load(Ordering::SeqCst) {
                    let after = places.freed_seen.load(Ordering::SeqCst);
                    seen = places.refusals.load(Ordering::SeqCst);
                    let asked = Instant::now();
                    let answer = terms
                        .channel
                        .wait_for_place(&addr, &terms.holder, after, WAIT_FOR_PLACE, ANSWER_WITHIN)
                        .await;
                    match answer {
                        // A place is there for this replica (or the engine started again,
                        // and its room is worth asking for too).
                        Ok(freed) if freed.woke(after) => {
                            terms.metrics.count_place_wait("woken");
                            places.freed_seen.store(freed.freed, Ordering::SeqCst);
                            places.wakes.fetch_add(1, Ordering::SeqCst);
                            places.set_full_until(None);
                            places.keep_until(Some(Instant::now() + KEPT_FOR));
                            wake.notify_one();
                        }
                        Ok(_) => {
                            terms.metrics.count_place_wait("expired");
                            if places.refusals.load(Ordering::SeqCst) == seen {
                                break;
                            }
                            // Answered early with nothing freed: the hook holds too many
                            // waits already. Wait out a retry before asking for another.
                            if asked.elapsed() < WAIT_FOR_PLACE / 2 {
                                tokio::time::sleep(RETRY_AFTER_REFUSAL).await;
                            }
                        }
                        Err(error) => {
                            terms.metrics.count_place_wait("failed");
                            if !matches!(error, HookError::Unreachable { .. }) {
                                tracing::debug!(engine = %addr, %error,
                                    "places: the hook holds no waits; asking again on a timer");
                                places.holds_no_waits.store(true, Ordering::Relaxed);
                            }
                            places.waiting.store(false, Ordering::SeqCst);
                            return;
                        }
                    }
                }
                places.waiting.store(false, Ordering::SeqCst);
                // A refusal that landed as this task was leaving, whose claim found it
                // still running, is waited for here.
                let again =
                    places.refusals.load(Ordering::SeqCst) != seen && places.refused.load(Ordering::SeqCst);
                if !again || places.waiting.swap(true, Ordering::SeqCst) {
                    return;
                }
            }
        });
    }

    /// Gives up this replica's turn at the engine, in a task of its own, when its last
    /// claim there was refused and nothing was refused there since `refusals_seen` (what
    /// [`refusals`](Self::refusals) read when the caller found nobody waiting): its request
    /// was granted a place elsewhere. Kept, the turn would hold a freed place idle,
    /// refusing the other replicas' requests, until it went stale at the engine (a quarter
    /// of a second). A request that asks there later claims a turn of its own again, in
    /// its place by how long it has waited. Against a hook that refuses withdrawals the
    /// turns go stale as before.
    pub fn withdraw(upstream: &Arc<Upstream>, addr: &str, terms: &Arc<PlaceTerms>, refusals_seen: u64) {
        let places = &upstream.places;
        if !places.refused.load(Ordering::SeqCst) || places.takes_no_withdrawals.load(Ordering::Relaxed) {
            return;
        }
        let (upstream, addr, terms) = (Arc::clone(upstream), addr.to_owned(), Arc::clone(terms));
        tokio::spawn(async move {
            let places = &upstream.places;
            let held = places.held.lock().await;
            // A claim refused meanwhile is a request waiting here again: its turn stays.
            let refused_since = places.refusals.load(Ordering::SeqCst) != refusals_seen;
            if refused_since
                || !places.refused.load(Ordering::SeqCst)
                || places.probing.load(Ordering::Acquire)
            {
                return;
            }
            let claim = Claim { withdraw: true, ..terms.claim(places.holding(*held), 0, Turn::default()) };
            match terms.ask(&addr, &claim).await {
                Ok(_) => {
                    places.answered();
                    places.refused.store(false, Ordering::SeqCst);
                    terms.metrics.count_place_claim("withdrawn");
                    places.restate_if_back(&terms, &addr, *held).await;
                }
                // Not heard: the turn goes stale at the engine.
                Err(HookError::Unreachable { .. }) => {}
                Err(error) => {
                    tracing::debug!(engine = %addr, %error,
                        "places: the hook takes no withdrawals; this replica's turns there go stale instead");
                    places.takes_no_withdrawals.store(true, Ordering::Relaxed);
                }
            }
        });
    }
}
