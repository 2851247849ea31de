//! Limits shared between the proxy replicas told their number (`admission.replicas`):
//! each engine's `admission.max_streams`, and each tenant's limits (`crate::tenants`),
//! split the same way. Replicas not told their number split the tenants' limits by the
//! replicas the engines count instead ([`Roster`], from their places' answers), which
//! follows an autoscaler. What follows is said of the engines'.
//!
//! A replica knows the engine's count of its requests as of the last reading (every
//! replica's) and its own traffic since; what the other replicas sent since is invisible
//! to it until the next reading, so replicas that each fill the room a reading shows fill
//! it several times over (measured in `docs/src/benchmarks/fleet.md`). Told how many they
//! are, replicas split each engine's limit instead: replica `i` of `n` holds at most
//! `limit / n` requests there, counted by its own open requests (exact, with no reading),
//! and the places that do not divide evenly go to the lowest indexes
//! (`admission.replica_index`; a replica that does not know its index takes only the even
//! part, and the leftovers stay unused). The parts add up to the limit, so together the
//! replicas never pass it, whenever and however often each reads the engine, and a
//! replica's own request ending frees its place at once. The engine's reading only ever
//! holds a replica back further, when the engine is fuller than the parts suggest (other
//! clients, a replica that was not told).
//!
//! The cost is the pooling the replicas give up: a replica whose part is full queues its
//! requests while another's part of the same engine stands idle. Near an engine's limit
//! that lengthens the slowest starts; the fleet page measures it. A split of the free room
//! each reading shows, taken by the replicas' indexes, was tried first and kept the limit
//! too, but starved the highest indexes whenever less room was free than there were
//! replicas; sharing places by need takes a grant from the engine itself, which no
//! engine offers yet.

/// How many replicas share each engine, and which one this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fleet {
    replicas: u32,
    /// `None`: not known, so no leftovers are taken.
    index: Option<u32>,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet::alone()
    }
}

impl Fleet {
    /// One replica: the whole limit is its own.
    pub const fn alone() -> Self {
        Fleet { replicas: 1, index: Some(0) }
    }

    /// `replicas` replicas (at least one), this one at `index` (below `replicas`, or
    /// unknown).
    pub fn new(replicas: u32, index: Option<u32>) -> Self {
        let replicas = replicas.max(1);
        Fleet { replicas, index: index.filter(|i| *i < replicas) }
    }

    /// How many replicas share the limits.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// The replicas `admission.replicas` and `admission.replica_index` say there are.
    pub fn of(cfg: &crate::config::AdmissionConfig) -> Self {
        Fleet::new(cfg.replicas, cfg.replica_index)
    }

    /// This replica's part of `places`.
    pub fn part(&self, places: u32) -> u32 {
        let left_over = places % self.replicas;
        places / self.replicas + u32::from(self.index.is_some_and(|i| i < left_over))
    }

    /// Whether this replica may send one more request to an engine that takes `limit`:
    /// `own_open`, the requests it has open there; `engine_holds`, the engine's count of
    /// its requests (every client's, as last read and brought up to date with this
    /// replica's traffic; `None`: the engine reports none).
    pub fn has_room(&self, limit: u32, own_open: u32, engine_holds: Option<u32>) -> bool {
        own_open < self.part(limit) && engine_holds.is_none_or(|n| n < limit)
    }
}

mod roster;

pub use roster::{Roster, Split};

#[cfg(test)]
mod tests;
