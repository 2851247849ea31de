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
//! single tenant's waiters keep their arrival order. A full queue makes room the same
//! way: for a newcomer of a higher class, the last in line of the lowest class gives way;
//! for one of the same class, the tenant holding the most places in that class gives up
//! its last one, if it holds more there than the newcomer's tenant does. A flood cannot fill the queue and
//! so lock the other tenants out. A waiter that leaves without being let through (it
//! timed out, its client went, it gave way) gives its tenant's share back: a tenant is
//! charged for the service it got, not for the requests it gave up on, so a tenant whose
//! waiters all timed out in one burst is not held back behind the others in the next.

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
    /// Each waiter with its tenant's flow and the share its stamp was charged.
    waiting: BTreeMap<Ticket, (usize, u64, T)>,
    counts: [usize; 3],
    /// Waiters per tenant, per class.
    held: Vec<[usize; 3]>,
    next: u64,
    bound: usize,
    /// Per class: the stamp of the last waiter let through.
    clock: [u64; 3],
    /// Per tenant, per class: the stamp its next waiter starts from.
    next_stamp: Vec<[u64; 3]>,
    /// Per tenant, per class: where its next waiter would start had it none queued, by
    /// the waiters it was let through (the last one's stamp plus its share).
    served_next: Vec<[u64; 3]>,
}

