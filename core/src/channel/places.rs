//! An engine's places, granted by the engine itself to the proxy replicas in front of it
//! (`admission.places = "engine"`; ADR 0013).
//!
//! Each replica counts exactly the requests it has open at an engine, but not what the
//! other replicas sent since the engine was last read, so replicas that each fill the
//! room they see fill an engine past `admission.max_streams` together. The engine is the
//! one party every replica talks to, so it keeps the count: before sending a request a
//! replica claims a place, stating how many it holds already; the engine grants while
//! the places held by every replica, the new one included, stay within the limit.
//!
//! A claim states the replica's whole holding, not a change to it, so the engine's table
//! mends itself: a message lost, or a reply that never came back, is corrected by the
//! replica's next one. A replica sends its messages to one engine one at a time, so the
//! last one the engine saw is the replica's current holding. A replica that stops
//! talking (it crashed, or lost the engine) loses its places when its lease runs out;
//! replicas renew theirs every health round.
//!
//! Places go to requests in the order they would have had in one queue: a claim says how
//! long its request has waited and its admission class, and a place that frees while
//! requests at other replicas wait is kept for the one that has waited longest (its
//! class first) until its replica asks again. Without that, the replica whose own request
//! ended asks first (it hears of the end at once; the others when they next ask) and
//! hands the place to its own newest waiter, while an older one at another replica waits
//! on: the slowest starts of several replicas would be far slower than one replica's.
//! A waiter keeps its turn for [`WAITING_STALE_S`] after its replica last asked (replicas
//! ask again every 25 ms while a request waits); one whose replica stopped asking (its
//! request went elsewhere, or left) holds nothing back after that. A replica whose
//! request was granted a place at another engine, with nothing else waiting, withdraws
//! its turn here at once ([`Claim::withdraw`]): kept until stale, it held a freed place
//! idle for a quarter of a second while the other replicas' requests waited.
//!
//! A replica whose claim was refused need not ask again and again to learn that a place
//! freed: it waits on the engine ([`PlacesWait`] at [`PLACES_WAIT_PATH`]), which answers
//! as soon as the place is there for that replica ([`Places::wakes`]: its refused claim,
//! made again, would be granted; or its turn went stale; or the engine started again).
//! A place that frees while several replicas wait is kept for one of them, so only that
//! one is woken: waking every waiter at each opening (the first form of the waits, which
//! answered any change of the count of openings, [`Places::freed`]) had all but one ask
//! in vain. The replica then asks at once, instead of at its next retry, so a freed place
//! stands idle for one round trip, not for a retry period. Replicas still ask again now
//! and then while they wait: that keeps their turn, and mends a wake that was lost.
//!
//! Every answer also says how many replicas the engine has heard from within their
//! leases, holding places or not, and where the claimant stands among them by name (the
//! roster, [`Places::replicas`]). Replicas renew at every engine each second, so the
//! roster is the fleet as it is now, autoscaled or not: replicas never told their number
//! split by it what only they count, such as each tenant's limits.
//!
//! Places count the replicas' requests only: a client that bypasses every replica is not
//! in the table, and replicas that take places from the engine do not hold back for it.
//! The table is plain data with time passed in, so it is tested without a clock.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub const PLACES_PATH: &str = "/meridian/v1/places";
/// Where a refused replica waits for a place to free ([`PlacesWait`] → [`PlacesFreed`]).
pub const PLACES_WAIT_PATH: &str = "/meridian/v1/places/wait";
/// The longest an engine holds a wait before answering that nothing freed.
pub const MAX_WAIT_S: f64 = 5.0;

/// The longest lease a claim may ask for: a replica that died holds its places no longer.
pub const MAX_LEASE_S: f64 = 300.0;
/// The shortest: shorter than the replicas' renewals, a quiet replica's places would
/// lapse between them.
pub const MIN_LEASE_S: f64 = 0.1;
/// How long a refused claim keeps its turn without being asked again: replicas ask a full
/// engine again every 25 ms while their request waits (as well as when a wait on the
/// engine wakes them), so this leaves room for a busy machine, and
/// a place is kept idle no longer for a request that went elsewhere.
pub const WAITING_STALE_S: f64 = 0.25;

