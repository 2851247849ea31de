//! The controller's slots by batch slot index: a vector indexed by the slot, since every
//! row of every step looks its slot up several times (observe, land, decide). A
//! `BTreeMap` there cost about a fifth of the Model Runner V2 step at 256 rows.

use super::Slot;

/// Batch slots past this are refused: vLLM numbers them below its `max_num_seqs`, and a
/// stray index must not make the table allocate without bound.
pub(super) const MAX_SLOTS: usize = 1 << 16;

#[derive(Default)]
pub(super) struct Slots(Vec<Option<Slot>>);

impl Slots {
    pub(super) fn get(&self, slot: &usize) -> Option<&Slot> {
        self.0.get(*slot).and_then(Option::as_ref)
    }

    pub(super) fn get_mut(&mut self, slot: &usize) -> Option<&mut Slot> {
        self.0.get_mut(*slot).and_then(Option::as_mut)
    }

    /// Puts `value` in `slot`; false (and nothing stored) when `slot` is past `MAX_SLOTS`.
    pub(super) fn insert(&mut self, slot: usize, value: Slot) -> bool {
        if slot >= MAX_SLOTS {
            return false;
        }
        if slot >= self.0.len() {
            self.0.resize_with(slot + 1, || None);
        }
        self.0[slot] = Some(value);
        true
    }

    pub(super) fn remove(&mut self, slot: &usize) -> Option<Slot> {
        self.0.get_mut(*slot).and_then(Option::take)
    }

    /// The occupied slots below `end`, in slot order.
    pub(super) fn below_mut(&mut self, end: usize) -> impl Iterator<Item = (usize, &mut Slot)> {
        self.0.iter_mut().take(end).enumerate().filter_map(|(i, s)| s.as_mut().map(|s| (i, s)))
    }
}
