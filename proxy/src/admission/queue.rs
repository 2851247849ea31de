//! The queue policy, apart from HTTP and time: who waits, in which order they are
//! offered capacity, and who gives way when the queue is full.
//!
//! Waiters are offered capacity class by class (output-phase starts, interactive,
//! batch). Within a class, tenants (`[tenants]`; one flow when off) share by start-time
//! fair queueing: each waiter is stamped, on arrival, with the later of its class's
//! virtual clock (the stamp of the last waiter let through) and its tenant's previous
//! stamp plus that tenant's share (`1 / weight`), and waiters go in stamp order. A tenant
//! that floods the queue stamps its own waiters ever further ahead, so another tenant's
//! newcomer is let through after at most one of the flood's per unit of its weight; a
//! single tenant's waiters keep their arrival order.

use std::collections::BTreeMap;

use crate::ctx::Class;

/// A waiter's place: class first, then its fair-queueing stamp, then arrival.
pub type Ticket = (Class, u64, u64);

/// A queued newcomer's ticket, and the lower-class waiter that gave way for it, if any.
pub type Queued<T> = (Ticket, Option<(Ticket, T)>);

/// One unit of service in stamps: a tenant of weight `w` advances its stamp by
/// `SHARE / w` per waiter.
const SHARE: u64 = 1 << 20;

/// Waiters in admission order: higher class first, then fair between tenants, then
/// earlier arrival first.
#[derive(Debug)]
pub struct ClassQueue<T> {
    waiting: BTreeMap<Ticket, T>,
    counts: [usize; 3],
    next: u64,
    bound: usize,
    /// Per class: the stamp of the last waiter let through.
    clock: [u64; 3],
    /// Per tenant, per class: the stamp its next waiter starts from.
    next_stamp: Vec<[u64; 3]>,
}

