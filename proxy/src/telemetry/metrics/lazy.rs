//! Handles registered on first use, for label values known only at run time but bounded
//! (model families from the model files, upstreams from the configuration, route ×
//! outcome from the code). After the first use of a value: a read lock and a hash lookup,
//! no allocation.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{PoisonError, RwLock};

pub(super) struct Lazy<K, H> {
    map: RwLock<HashMap<K, H>>,
}

impl<K, H> Default for Lazy<K, H> {
    fn default() -> Self {
        Lazy { map: RwLock::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash, H> Lazy<K, H> {
    /// Calls `f` with the handle for `key`, made by `make` the first time.
    pub(super) fn with<Q, R>(&self, key: &Q, make: impl FnOnce() -> (K, H), f: impl FnOnce(&H) -> R) -> R
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        // A panic elsewhere while a lock was held leaves the map whole (inserts are
        // single calls), so a poisoned lock is used as is.
        if let Some(h) = self.map.read().unwrap_or_else(PoisonError::into_inner).get(key) {
            return f(h);
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = map.get(key) {
            return f(h);
        }
        let (k, h) = make();
        f(map.entry(k).or_insert(h))
    }
}