/// A replica's claim on an engine's places.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// The replica, stable for its life and unique among the replicas (its pod name and
    /// process, say).
    pub holder: String,
    /// The places it holds now: its requests at this engine that have not ended, those
    /// granted a place and those it sent while it decided the engine's room alone (its
    /// hook answered no claim), which the engine counts from the first message it hears.
    pub held: u32,
    /// Places it asks for on top (0: it only reports its holding, after requests ended
    /// or to renew its lease).
    pub want: u32,
    /// The engine's limit as the replica's config states it (`admission.max_streams`).
    pub limit: u32,
    /// How long the claim stands without another message from this holder, in seconds
    /// (clamped to [`MIN_LEASE_S`]..=[`MAX_LEASE_S`]).
    pub lease_s: f64,
    /// How long the request asking has waited for a place so far, in seconds.
    #[serde(default)]
    pub waited_s: f64,
    /// Its admission class, the most urgent first (0: an answer's start, 1: interactive,
    /// 2: batch): a class goes before any wait in a later one.
    #[serde(default)]
    pub class: u8,
    /// The holder has no request waiting for a place here any more (it was granted one at
    /// another engine): its turn goes at once, not when it goes stale, and a place kept
    /// for it opens for the next. Sent only with `want` 0, and only when true: a hook
    /// from before it refuses the field, and the replica then lets its turns go stale.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub withdraw: bool,
}

/// The engine's answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Granted {
    /// Whether the places asked for are the holder's (always, for a claim that asks none).
    pub granted: bool,
    /// The places this holder holds now, as the engine counts them.
    pub held: u32,
    /// The places every holder holds now.
    pub total: u32,
    /// Requests at other replicas that wait for a place here and go before this one (an
    /// earlier class, or a longer wait): the places kept for them.
    #[serde(default)]
    pub ahead: u32,
    /// The engine's count of openings when it answered ([`Places::freed`]): a replica
    /// refused waits for it to grow ([`PlacesWait`]). 0 from hooks that keep no count.
    #[serde(default)]
    pub freed: u64,
    /// The replicas the engine has heard from within their leases, this one included
    /// ([`Places::replicas`]): what an autoscaled fleet splits its tenants' limits by. 0
    /// from hooks that keep no roster.
    #[serde(default)]
    pub replicas: u32,
    /// This replica's place among them, by name (0 first): which part of a split is its.
    #[serde(default)]
    pub rank: u32,
}

/// A refused replica waits for a place: the engine answers once the place is there for
/// it ([`Places::wakes`]), or after `wait_s` (at most [`MAX_WAIT_S`]) with the count of
/// openings as it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacesWait {
    /// The count the replica last saw (its refusal's [`Granted::freed`]).
    pub after: u64,
    /// How long it will wait, in seconds.
    pub wait_s: f64,
    /// The replica waiting (its claims' [`Claim::holder`]): with it, the engine wakes it
    /// only when its refused claim, made again, would be granted; without it (replicas
    /// before ADR 0013's targeted wake), at any opening.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

impl PlacesWait {
    /// The wait an engine holds: `wait_s` within 0..=[`MAX_WAIT_S`] (0 for NaN).
    pub fn held_s(&self) -> f64 {
        if self.wait_s.is_nan() { 0.0 } else { self.wait_s.clamp(0.0, MAX_WAIT_S) }
    }
}

/// The engine's answer to a wait: its count of openings now, and whether the place is
/// there for the replica ([`Places::wakes`]) or the wait's time ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacesFreed {
    pub freed: u64,
    /// None from engines before the targeted wake, which answered early only when the
    /// count moved: read it as `freed != after` ([`PlacesFreed::woke`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub woken: Option<bool>,
}

impl PlacesFreed {
    /// Whether the wait ended because a place is there for the replica, for a wait that
    /// carried `after`.
    pub fn woke(&self, after: u64) -> bool {
        self.woken.unwrap_or(self.freed != after)
    }
}

#[derive(Debug, Clone, Copy)]
struct Holding {
    held: u32,
    /// When the holding lapses, on the caller's clock.
    until_s: f64,
}

/// A holder's request refused a place and waiting for one.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    class: u8,
    /// When it started waiting, on the caller's clock.
    since_s: f64,
    /// When its holder last asked for it.
    seen_s: f64,
    /// What the refused claim asked for on top of its holding, and the limit it stated:
    /// enough to tell when the same claim would be granted ([`Places::wakes`]).
    want: u32,
    limit: u32,
}

impl Waiting {
    /// Whether it goes before `other`: an earlier class, or the same and a longer wait.
    fn before(&self, other: &Waiting) -> bool {
        (self.class, self.since_s) < (other.class, other.since_s)
    }
}