impl<T> ClassQueue<T> {
    /// A queue for `bound` waiters of `flows` tenants.
    pub fn new(bound: usize, flows: usize) -> Self {
        ClassQueue {
            waiting: BTreeMap::new(),
            counts: [0; 3],
            next: 0,
            bound: bound.max(1),
            clock: [0; 3],
            next_stamp: vec![[0; 3]; flows.max(1)],
        }
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Queues `item` of tenant `flow` (of `weight`). At the bound, the last in line of the
    /// lowest class gives way to a newcomer of a higher class (and is returned); otherwise
    /// the newcomer is refused.
    pub fn push(&mut self, class: Class, (flow, weight): (usize, u32), item: T) -> Result<Queued<T>, T> {
        let mut evicted = None;
        if self.waiting.len() >= self.bound {
            match self.waiting.last_key_value() {
                Some((&last, _)) if last.0 > class => evicted = self.take(last).map(|e| (last, e)),
                _ => return Err(item),
            }
        }
        let c = class as usize;
        let flow = flow.min(self.next_stamp.len() - 1);
        let stamp = self.clock[c].max(self.next_stamp[flow][c]);
        self.next_stamp[flow][c] = stamp + SHARE / u64::from(weight.max(1));
        let ticket = (class, stamp, self.next);
        self.next += 1;
        self.waiting.insert(ticket, item);
        self.counts[c] += 1;
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
        let released: Vec<(Ticket, T, G)> =
            chosen.into_iter().filter_map(|(t, g)| self.take(t).map(|item| (t, item, g))).collect();
        for (t, _, _) in &released {
            let c = t.0 as usize;
            self.clock[c] = self.clock[c].max(t.1);
        }
        released
    }

    /// Waiters per class.
    pub fn count(&self, class: Class) -> usize {
        self.counts[class as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: (usize, u32) = (0, 1);

    #[test]
    fn releases_by_class_then_arrival() {
        let mut q = ClassQueue::new(10, 1);
        q.push(Class::Batch, ONE, "b1").unwrap();
        q.push(Class::Interactive, ONE, "i1").unwrap();
        q.push(Class::Output, ONE, "o1").unwrap();
        q.push(Class::Batch, ONE, "b2").unwrap();
        q.push(Class::Output, ONE, "o2").unwrap();
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
        let mut q = ClassQueue::new(10, 1);
        q.push(Class::Output, ONE, ("m1", 1)).unwrap();
        q.push(Class::Batch, ONE, ("m2", 2)).unwrap();
        // Model m1's servers are full, m2's are not: the lower class goes first.
        let out = q.release(|(model, _)| (*model == "m2").then_some(()));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, ("m2", 2));
        assert_eq!(q.count(Class::Output), 1);
    }

    #[test]
    fn a_full_queue_refuses_or_evicts_a_lower_class() {
        let mut q = ClassQueue::new(2, 1);
        let (b1, _) = q.push(Class::Batch, ONE, 1).unwrap();
        let (b2, _) = q.push(Class::Batch, ONE, 2).unwrap();
        assert_eq!(q.push(Class::Batch, ONE, 3), Err(3));
        assert_eq!(q.push(Class::Interactive, ONE, 4).unwrap().1, Some((b2, 2)), "the newest batch goes");
        assert_eq!(q.push(Class::Output, ONE, 5).unwrap().1, Some((b1, 1)));
        assert_eq!(q.push(Class::Interactive, ONE, 6), Err(6), "no lower class left");
        assert_eq!(q.remove(b1), None);
        assert_eq!((q.count(Class::Batch), q.count(Class::Interactive), q.count(Class::Output)), (0, 1, 1));
        let out: Vec<i32> = q.release(|_| Some(())).into_iter().map(|(_, i, _)| i).collect();
        assert_eq!(out, vec![5, 4]);
        assert!(q.is_empty());
    }

    /// Lets `n` waiters through, one at a time as capacity frees, returning them.
    fn serve<T: Copy>(q: &mut ClassQueue<T>, n: usize) -> Vec<T> {
        (0..n)
            .flat_map(|_| {
                let mut once = true;
                q.release(|_| std::mem::take(&mut once).then_some(())).into_iter().map(|(_, i, _)| i)
            })
            .collect()
    }

    #[test]
    fn a_flooding_tenant_does_not_hold_back_another_in_the_same_class() {
        let mut q = ClassQueue::new(100, 2);
        for i in 0..20 {
            q.push(Class::Interactive, (0, 1), ('f', i)).unwrap();
        }
        q.push(Class::Interactive, (1, 1), ('v', 0)).unwrap();
        q.push(Class::Interactive, (1, 1), ('v', 1)).unwrap();
        let first: Vec<char> = serve(&mut q, 4).into_iter().map(|(t, _)| t).collect();
        assert_eq!(first, vec!['f', 'v', 'f', 'v'], "the newcomer alternates with the flood");
        assert_eq!(q.count(Class::Interactive), 18);
        // After the other tenant's turns the flood's own waiters go in their arrival order.
        let rest: Vec<i32> = serve(&mut q, 18).into_iter().map(|(_, i)| i).collect();
        assert_eq!(rest, (2..20).collect::<Vec<_>>());
    }

    #[test]
    fn a_heavier_tenant_is_let_through_in_proportion_to_its_weight() {
        let mut q = ClassQueue::new(1000, 2);
        for i in 0..300 {
            q.push(Class::Batch, (0, 3), (0, i)).unwrap();
            q.push(Class::Batch, (1, 1), (1, i)).unwrap();
        }
        let served = serve(&mut q, 200);
        let heavy = served.iter().filter(|(t, _)| *t == 0).count();
        assert!((148..=152).contains(&heavy), "weight 3 against 1 gets 3/4 of 200: {heavy}");
    }

    #[test]
    fn a_tenant_back_after_a_pause_starts_at_the_clock_not_with_saved_up_credit() {
        let mut q = ClassQueue::new(100, 2);
        for i in 0..10 {
            q.push(Class::Interactive, (0, 1), (0, i)).unwrap();
        }
        serve(&mut q, 8);
        // Tenant 1 never waited before: it gets no burst of eight turns in a row.
        for i in 0..4 {
            q.push(Class::Interactive, (1, 1), (1, i)).unwrap();
        }
        for i in 10..14 {
            q.push(Class::Interactive, (0, 1), (0, i)).unwrap();
        }
        // It starts at the clock, beside tenant 0's waiters, and alternates with them.
        let order: Vec<u8> = serve(&mut q, 4).into_iter().map(|(t, _)| t).collect();
        assert_eq!(order, vec![1, 0, 1, 0]);
    }

    #[test]
    fn classes_still_come_first_whatever_the_tenants() {
        let mut q = ClassQueue::new(100, 2);
        for i in 0..5 {
            q.push(Class::Batch, (1, 1000), i).unwrap();
        }
        q.push(Class::Output, (0, 1), 99).unwrap();
        assert_eq!(serve(&mut q, 1), vec![99]);
    }
}
