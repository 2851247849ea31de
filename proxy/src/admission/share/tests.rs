use proptest::prelude::*;

use super::*;
use crate::upstream::{EngineNow, EngineReading, Mark};

fn since(read: u32, sent: u32, ended: u32) -> Option<SinceReading> {
    Some(SinceReading { read: EngineNow { requests: read, answering: 0 }, sent, ended })
}

#[test]
fn the_parts_of_the_room_add_up_to_it_whatever_the_number_of_replicas() {
    for replicas in 1..=6 {
        for room in 0..=20 {
            let parts: u32 = (0..replicas).map(|i| Fleet::new(replicas, Some(i)).part(room)).sum();
            assert_eq!(parts, room, "{replicas} replicas, {room} places");
        }
    }
    // Four replicas and 6 places: 2, 2, 1, 1; a replica that does not know its index
    // takes the even part only.
    let parts: Vec<u32> = (0..4).map(|i| Fleet::new(4, Some(i)).part(6)).collect();
    assert_eq!(parts, [2, 2, 1, 1]);
    assert_eq!(Fleet::new(4, None).part(6), 1);
    assert_eq!(Fleet::new(4, Some(9)), Fleet::new(4, None), "an index past the count is none");
    assert_eq!(Fleet::new(0, Some(0)), Fleet::alone(), "no replicas reads as one");
}

#[test]
fn one_replica_takes_all_the_room_it_sees() {
    let alone = Fleet::alone();
    // The engine holds 5 of 8 (other clients' included): three more, then none.
    assert!(alone.has_room(8, 0, since(5, 2, 0)));
    assert!(!alone.has_room(8, 3, since(5, 3, 0)));
    // One of its own ended since: room again.
    assert!(alone.has_room(8, 2, since(5, 3, 1)));
    // No reading: its own requests against the limit.
    assert!(alone.has_room(8, 7, None));
    assert!(!alone.has_room(8, 8, None));
}

#[test]
fn several_replicas_each_hold_their_part_of_the_limit() {
    // Three replicas and a limit of 8: 3, 3 and 2, whatever the engine reads.
    let fleets: Vec<Fleet> = (0..3).map(|i| Fleet::new(3, Some(i))).collect();
    for (fleet, part) in fleets.iter().zip([3, 3, 2]) {
        assert!(fleet.has_room(8, part - 1, None));
        assert!(!fleet.has_room(8, part, None), "past its part");
        assert!(!fleet.has_room(8, part, since(0, 0, 0)), "an empty engine lends nothing");
    }
    // A fuller engine than the parts suggest (another client) holds a replica back.
    assert!(!fleets[2].has_room(8, 1, since(7, 1, 0)));
    assert!(fleets[2].has_room(8, 1, since(7, 1, 1)));
    // Not knowing its index, a replica takes the even part only.
    assert!(!Fleet::new(3, None).has_room(8, 2, None));
}

/// One step of a world of replicas in front of one engine.
#[derive(Debug, Clone)]
enum Event {
    /// Replica `r` has a request to send, if it has room.
    Send(usize),
    /// The `k`-th request on its way reaches the engine.
    Arrive(usize),
    /// The engine's answer to the `k`-th arrived request reaches its replica.
    Answer(usize),
    /// The `k`-th answered request ends.
    End(usize),
    /// Replica `r` asks for a reading.
    Ask(usize),
    /// The engine takes the count replica `r` asked for.
    Count(usize),
    /// The reading reaches replica `r`.
    Reply(usize),
}

fn event(replicas: usize) -> impl Strategy<Value = Event> {
    let r = 0..replicas;
    prop_oneof![
        3 => r.clone().prop_map(Event::Send),
        2 => (0..8usize).prop_map(Event::Arrive),
        2 => (0..8usize).prop_map(Event::Answer),
        2 => (0..8usize).prop_map(Event::End),
        1 => r.clone().prop_map(Event::Ask),
        1 => r.clone().prop_map(Event::Count),
        1 => r.prop_map(Event::Reply),
    ]
}

fn world() -> impl Strategy<Value = (u32, usize, bool, Vec<Event>)> {
    (1u32..=10, 1usize..=5, any::<bool>()).prop_flat_map(|(limit, replicas, indexed)| {
        (Just(limit), Just(replicas), Just(indexed), prop::collection::vec(event(replicas), 1..400))
    })
}

#[derive(Default)]
struct Replica {
    reading: EngineReading,
    open: u32,
    asked: Option<(Mark, Option<u32>)>,
}

proptest! {
    /// Replicas that read the engine at any times, with readings that take any time to
    /// come back and requests that take any time to arrive, together never put more in
    /// the engine than its limit; one replica (no split) with the same readings included.
    #[test]
    fn replicas_together_never_fill_an_engine_past_its_limit((limit, n, indexed, events) in world()) {
        let fleets: Vec<Fleet> =
            (0..n).map(|i| Fleet::new(n as u32, indexed.then_some(i as u32))).collect();
        let mut replicas: Vec<Replica> = (0..n).map(|_| Replica::default()).collect();
        // Requests by owner: on their way, in the engine unanswered, answered.
        let (mut on_the_way, mut arrived, mut answered): (Vec<usize>, Vec<usize>, Vec<usize>) =
            Default::default();
        let mut held = 0u32;
        for e in events {
            match e {
                Event::Send(r) => {
                    let rep = &mut replicas[r];
                    if fleets[r].has_room(limit, rep.open, rep.reading.since()) {
                        rep.reading.sent();
                        rep.open += 1;
                        on_the_way.push(r);
                    }
                }
                Event::Arrive(k) if !on_the_way.is_empty() => {
                    arrived.push(on_the_way.remove(k % on_the_way.len()));
                    held += 1;
                }
                Event::Answer(k) if !arrived.is_empty() => {
                    let r = arrived.remove(k % arrived.len());
                    replicas[r].reading.settled();
                    answered.push(r);
                }
                Event::End(k) if !answered.is_empty() => {
                    let r = answered.remove(k % answered.len());
                    held -= 1;
                    replicas[r].reading.ended();
                    replicas[r].open -= 1;
                }
                Event::Ask(r) if replicas[r].asked.is_none() => {
                    replicas[r].asked = Some((replicas[r].reading.mark(), None));
                }
                Event::Count(r) => {
                    if let Some((_, count @ None)) = &mut replicas[r].asked {
                        *count = Some(held);
                    }
                }
                Event::Reply(r) => {
                    if let Some((mark, Some(count))) = replicas[r].asked {
                        replicas[r].reading.record_counts(mark, Some(f64::from(count)), Some(0.0));
                        replicas[r].asked = None;
                    }
                }
                _ => {}
            }
            prop_assert!(held <= limit, "the engine holds {held}, past its limit of {limit}");
        }
    }
}
