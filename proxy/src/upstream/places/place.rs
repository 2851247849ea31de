//! A request's place at an engine ([`Place`]): what it holds from the grant (or from
//! being sent while this replica decided the engine's room alone) until it is dropped,
//! and how it goes back.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::Notify;

use super::PlaceTerms;
use crate::upstream::Upstream;

/// A request's place at an engine, granted by it or taken alone
/// ([`EnginePlaces::taken_alone`]): it goes back to the engine when dropped, wherever
/// that happens (with the request's in-flight guard, or unread, when the request went
/// away between the grant and reading it), and the pool's waiters are told once it has:
/// a claim sent before the release would still count it held.
pub struct Place {
    pub(super) upstream: Arc<Upstream>,
    /// The engine's hook.
    pub(super) addr: String,
    pub(super) terms: Arc<PlaceTerms>,
    /// The pool's capacity notice.
    pub(super) wake: Arc<Notify>,
    /// The engine granted it (otherwise this replica took it alone).
    pub(super) granted: bool,
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.granted {
            // At once, so that no message stated from here on counts it; and the waiters
            // are told at once: the replica's own count decided its room, and the report
            // below would wait behind messages to a hook that may not be answering.
            let places = &self.upstream.places;
            let _ = places.taken_alone.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            self.wake.notify_one();
            if places.alone() {
                return;
            }
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.wake.notify_one();
            return;
        };
        let (upstream, terms, wake, granted) =
            (Arc::clone(&self.upstream), Arc::clone(&self.terms), Arc::clone(&self.wake), self.granted);
        let addr = std::mem::take(&mut self.addr);
        rt.spawn(async move {
            upstream.places.release(&terms, &addr, granted).await;
            wake.notify_one();
        });
    }
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place").field("engine", &self.upstream.name).field("granted", &self.granted).finish()
    }
}
