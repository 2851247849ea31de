//! The replicas as the engines count them. Every answer to a claim on an engine's places
//! (`admission.places = "engine"`), renewals included, says how many replicas that
//! engine heard from within their leases and where this one stands among them by name
//! (`meridian_core::channel::places`, the roster). Replicas renew at every engine each
//! second, so the roster follows an autoscaler: a new replica is on it from its first
//! message, one that died is off it when its lease runs out.
//!
//! Replicas never told their number (`admission.replicas` left at 1, as an autoscaled
//! fleet's must be: its pods share one config) split by it what only they count, each
//! tenant's limits (`crate::tenants`). The engines' own limits need no split there: the
//! engines grant their places themselves.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Fleet;

/// What each engine last said of the fleet, and until when that stands.
#[derive(Debug, Default)]
pub struct Roster {
    heard: Mutex<HashMap<String, Heard>>,
}

#[derive(Debug, Clone, Copy)]
struct Heard {
    replicas: u32,
    rank: u32,
    until: Instant,
}

impl Roster {
    /// Takes an engine's word at `now`: `replicas` on its roster, this one at `rank`;
    /// it stands for `valid_for` (the lease this replica's messages ask, after which the
    /// engine would have dropped it too). Returns the replicas counted now
    /// ([`counted`](Self::counted)). A hook that keeps no roster says 0 and is not heard.
    pub fn heard(&self, engine: &str, replicas: u32, rank: u32, valid_for: Duration, now: Instant) -> u32 {
        let Ok(mut heard) = self.heard.lock() else { return 0 };
        if replicas > 0 {
            let entry = Heard { replicas, rank, until: now + valid_for };
            match heard.get_mut(engine) {
                Some(h) => *h = entry,
                None => {
                    heard.insert(engine.to_owned(), entry);
                }
            }
        }
        Self::largest(&heard, now).map_or(0, |h| h.replicas)
    }

    /// The replicas counted at `now`: the most any engine's standing word names (an
    /// engine that heard a newcomer first, or missed a replica's renewal, differs from
    /// the others for a second; the larger count splits the tighter). `None`: no engine
    /// has told, or no word stands.
    pub fn counted(&self, now: Instant) -> Option<Fleet> {
        let heard = self.heard.lock().ok()?;
        Self::largest(&heard, now).map(|h| Fleet::new(h.replicas, Some(h.rank)))
    }

    fn largest(heard: &HashMap<String, Heard>, now: Instant) -> Option<Heard> {
        heard.values().filter(|h| h.until >= now).copied().max_by_key(|h| (h.replicas, h.until))
    }
}

/// How this replica splits each tenant's limits with the others.
#[derive(Debug, Clone)]
pub enum Split {
    /// By `admission.replicas` and `admission.replica_index`, as told.
    Told(Fleet),
    /// By the engines' roster: replicas not told their number. While no engine has told
    /// (no places asked yet, or hooks without a roster), this replica holds the whole
    /// limits, as a replica alone.
    Counted(std::sync::Arc<Roster>),
}

impl Split {
    /// `admission.replicas` as told, else the engines' roster.
    pub fn of(cfg: &crate::config::AdmissionConfig, roster: std::sync::Arc<Roster>) -> Self {
        if cfg.replicas > 1 { Split::Told(Fleet::of(cfg)) } else { Split::Counted(roster) }
    }

    /// The fleet to split by at `now`.
    pub fn fleet(&self, now: Instant) -> Fleet {
        match self {
            Split::Told(fleet) => *fleet,
            Split::Counted(roster) => roster.counted(now).unwrap_or_else(Fleet::alone),
        }
    }
}