/// The places an engine has granted, by holder, and the requests waiting for one.
#[derive(Debug)]
pub struct Places {
    holders: HashMap<String, Holding>,
    waiting: HashMap<String, Waiting>,
    /// Every replica heard from, holding places or not, until its lease runs out: the
    /// roster ([`Places::replicas`]). Replicas renew at every engine each second, so each
    /// engine's roster is the whole fleet's.
    heard: HashMap<String, f64>,
    /// Openings so far: places given back or lapsed, and kept turns dropped.
    freed: u64,
    /// How long a refused claim keeps its turn unasked ([`WAITING_STALE_S`] but in tests).
    turn_kept_s: f64,
}

impl Default for Places {
    fn default() -> Self {
        Places {
            holders: HashMap::new(),
            waiting: HashMap::new(),
            heard: HashMap::new(),
            freed: 0,
            turn_kept_s: WAITING_STALE_S,
        }
    }
}

impl Places {
    /// A table whose refused claims keep their turn `turn_kept_s` unasked instead of
    /// [`WAITING_STALE_S`]: for tests over real sockets on a busy machine, where a
    /// replica's next ask can come later than a quarter of a second through no fault of
    /// the table's.
    pub fn keeping_turns_for(turn_kept_s: f64) -> Self {
        Places { turn_kept_s, ..Places::default() }
    }

    /// Answers `claim` at `now_s` (any monotonic clock in seconds, the same every call):
    /// lapsed holdings and stale waiters are dropped first; the claim is granted when
    /// every other holder's places, the places kept for the requests at other replicas
    /// that go before it, and the claimant's holding and what it wants fit within its
    /// limit. Either way the claimant's holding becomes what it stated (plus what was
    /// granted); refused, its request waits for its turn.
    pub fn claim(&mut self, claim: &Claim, now_s: f64) -> Granted {
        self.tidy(now_s);
        let others = self.held_by_others(&claim.holder);
        let waited = if claim.waited_s.is_finite() { claim.waited_s.max(0.0) } else { 0.0 };
        let mine = Waiting {
            class: claim.class,
            since_s: now_s - waited,
            seen_s: now_s,
            want: claim.want,
            limit: claim.limit,
        };
        let ahead = match claim.want {
            0 => 0,
            _ => self.ahead_of(&claim.holder, &mine),
        };
        let asked = claim.held.saturating_add(claim.want);
        let granted = claim.want == 0 || others.saturating_add(ahead).saturating_add(asked) <= claim.limit;
        if claim.want > 0 {
            if granted {
                self.waiting.remove(&claim.holder);
            } else if let Some(was) = self.waiting.insert(claim.holder.clone(), mine) {
                // The holder's turn moved back (the request that had it left, and a newer
                // one asks): a waiter it went before, it may no longer; for that one the
                // place kept is an opening.
                let passed =
                    self.waiting.iter().any(|(h, w)| *h != claim.holder && was.before(w) && !mine.before(w));
                self.freed = self.freed.saturating_add(u64::from(passed));
            }
        }
        if claim.withdraw && claim.want == 0 && self.waiting.remove(&claim.holder).is_some() {
            // As a turn gone stale: an opening for whoever it went before.
            self.freed = self.freed.saturating_add(1);
        }
        let held = if granted { asked } else { claim.held };
        let lease = claim.lease_s.clamp(MIN_LEASE_S, MAX_LEASE_S);
        let lease = if lease.is_finite() { lease } else { MIN_LEASE_S };
        match self.heard.get_mut(&claim.holder) {
            Some(until_s) => *until_s = now_s + lease,
            None => {
                self.heard.insert(claim.holder.clone(), now_s + lease);
            }
        }
        // A holding stated lower than the table's gives places back.
        let before = self.holders.get(&claim.holder).map_or(0, |h| h.held);
        self.freed = self.freed.saturating_add(u64::from(before.saturating_sub(held)));
        if held == 0 {
            self.holders.remove(&claim.holder);
        } else {
            let until_s = now_s + lease;
            match self.holders.get_mut(&claim.holder) {
                Some(h) => *h = Holding { held, until_s },
                None => {
                    self.holders.insert(claim.holder.clone(), Holding { held, until_s });
                }
            }
        }
        let (replicas, rank) = self.roster(&claim.holder);
        Granted {
            granted,
            held,
            total: others.saturating_add(held),
            ahead,
            freed: self.freed,
            replicas,
            rank,
        }
    }

