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
//! After a refusal the engine counts as full here until a place frees there: one of this
//! replica's own places, which it sees at once, or another replica's, which only the
//! engine sees. For those, the replica waits on the engine (one wait per engine, held
//! open by the hook until its count of openings moves from the one the refusal carried:
//! `meridian_core::channel::places`), and asks again as soon as it is answered. It also
//! asks again every [`RETRY_AFTER_REFUSAL`] whatever happens, as it did before engines
//! held waits (and still does against an older hook): that keeps its request's turn at
//! the engine, which a busy machine's late timers must not lose (a fleet run with
//! retries every 100 ms and the waits started later at the tail than one with 25 ms and
//! none), and mends a wake that was lost. A request granted a place at one engine may
//! have been refused at others before, each keeping a turn for this replica; with
//! nobody else waiting here, the replica withdraws those turns ([`EnginePlaces::withdraw`])
//! so none holds a freed place for it.
//!
//! Every answer also counts the replicas the engine heard from lately; this replica keeps
//! that word in its `crate::share::Roster`, which splits the tenants' limits of replicas
//! never told their number.
//!
//! An engine whose hook cannot take claims (none configured, an older hook, a wrong
//! secret) leaves this replica to decide alone, by its reading and its part of the
//! limit, until a renewal is answered again; one that does not answer for a moment (a
//! timeout) counts as full, and only after [`FAILURES_BEFORE_ALONE`] in a row as absent.
//! A request sent while deciding alone still takes a place here, one the engine never
//! granted ([`EnginePlaces::taken_alone`]): every holding this replica states counts it,
//! so when the hook answers again the engine counts the streams sent meanwhile and grants
//! no other replica the places they use. A request may find this replica alone just as the
//! hook answers again, and take its place after the answering message stated the holding:
//! the message that ends a spell alone is followed at once by a second statement, and a
//! place taken alone that finds the hook answering already restates the holding
//! ([`EnginePlaces::taken_alone`]), so either way the engine hears of it within a round
//! trip, not a renewal period later.

mod place;
#[cfg(test)]
mod tests;
mod turns;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use meridian_core::channel::places::WAITING_STALE_S;
use meridian_core::channel::{Claim, Granted};
use tokio::sync::Notify;

use super::Upstream;
use crate::hook::{HookChannel, HookError};
use crate::share::Roster;

pub use place::Place;

/// How long a refused engine counts as full before it is asked again, whether or not a
/// wait on it wakes this replica sooner. Short next to a request's life (places free as
/// requests end) and far inside the engine's `WAITING_STALE_S` (a turn not asked for
/// within it is dropped), long next to a claim's round trip, so a full engine is asked
/// at most a few dozen times a second by each replica while requests wait for it.
pub const RETRY_AFTER_REFUSAL: Duration = Duration::from_millis(25);
/// How long one wait asks the hook to hold it; the replica waits again while the engine
/// stays full.
pub const WAIT_FOR_PLACE: Duration = Duration::from_secs(2);
/// How long a place an engine woke this replica for counts as kept for it: as long as
/// the engine keeps a turn that is not asked for again.
pub const KEPT_FOR: Duration = Duration::from_millis((WAITING_STALE_S * 1000.0) as u64);
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
    /// Where the waits on full engines are counted.
    pub metrics: Arc<crate::telemetry::Metrics>,
    /// Whether a refused replica waits on the engine for a place (`admission.place_waits`)
    /// beside asking again on its timer.
    pub waits: bool,
    /// What the engines' answers say of the fleet (`crate::share::Roster`).
    pub roster: Arc<Roster>,
}

impl std::fmt::Debug for PlaceTerms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The channel holds the secret.
        f.debug_struct("PlaceTerms").field("holder", &self.holder).field("limit", &self.limit).finish()
    }
}

