//! The queue policy, apart from HTTP and time: who waits, in which order they are
//! offered capacity, and who gives way when the queue is full.

use std::collections::BTreeMap;

use crate::ctx::Class;

/// A waiter's place: class first, then arrival.
pub type Ticket = (Class, u64);

/// A queued newcomer's ticket, and the lower-class waiter that gave way for it, if any.
pub type Queued<T> = (Ticket, Option<(Ticket, T)>);

/// Waiters in admission order: higher class first, earlier arrival first within a class.
#[derive(Debug)]
pub struct ClassQueue<T> {
    waiting: BTreeMap<Ticket, T>,
    counts: [usize; 3],
    next: u64,
    bound: usize,
}

impl<T> ClassQueue<T> {
    pub fn new(bound: usize) -> Self {
        ClassQueue { waiting: BTreeMap::new(), counts: [0; 3], next: 0, bound: bound.max(1) }
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Queues `item`. At the bound, the newest waiter of the lowest class gives way to a
    /// newcomer of a higher class (and is returned); otherwise the newcomer is refused.
    pub fn push(&mut self, class: Class, item: T) -> Result<Queued<T>, T> {
        let ticket = (class, self.next);
        self.next += 1;
        let mut evicted = None;
        if self.waiting.len() >= self.bound {
            match self.waiting.last_key_value() {
                Some((&last, _)) if last.0 > class => evicted = self.take(last).map(|e| (last, e)),
                _ => return Err(item),
            }
        }
        self.waiting.insert(ticket, item);
        self.counts[class as usize] += 1;
        Ok((ticket, evicted))
    }

    /// Takes a waiter out (it left, or timed out); `None` if it is no longer queued.
    pub fn remove(&mut self, ticket: Ticket) -> Option<T> {
        self.take(ticket)
    }

    fn take(&mut self, ticket: Ticket) -> Option<T> {
        let item = self.waiting.remove(&ticket)?;
        self.counts[ticket.0 as usize] -= 1;
        Some(item)
    }

    /// Offers capacity to every waiter in admission order; `grant` returns `Some` for
    /// those it lets through, which leave the queue and are returned with the grant.
    pub fn release<G>(&mut self, mut grant: impl FnMut(&T) -> Option<G>) -> Vec<(Ticket, T, G)> {
        let chosen: Vec<(Ticket, G)> =
            self.waiting.iter().filter_map(|(t, item)| grant(item).map(|g| (*t, g))).collect();
        chosen.into_iter().filter_map(|(t, g)| self.take(t).map(|item| (t, item, g))).collect()
    }

    /// Waiters per class.
    pub fn count(&self, class: Class) -> usize {
        self.counts[class as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_by_class_then_arrival() {
        let mut q = ClassQueue::new(10);
        q.push(Class::Batch, "b1").unwrap();
        q.push(Class::Interactive, "i1").unwrap();
        q.push(Class::Output, "o1").unwrap();
        q.push(Class::Batch, "b2").unwrap();
        q.push(Class::Output, "o2").unwrap();
        let mut capacity = 3;
        let out: Vec<&str> = q
            .release(|_| (capacity > 0).then(|| capacity -= 1))
            .into_iter()
            .map(|(_, item, _)| item)
            .collect();
        assert_eq!(out, vec!["o1", "o2", "i1"]);
        assert_eq!((q.len(), q.count(Class::Batch)), (2, 2));
    }

    #[test]
    fn grants_skip_waiters_without_capacity() {
        let mut q = ClassQueue::new(10);
        q.push(Class::Output, ("m1", 1)).unwrap();
        q.push(Class::Batch, ("m2", 2)).unwrap();
        // Model m1's servers are full, m2's are not: the lower class goes first.
        let out = q.release(|(model, _)| (*model == "m2").then_some(()));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, ("m2", 2));
        assert_eq!(q.count(Class::Output), 1);
    }

    #[test]
    fn a_full_queue_refuses_or_evicts_a_lower_class() {
        let mut q = ClassQueue::new(2);
        let (b1, _) = q.push(Class::Batch, 1).unwrap();
        let (b2, _) = q.push(Class::Batch, 2).unwrap();
        assert_eq!(q.push(Class::Batch, 3), Err(3));
        assert_eq!(q.push(Class::Interactive, 4).unwrap().1, Some((b2, 2)), "the newest batch goes");
        assert_eq!(q.push(Class::Output, 5).unwrap().1, Some((b1, 1)));
        assert_eq!(q.push(Class::Interactive, 6), Err(6), "no lower class left");
        assert_eq!(q.remove(b1), None);
        assert_eq!((q.count(Class::Batch), q.count(Class::Interactive), q.count(Class::Output)), (0, 1, 1));
        let out: Vec<i32> = q.release(|_| Some(())).into_iter().map(|(_, i, _)| i).collect();
        assert_eq!(out, vec![5, 4]);
        assert!(q.is_empty());
    }
}
