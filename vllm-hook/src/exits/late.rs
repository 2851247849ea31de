//! Model Runner V2's batch, whose tokens and entropies reach the host a step or more
//! late (the module above says why): counting each step's rows at once, and taking the
//! values in when they land.

use std::collections::VecDeque;
use std::sync::Arc;

use meridian_core::Phase;
use pyo3::PyResult;
use pyo3::exceptions::PyValueError;

use super::ExitController;

/// A row whose value (fed token or entropy) is on its way to the host: its row in that
/// step's batch, and the slot and occupant it belongs to.
pub(super) struct Unread {
    pub(super) row: usize,
    pub(super) slot: usize,
    pub(super) epoch: u64,
}

impl ExitController {
    /// Counts a step's rows, each `[slot, fed sequence length, prompt length, length to
    /// (re)fill]`; remembers the sampling rows and, in `fresh`, those whose fed token is
    /// new (counted now, unread). `None` when no row samples.
    pub(super) fn observe_columns(&mut self, rows: impl Iterator<Item = [i64; 4]>) -> Option<()> {
        self.sampling.clear();
        self.fresh.clear();
        let mut unread = Vec::new();
        for (row, [slot, seq_len, prompt_len, prefill_len]) in rows.enumerate() {
            let Ok(slot_idx) = usize::try_from(slot) else { continue };
            if seq_len < prefill_len {
                continue;
            }
            self.sampling.push((row, slot_idx));
            let generated = seq_len - prompt_len;
            if let Some(slot) = self.slots.get_mut(&slot_idx) {
                if seq_len > prefill_len && generated > slot.seen as i64 {
                    slot.seen = usize::try_from(generated).unwrap_or(0);
                    slot.unread = slot.unread.saturating_add(1);
                    unread.push(Unread { row, slot: slot_idx, epoch: slot.epoch });
                    self.fresh.push(row);
                }
            }
        }
        if !unread.is_empty() {
            self.unread_tokens.push_back(unread);
        }
        self.refresh_thinking();
        (!self.sampling.is_empty()).then_some(())
    }

    /// Which of the last observed rows think, as far as the values read so far tell.
    pub(super) fn refresh_thinking(&mut self) {
        self.thinking.clear();
        for &(row, slot_idx) in &self.sampling {
            if self.slots.get(&slot_idx).is_some_and(|s| s.tracker.phase() == Phase::Think) {
                self.thinking.push((row, slot_idx));
            }
        }
    }

    /// Announces that the entropies of the thinking rows will arrive later.
    pub(super) fn entropies_later_rows(&mut self) {
        let batch = self
            .thinking
            .iter()
            .filter_map(|&(row, s)| self.slots.get(&s).map(|slot| Unread { row, slot: s, epoch: slot.epoch }))
            .collect();
        self.unread_entropies.push_back(batch);
    }

    /// Feeds landed tokens, each with the `(slot, epoch)` it was counted for; values for
    /// a slot that has changed hands since are dropped.
    pub(super) fn land_tokens(&mut self, values: impl Iterator<Item = ((usize, u64), u32)>) {
        let Some(markers) = self.markers.as_ref() else { return };
        for ((slot_idx, epoch), t) in values {
            if let Some(slot) = self.slots.get_mut(&slot_idx).filter(|s| s.epoch == epoch) {
                slot.unread = slot.unread.saturating_sub(1);
                let _ = slot.take(markers, 1, |_| Ok(t));
            }
        }
    }

    /// Feeds landed entropies (nats) to their slots' signals, as `land_tokens` does.
    pub(super) fn land_entropies(&mut self, values: impl Iterator<Item = ((usize, u64), f64)>) {
        let shared = Arc::clone(&self.shared);
        for ((slot_idx, epoch), h) in values {
            if let Some(slot) = self.slots.get_mut(&slot_idx).filter(|s| s.epoch == epoch) {
                Self::push_entropy(slot, h, &shared);
            }
        }
    }
}

/// The oldest batch still waiting for its values.
fn pop(queue: &mut VecDeque<Vec<Unread>>, call: &str) -> PyResult<Vec<Unread>> {
    queue.pop_front().ok_or_else(|| PyValueError::new_err(format!("{call}: no values are awaited")))
}

/// The oldest batch still waiting for its values, checked against the number of values
/// that arrived for it (one per row counted).
pub(super) fn oldest(queue: &mut VecDeque<Vec<Unread>>, values: usize, call: &str) -> PyResult<Vec<Unread>> {
    let batch = pop(queue, call)?;
    if batch.len() != values {
        return Err(PyValueError::new_err(format!(
            "{call}: {values} values for a batch of {} rows",
            batch.len()
        )));
    }
    Ok(batch)
}

/// The oldest batch still waiting for its values, checked against values given for
/// every row of its step (`rows` of them).
pub(super) fn oldest_within(
    queue: &mut VecDeque<Vec<Unread>>,
    rows: usize,
    call: &str,
) -> PyResult<Vec<Unread>> {
    let batch = pop(queue, call)?;
    if let Some(u) = batch.iter().find(|u| u.row >= rows) {
        return Err(PyValueError::new_err(format!(
            "{call}: values for {rows} rows, but row {} was counted",
            u.row
        )));
    }
    Ok(batch)
}

/// `N` equal columns of native-endian int64 laid one after the other in `bytes`.
pub(super) fn int64_columns<const N: usize>(bytes: &[u8]) -> PyResult<[impl Iterator<Item = i64> + '_; N]> {
    if bytes.len() % (8 * N) != 0 {
        return Err(PyValueError::new_err(format!(
            "{} bytes are not {N} columns of int64 values",
            bytes.len()
        )));
    }
    let len = bytes.len() / N;
    Ok(std::array::from_fn(|j| {
        bytes[j * len..(j + 1) * len]
            .chunks_exact(8)
            .map(|b| i64::from_ne_bytes(b.try_into().unwrap_or_default()))
    }))
}

/// A column of native-endian float64 values.
pub(super) fn float64_column(bytes: &[u8]) -> PyResult<Vec<f64>> {
    if bytes.len() % 8 != 0 {
        return Err(PyValueError::new_err(format!("{} bytes are not float64 values", bytes.len())));
    }
    Ok(bytes.chunks_exact(8).map(|b| f64::from_ne_bytes(b.try_into().unwrap_or_default())).collect())
}