impl<T> ClassQueue<T> {
    /// A queue for `bound` waiters of `flows` tenants.
    pub fn new(bound: usize, flows: usize) -> Self {
        ClassQueue {
            waiting: BTreeMap::new(),
            counts: [0; 3],
            held: vec![[0; 3]; flows.max(1)],
            next: 0,
            bound: bound.max(1),
            clock: [0; 3],
            next_stamp: vec![[0; 3]; flows.max(1)],
            served_next: vec![[0; 3]; flows.max(1)],
        }
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Queues `item` of tenant `flow` (of `weight`). At the bound, a waiter gives way (and
    /// is returned): the last in line of the lowest class, for a newcomer of a higher
    /// class; else the last of the tenant holding the most places in this class, if that
    /// is more than the newcomer's tenant holds there. Otherwise the newcomer is refused.
    pub fn push(&mut self, class: Class, (flow, weight): (usize, u32), item: T) -> Result<Queued<T>, T> {
        let flow = flow.min(self.held.len() - 1);
        let mut evicted = None;
        if self.waiting.len() >= self.bound {
            let Some(victim) = self.gives_way(class, flow) else {
                return Err(item);
            };
            evicted = self.take_unserved(victim).map(|e| (victim, e));
        }
        let c = class as usize;
        let stamp = self.clock[c].max(self.next_stamp[flow][c]);
        let share = SHARE / u64::from(weight.max(1));
        self.next_stamp[flow][c] = stamp + share;
        let ticket = (class, stamp, self.next);
        self.next += 1;
        self.waiting.insert(ticket, (flow, share, item));
        self.counts[c] += 1;
        self.held[flow][c] += 1;
        Ok((ticket, evicted))
    }

    /// Puts back a waiter let through earlier at its old place in line (its engine then
    /// refused it a place: `admission.places = "engine"`), ahead of those who came after
    /// it. It held that place already, so the bound does not refuse it.
    pub fn put_back(&mut self, ticket: Ticket, (flow, weight): (usize, u32), item: T) {
        let flow = flow.min(self.held.len() - 1);
        let share = SHARE / u64::from(weight.max(1));
        if self.waiting.insert(ticket, (flow, share, item)).is_none() {
            self.counts[ticket.0 as usize] += 1;
            self.held[flow][ticket.0 as usize] += 1;
        }
    }

    /// Who gives way at the bound to a newcomer of `class` from tenant `flow`, if anyone.
    fn gives_way(&self, class: Class, flow: usize) -> Option<Ticket> {
        let (&last, _) = self.waiting.last_key_value()?;
        if last.0 > class {
            return Some(last);
        }
        // Tenants are few: finding the one holding the most is a short scan.
        let c = class as usize;
        let (hog, most) = self.held.iter().map(|h| h[c]).enumerate().max_by_key(|(_, n)| *n)?;
        if most <= self.held[flow][c] + 1 {
            return None;
        }
        // Its last waiter of this class. Nothing of a lower class is queued (else it
        // would have given way above), so this is its last in line; a flood's waiters sit
        // at the end, so the walk is short.
        self.waiting.iter().rev().find(|(t, (f, ..))| *f == hog && t.0 == class).map(|(t, _)| *t)
    }

    /// Takes a waiter out (it left, or timed out); `None` if it is no longer queued.
    pub fn remove(&mut self, ticket: Ticket) -> Option<T> {
        self.take_unserved(ticket)
    }

    /// Takes out a waiter that was not let through, and charges its tenant only for what
    /// it holds: its next waiter starts right after its last one still queued in the
    /// class (they keep their order), or, with none queued, where the waiters it was let
    /// through leave it, as if those that left had never come.
    fn take_unserved(&mut self, ticket: Ticket) -> Option<T> {
        let (flow, _, item) = self.take(ticket)?;
        let c = ticket.0 as usize;
        // The tenant's last waiter in this class, if it has one left: a walk from the
        // class's end, short for a tenant that floods (its waiters sit there), and taken
        // only when a waiter leaves unserved, not per request let through.
        let own_next = if self.held[flow][c] == 0 {
            None
        } else {
            self.waiting
                .range((ticket.0, 0, 0)..=(ticket.0, u64::MAX, u64::MAX))
                .rev()
                .find(|(_, (f, ..))| *f == flow)
                .map(|(t, (_, share, _))| t.1 + share)
        };
        self.next_stamp[flow][c] = own_next.unwrap_or(0).max(self.served_next[flow][c]);
        Some(item)
    }

    fn take(&mut self, ticket: Ticket) -> Option<(usize, u64, T)> {
        let (flow, share, item) = self.waiting.remove(&ticket)?;
        self.counts[ticket.0 as usize] -= 1;
        self.held[flow][ticket.0 as usize] -= 1;
        Some((flow, share, item))
    }

    /// Offers capacity to every waiter in admission order; `grant` returns `Some` for
    /// those it lets through, which leave the queue and are returned with the grant.
    pub fn release<G>(&mut self, mut grant: impl FnMut(&T) -> Option<G>) -> Vec<(Ticket, T, G)> {
        let chosen: Vec<(Ticket, G)> =
            self.waiting.iter().filter_map(|(t, (.., item))| grant(item).map(|g| (*t, g))).collect();
        let mut released = Vec::with_capacity(chosen.len());
        for (t, g) in chosen {
            let Some((flow, share, item)) = self.take(t) else { continue };
            let c = t.0 as usize;
            self.clock[c] = self.clock[c].max(t.1);
            self.served_next[flow][c] = self.served_next[flow][c].max(t.1 + share);
            released.push((t, item, g));
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
    fn a_waiter_put_back_keeps_its_place_ahead_of_later_arrivals() {
        let mut q = ClassQueue::new(2, 1);
        let (first, _) = q.push(Class::Interactive, ONE, "first").unwrap();
        q.push(Class::Interactive, ONE, "second").unwrap();
        let out = q.release(|w| (*w == "first").then_some(()));
        assert_eq!(out.len(), 1);
        q.push(Class::Interactive, ONE, "third").unwrap();
        // Its engine refused it a place: back in line, at its old place, past the bound.
        q.put_back(first, ONE, "first");
        assert_eq!((q.len(), q.count(Class::Interactive)), (3, 3));
        let order: Vec<&str> = q.release(|_| Some(())).into_iter().map(|(_, w, _)| w).collect();
        assert_eq!(order, vec!["first", "second", "third"]);
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
    fn a_tenant_whose_waiters_all_timed_out_is_not_held_back_in_the_next_burst() {
        let mut q = ClassQueue::new(1000, 2);
        // A burst: tenant 0's 200 waiters all time out, unserved; tenant 1's 10 are let through.
        let gave_up: Vec<Ticket> =
            (0..200).map(|i| q.push(Class::Interactive, (0, 1), (0, i)).unwrap().0).collect();
        for i in 0..10 {
            q.push(Class::Interactive, (1, 1), (1, i)).unwrap();
        }
        for t in gave_up {
            assert!(q.remove(t).is_some());
        }
        serve(&mut q, 10);
        // The next burst: both send alike, and they alternate from the start.
        for i in 0..10 {
            q.push(Class::Interactive, (0, 1), (0, 1000 + i)).unwrap();
            q.push(Class::Interactive, (1, 1), (1, 1000 + i)).unwrap();
        }
        let order: Vec<u8> = serve(&mut q, 6).into_iter().map(|(t, _)| t).collect();
        assert_eq!(order.iter().filter(|t| **t == 0).count(), 3, "tenant 0 gets half, not none: {order:?}");
    }

    #[test]
    fn a_waiter_that_leaves_gives_back_its_share_behind_its_tenants_waiters_still_queued() {
        let mut q = ClassQueue::new(100, 2);
        let tickets: Vec<Ticket> = (0..3).map(|i| q.push(Class::Batch, (0, 1), (0, i)).unwrap().0).collect();
        // Its first waiter leaves; the two left keep their places, and a newcomer of the
        // same tenant still stands behind them.
        q.remove(tickets[0]);
        q.push(Class::Batch, (0, 1), (0, 3)).unwrap();
        let order: Vec<i32> = serve(&mut q, 3).into_iter().map(|(_, i)| i).collect();
        assert_eq!(order, vec![1, 2, 3]);
    }

    #[test]
    fn a_flood_that_fills_the_queue_gives_its_places_up_to_other_tenants() {
        let mut q = ClassQueue::new(10, 3);
        for i in 0..10 {
            q.push(Class::Interactive, (0, 1), ('f', i)).unwrap();
        }
        assert!(q.push(Class::Interactive, (0, 1), ('f', 10)).is_err(), "the flood itself is refused");
        // Another tenant's newcomer takes the flood's last place.
        let (_, gave_way) = q.push(Class::Interactive, (1, 1), ('v', 0)).unwrap();
        assert_eq!(gave_way.map(|(_, w)| w), Some(('f', 9)));
        for i in 1..5 {
            let (_, gave_way) = q.push(Class::Interactive, (1, 1), ('v', i)).unwrap();
            assert_eq!(gave_way.map(|(_, w)| w.0), Some('f'));
        }
        // Five each: the second tenant now holds as many as the flood, so it is refused.
        assert!(q.push(Class::Interactive, (1, 1), ('v', 5)).is_err());
        // A third tenant still finds room, at the expense of the one holding the most.
        assert!(q.push(Class::Interactive, (2, 1), ('w', 0)).unwrap().1.is_some());
        assert_eq!(q.len(), 10);
        // A batch newcomer never pushes an interactive waiter out.
        assert!(q.push(Class::Batch, (2, 1), ('w', 1)).is_err());
    }

    proptest::proptest! {
        /// Whatever the arrivals, departures and releases: the counts agree with the
        /// waiters, no tenant's waiters of one class overtake each other, classes go in
        /// order, and a full queue refuses a tenant only when it holds its fair share.
        #[test]
        fn the_queue_keeps_its_promises(ops in proptest::collection::vec((0u8..4, 0usize..3, 0u8..3), 1..200)) {
            let classes = [Class::Output, Class::Interactive, Class::Batch];
            let mut q = ClassQueue::new(8, 3);
            let mut seq = 0u32;
            let mut last_out: Vec<Option<u32>> = vec![None; 9];
            for (op, flow, class) in ops {
                let class = classes[usize::from(class)];
                match op {
                    0 | 1 => {
                        seq += 1;
                        let before = q.held.clone();
                        let full = q.len() >= 8;
                        match q.push(class, (flow, 1), (flow, class, seq)) {
                            Ok(_) => {}
                            Err(_) => {
                                proptest::prop_assert!(full);
                                let lower = q.waiting.keys().any(|t| t.0 > class);
                                let c = class as usize;
                                let most = before.iter().map(|h| h[c]).max().unwrap();
                                proptest::prop_assert!(!lower && most <= before[flow][c] + 1);
                            }
                        }
                    }
                    2 => {
                        if let Some(&t) = q.waiting.keys().nth(flow) {
                            q.remove(t);
                        }
                    }
                    _ => {
                        let mut n = flow + 1;
                        let out = q.release(|_| (n > 0).then(|| n -= 1));
                        for pair in out.windows(2) {
                            proptest::prop_assert!(pair[0].0.0 <= pair[1].0.0, "classes in order");
                        }
                        for (_, (f, c, s), _) in out {
                            let slot = &mut last_out[f * 3 + c as usize];
                            proptest::prop_assert!(slot.is_none_or(|prev| prev < s), "FIFO per tenant and class");
                            *slot = Some(s);
                        }
                    }
                }
                proptest::prop_assert!(q.len() <= 8);
                // A tenant is charged for what it got, not for what it gave up on: its next
                // stamp stands at most one share past the later of the clock and its own
                // last waiter still queued.
                for (f, stamps) in q.next_stamp.iter().enumerate() {
                    for c in classes {
                        let own_last = q.waiting.iter().filter(|(t, (fl, ..))| *fl == f && t.0 == c).map(|(t, _)| t.1).max();
                        let floor = own_last.unwrap_or(0).max(q.clock[c as usize]);
                        proptest::prop_assert!(stamps[c as usize] <= floor + SHARE, "tenant {f} in {c:?} carries a debt");
                    }
                }
                proptest::prop_assert_eq!(q.held.iter().flatten().sum::<usize>(), q.len());
                proptest::prop_assert_eq!(classes.iter().map(|c| q.count(*c)).sum::<usize>(), q.len());
            }
        }
    }

    #[test]
    fn a_light_tenant_is_never_starved_by_a_heavy_one() {
        let mut q = ClassQueue::new(10_000, 2);
        for i in 0..5000 {
            q.push(Class::Interactive, (0, 1000), (0, i)).unwrap();
        }
        q.push(Class::Interactive, (1, 1), (1, 0)).unwrap();
        // Weight 1000 against 1: the light one waits for at most 1000 of the heavy one's.
        let served = serve(&mut q, 1002);
        let at = served.iter().position(|(t, _)| *t == 1).expect("the light tenant was served");
        assert!(at <= 1001, "served after {at}");
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