impl PlaceTerms {
    /// Sends `claim` to the hook at `addr`, and takes its answer's word on the fleet.
    async fn ask(&self, addr: &str, claim: &Claim) -> Result<Granted, HookError> {
        let answer = self.channel.claim(addr, claim, ANSWER_WITHIN).await;
        if let Ok(g) = &answer {
            let counted = self.roster.heard(addr, g.replicas, g.rank, LEASE, Instant::now());
            self.metrics.set_replicas_counted(counted);
        }
        answer
    }

    fn claim(&self, held: u32, want: u32, turn: Turn) -> Claim {
        Claim {
            holder: self.holder.clone(),
            held,
            want,
            limit: self.limit,
            lease_s: LEASE.as_secs_f64(),
            waited_s: turn.waited.as_secs_f64(),
            class: turn.class,
            withdraw: false,
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
    /// The place is this replica's until dropped.
    Granted(Place),
    /// The engine's places are all held, or kept for requests that go first.
    Refused,
    /// Not asked: the engine refused the last claim, and another claim is asking it again
    /// now; this one waits as if refused with it.
    Behind,
    /// The hook did not answer. `alone`: it cannot take claims, or has not answered
    /// several in a row, so this replica decides alone for now; otherwise the engine
    /// counts as full for a moment, as after a refusal.
    Unanswered { error: HookError, alone: bool },
}

/// This replica's places at one engine.
#[derive(Debug, Default)]
pub struct EnginePlaces {
    /// Places held; the lock also puts this replica's messages to the engine in order.
    held: tokio::sync::Mutex<u32>,
    /// Until when the engine counts as full after a refusal.
    full_until: Mutex<Option<Instant>>,
    /// Until when the engine keeps a place for this replica: a wait woke it (the place
    /// freed there is this replica's turn), and no claim has asked for it since.
    kept_until: Mutex<Option<Instant>>,
    /// This replica decides the engine's room alone (its hook takes no claims).
    alone: AtomicBool,
    /// Messages in a row the hook did not answer.
    failures: AtomicU32,
    /// Places taken while this replica decided alone, never granted by the engine
    /// ([`taken_alone`](Self::taken_alone)); stated with `held` in every message.
    taken_alone: AtomicU32,
    /// The engine refused the last claim (and granted none since).
    refused: AtomicBool,
    /// A claim is asking an engine that refused the last one.
    probing: AtomicBool,
    /// The engine's count of openings as last heard (a refusal's, or a wait's answer).
    freed_seen: AtomicU64,
    /// Refusals so far: a wait that ends with none since finds nobody here waiting.
    refusals: AtomicU64,
    /// Times a wait told this replica that a place freed: a claim out meanwhile, refused
    /// on the count before, asks again at once.
    wakes: AtomicU64,
    /// A wait for a place at this engine is under way.
    waiting: AtomicBool,
    /// The hook refused a wait (an older hook: no such path): retries alone tell this
    /// replica that a place freed, until a claim's answer shows the hook counts openings.
    holds_no_waits: AtomicBool,
    /// The hook refused a withdrawal (a hook from before them): this replica's turns there
    /// go stale instead.
    takes_no_withdrawals: AtomicBool,
    /// A renewal of this replica's holding is under way (the next waits for it).
    renewing: AtomicBool,
    /// The renewal under way is to state the holding once more when it ends: a place was
    /// taken alone after it may have read the holding ([`restate`](Self::restate)).
    renew_again: AtomicBool,
    /// An answer ended a spell alone: the holding is stated once more before the holding's
    /// lock goes ([`restate_if_back`](Self::restate_if_back)).
    came_back: AtomicBool,
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
        let probe = match places.refused.load(Ordering::SeqCst) {
            true if places.probing.swap(true, Ordering::AcqRel) => return Claimed::Behind,
            probe => probe,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (upstream, addr, terms, wake) =
            (Arc::clone(upstream), addr.to_owned(), Arc::clone(terms), Arc::clone(wake));
        tokio::spawn(async move {
            let places = &upstream.places;
            let asking = probe.then(|| Probe(&places.probing));
            let mut held = places.held.lock().await;
            // A refusal that landed while this claim waited for its turn stands for it too.
            if !probe && places.refused.load(Ordering::SeqCst) {
                let _ = tx.send(Claimed::Behind);
                return;
            }
            let wakes = places.wakes.load(Ordering::SeqCst);
            let answer = terms.ask(&addr, &terms.claim(places.holding(*held), 1, turn)).await;
            let claimed = places.settle(answer, &mut held, || Place {
                upstream: Arc::clone(&upstream),
                addr: addr.clone(),
                terms: Arc::clone(&terms),
                wake: Arc::clone(&wake),
                granted: true,
            });
            // The answer is in: the next claim may ask, and the waiters woken below see so.
            drop(asking);
            match &claimed {
                // A wait told of a place freed while this claim was out: the refusal is
                // older than that news, so the waiting requests ask again now.
                Claimed::Refused if places.wakes.load(Ordering::SeqCst) != wakes => {
                    places.set_full_until(None);
                    wake.notify_one();
                }
                Claimed::Refused | Claimed::Unanswered { alone: false, .. } => {
                    places.set_full_until(Some(Instant::now() + RETRY_AFTER_REFUSAL));
                    let again = Arc::clone(&wake);
                    tokio::spawn(async move {
                        tokio::time::sleep(RETRY_AFTER_REFUSAL).await;
                        again.notify_one();
                    });
                }
                // Waiters held back behind this claim may try the engine now.
                _ => wake.notify_one(),
            }
            if matches!(claimed, Claimed::Refused) && terms.waits {
                EnginePlaces::wait_for_place(&upstream, &addr, &terms, &wake);
            }
            // A request that went away mid-claim, or before it read the answer, drops the
            // place with the channel, and it goes back.
            let _ = tx.send(claimed);
            places.restate_if_back(&terms, &addr, *held).await;
        });
        rx.await.unwrap_or(Claimed::Behind)
    }

    /// A place for a request this replica sends to `upstream`'s engine on its own word,
    /// while it decides that engine's room alone ([`alone`](Self::alone)): no claim asks
    /// for it, but every holding stated there counts it until it is dropped. Without it,
    /// a hook that answers again would hear a holding short of the streams sent
    /// meanwhile, and grant their places to other replicas past `max_streams`.
    ///
    /// The caller found this replica alone a moment ago; the hook may have answered again
    /// since, after its answering message read the holding. The count goes up before it is
    /// checked whether the replica is still alone: if so, the message that ends the spell
    /// comes later and is followed by a statement that counts this place
    /// ([`restate_if_back`](Self::restate_if_back)); if not, the holding is stated again
    /// now ([`restate`](Self::restate)).
    pub fn taken_alone(
        upstream: &Arc<Upstream>,
        addr: &str,
        terms: &Arc<PlaceTerms>,
        wake: &Arc<Notify>,
    ) -> Place {
        upstream.places.taken_alone.fetch_add(1, Ordering::SeqCst);
        if !upstream.places.alone() {
            EnginePlaces::restate(upstream, addr, terms);
        }
        Place {
            upstream: Arc::clone(upstream),
            addr: addr.to_owned(),
            terms: Arc::clone(terms),
            wake: Arc::clone(wake),
            granted: false,
        }
    }

    /// The whole holding to state: `held` granted places and those taken alone.
    fn holding(&self, held: u32) -> u32 {
        held.saturating_add(self.taken_alone.load(Ordering::SeqCst))
    }

    /// Refusals so far at this engine (for [`withdraw`](Self::withdraw)).
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::SeqCst)
    }