    /// How many replicas the roster holds, and `holder`'s place among them by name.
    fn roster(&self, holder: &str) -> (u32, u32) {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        (count(self.heard.len()), count(self.heard.keys().filter(|h| h.as_str() < holder).count()))
    }

    /// Whether a held `wait` is answered now: the place is there for its replica (its
    /// refused claim, made again as it stands, would be granted: the places held by the
    /// others, those kept for the requests that go before it and its own fit the limit
    /// it stated), or its replica no longer waits here (its turn went stale, so any
    /// opening may be its), or the engine started again (the count is below the one the
    /// wait carries). A wait that names no holder is answered at any opening.
    ///
    /// Why not every wait at every opening: a place that frees while several replicas
    /// wait is kept for one of them, so waking all of them makes the others ask in vain
    /// and be refused (a thundering herd the fleet bench measured: 4 replicas made
    /// 10-15 thousand refused claims a run, and slower starts than no waits at all).
    pub fn wakes(&self, wait: &PlacesWait) -> bool {
        if self.freed < wait.after {
            return true;
        }
        if self.freed == wait.after {
            return false;
        }
        let Some(holder) = wait.holder.as_deref() else {
            return true;
        };
        let Some(mine) = self.waiting.get(holder) else {
            return true;
        };
        let held = self.holders.get(holder).map_or(0, |h| h.held);
        let needed = self
            .held_by_others(holder)
            .saturating_add(self.ahead_of(holder, mine))
            .saturating_add(held)
            .saturating_add(mine.want);
        needed <= mine.limit
    }

    /// The places every holder but `holder` holds (lapsed ones too, until a tidy).
    fn held_by_others(&self, holder: &str) -> u32 {
        self.holders.iter().filter(|(h, _)| *h != holder).fold(0u32, |sum, (_, h)| sum.saturating_add(h.held))
    }

    /// The requests at other replicas that wait here and go before `mine`.
    fn ahead_of(&self, holder: &str, mine: &Waiting) -> u32 {
        let ahead = self.waiting.iter().filter(|(h, w)| *h != holder && w.before(mine)).count();
        u32::try_from(ahead).unwrap_or(u32::MAX)
    }

    /// Drops the holdings lapsed at `now_s` and the waiters stale by then, counting each
    /// as an opening. Claims do this first; an engine holding waits does it as time
    /// passes, so a replica that died wakes the others when its lease runs out.
    pub fn tidy(&mut self, now_s: f64) {
        let mut opened = 0u64;
        self.holders.retain(|_, h| {
            let keep = h.until_s >= now_s;
            if !keep {
                opened = opened.saturating_add(u64::from(h.held));
            }
            keep
        });
        // A replica that went quiet leaves the roster with its lease; it opens nothing.
        self.heard.retain(|_, until_s| *until_s >= now_s);
        let waiters = self.waiting.len();
        let kept_s = self.turn_kept_s;
        self.waiting.retain(|_, w| w.seen_s >= now_s - kept_s);
        opened = opened.saturating_add((waiters - self.waiting.len()) as u64);
        self.freed = self.freed.saturating_add(opened);
    }

    /// Openings so far (places given back or lapsed, places kept for waiters that
    /// stopped asking or lost their turn), as of the last claim or [`tidy`](Self::tidy):
    /// a replica waiting for a place is woken when this moves from the count its refusal
    /// carried. It only grows while the engine runs.
    pub fn freed(&self) -> u64 {
        self.freed
    }

    /// The places every holder holds at `now_s`, lapsed holdings left out.
    pub fn total(&self, now_s: f64) -> u32 {
        self.holders.values().filter(|h| h.until_s >= now_s).fold(0u32, |sum, h| sum.saturating_add(h.held))
    }

    /// Holders whose holding has not lapsed at `now_s`.
    pub fn holders(&self, now_s: f64) -> usize {
        self.holders.values().filter(|h| h.until_s >= now_s).count()
    }

    /// The replicas heard from within their leases at `now_s`, holding places or not:
    /// each claim (a renewal that holds none included) keeps its replica on the roster
    /// for the lease it asks. Told back in every answer ([`Granted::replicas`]), it lets
    /// replicas that were never told their number (an autoscaled fleet) split what only
    /// they count, such as their tenants' limits.
    pub fn replicas(&self, now_s: f64) -> usize {
        self.heard.values().filter(|until_s| **until_s >= now_s).count()
    }
}

#[cfg(test)]
mod tests;