    /// Whether this replica's last claim at the engine was refused (its turn kept there).
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::SeqCst)
    }

    /// What a claim's answer makes of the holding and of this engine's state.
    fn settle(
        &self,
        answer: Result<Granted, HookError>,
        held: &mut u32,
        place: impl FnOnce() -> Place,
    ) -> Claimed {
        // Whatever the answer, a place kept for this replica has been asked for.
        self.keep_until(None);
        if let Ok(granted) = &answer {
            // The larger: a wait may have heard a newer count while this claim was out.
            // (A restarted engine's smaller count comes through the wait, which answers
            // any count that differs.)
            self.freed_seen.fetch_max(granted.freed, Ordering::SeqCst);
            // A hook that counts openings (an upgraded one) holds waits.
            if granted.freed > 0 {
                self.holds_no_waits.store(false, Ordering::Relaxed);
            }
        }
        match answer {
            Ok(Granted { granted: true, .. }) => {
                *held += 1;
                self.answered();
                self.refused.store(false, Ordering::SeqCst);
                Claimed::Granted(place())
            }
            Ok(_) => {
                self.answered();
                self.refusals.fetch_add(1, Ordering::SeqCst);
                self.refused.store(true, Ordering::SeqCst);
                Claimed::Refused
            }
            Err(error) => Claimed::Unanswered { alone: self.unanswered_by(&error), error },
        }
    }

    /// Gives a place back (a granted one: `granted`; one taken alone has already left
    /// the count) and says so to the engine, unless this replica decides alone: then the
    /// hook is not listening, and reports that wait out their answer's timeout one after
    /// another would hold up the claims and renewals behind them; the renewal that finds
    /// it answering again states the holding.
    async fn release(&self, terms: &PlaceTerms, addr: &str, granted: bool) {
        let mut held = self.held.lock().await;
        if granted {
            *held = held.saturating_sub(1);
        }
        self.set_full_until(None);
        if !self.alone() {
            self.report(terms, addr, *held).await;
        }
    }

    /// Restates the holding, so the lease stays (and an engine that missed a message
    /// learns the truth).
    pub async fn renew(&self, terms: &PlaceTerms, addr: &str) {
        let held = self.held.lock().await;
        self.report(terms, addr, *held).await;
    }

    /// Restates the holding at `upstream`'s engine in a task of its own, unless the last
    /// renewal there is still under way: an engine whose hook answers slowly (or whose
    /// claims queue behind each other) delays only its own renewals, never another
    /// engine's, whose lease would lapse meanwhile.
    pub fn renew_in_background(upstream: &Arc<Upstream>, addr: &str, terms: &Arc<PlaceTerms>) {
        EnginePlaces::renewal(upstream, addr, terms, false);
    }

    /// Restates the holding at `upstream`'s engine in a task of its own, as
    /// [`renew_in_background`](Self::renew_in_background) does, but never skipped: a
    /// renewal under way (which may have read the holding before the change that asks for
    /// this) states it once more when it ends.
    fn restate(upstream: &Arc<Upstream>, addr: &str, terms: &Arc<PlaceTerms>) {
        EnginePlaces::renewal(upstream, addr, terms, true);
    }

    fn renewal(upstream: &Arc<Upstream>, addr: &str, terms: &Arc<PlaceTerms>, again: bool) {
        let places = &upstream.places;
        if again {
            places.renew_again.store(true, Ordering::SeqCst);
        }
        // Outside a runtime (nothing here is) there is no task to run it; the next
        // renewal on the replica's timer states the holding.
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        if places.renewing.swap(true, Ordering::SeqCst) {
            return;
        }
        let (upstream, addr, terms) = (Arc::clone(upstream), addr.to_owned(), Arc::clone(terms));
        rt.spawn(async move {
            let places = &upstream.places;
            loop {
                // This renewal reads the holding after now: an ask from before is answered.
                places.renew_again.store(false, Ordering::SeqCst);
                places.renew(&terms, &addr).await;
                places.renewing.store(false, Ordering::SeqCst);
                // An ask that came while this renewal was under way left it to this one;
                // unless a renewal started since took it up, state the holding again.
                if !places.renew_again.load(Ordering::SeqCst) || places.renewing.swap(true, Ordering::SeqCst)
                {
                    return;
                }
            }
        });
    }

    /// States the whole holding (`held` granted places and those taken alone), and once
    /// more if the answer ended a spell alone ([`restate_if_back`](Self::restate_if_back)).
    async fn report(&self, terms: &PlaceTerms, addr: &str, held: u32) {
        self.state(terms, addr, held).await;
        self.restate_if_back(terms, addr, held).await;
    }

    async fn state(&self, terms: &PlaceTerms, addr: &str, held: u32) {
        match terms.ask(addr, &terms.claim(self.holding(held), 0, Turn::default())).await {
            Ok(_) => self.answered(),
            Err(error) => {
                tracing::debug!(engine = addr, %error, "places: holding not reported");
                self.unanswered_by(&error);
            }
        }
    }

    /// After a message whose answer ended a spell alone ([`answered`](Self::answered)),
    /// with the holding's lock still held (`held` granted places): states the holding
    /// again. The message read it before its answer, and a request that found this
    /// replica alone until then may have taken its place since (`taken_alone`): read now,
    /// after the spell's end, the holding counts every such place.
    async fn restate_if_back(&self, terms: &PlaceTerms, addr: &str, held: u32) {
        while self.came_back.swap(false, Ordering::SeqCst) {
            self.state(terms, addr, held).await;
        }
    }

    fn answered(&self) {
        self.failures.store(0, Ordering::Relaxed);
        // SeqCst, with the load in `taken_alone`: a place taken while this still read
        // true is counted by the holding `restate_if_back` reads after this.
        if self.alone.swap(false, Ordering::SeqCst) {
            self.came_back.store(true, Ordering::SeqCst);
        }
    }

    /// Counts a message the hook did not answer; whether this replica now decides alone:
    /// at once when the hook cannot take claims (it answered, with a refusal of the
    /// message itself), after [`FAILURES_BEFORE_ALONE`] in a row when it did not answer.
    fn unanswered_by(&self, error: &HookError) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let cannot = !matches!(error, HookError::Unreachable { .. });
        let alone = cannot || failures >= FAILURES_BEFORE_ALONE;
        if alone {
            self.alone.store(true, Ordering::SeqCst);
        }
        alone
    }

    /// Whether the engine counts as full here: a refusal still stands, or a claim is
    /// asking it again after one.
    pub fn held_back(&self) -> bool {
        self.probing.load(Ordering::Acquire)
            || self.full_until.lock().map(|g| g.is_some_and(|t| Instant::now() < t)).unwrap_or(false)
    }

    /// Whether the engine keeps a place for this replica: a wait woke it a moment ago,
    /// and no claim has asked there since. The next request goes there (admission picks
    /// such an engine before any other): sent elsewhere by the routing policy, it would
    /// be refused where no place is kept for it, while the kept place stood idle,
    /// refusing the other replicas, until its turn went stale at the engine.
    pub fn kept_here(&self) -> bool {
        self.kept_until.lock().map(|g| g.is_some_and(|t| Instant::now() < t)).unwrap_or(false)
    }

    /// Whether this replica decides the engine's room alone (its hook takes no claims).
    pub fn alone(&self) -> bool {
        self.alone.load(Ordering::SeqCst)
    }

    fn set_full_until(&self, until: Option<Instant>) {
        if let Ok(mut g) = self.full_until.lock() {
            *g = until;
        }
    }

    /// Counts the engine as keeping a place for this replica until `until` (a wait woke
    /// it), or no longer (a claim asked there).
    pub(crate) fn keep_until(&self, until: Option<Instant>) {
        if let Ok(mut g) = self.kept_until.lock() {
            *g = until;
        }
    }
}
