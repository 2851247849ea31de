use proptest::prelude::*;

use super::*;

#[test]
fn the_parts_of_the_limit_add_up_to_it_whatever_the_number_of_replicas() {
    for replicas in 1..=6 {
        for limit in 0..=20 {
            let parts: u32 = (0..replicas).map(|i| Fleet::new(replicas, Some(i)).part(limit)).sum();
            assert_eq!(parts, limit, "{replicas} replicas, a limit of {limit}");
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
fn one_replica_takes_the_whole_limit() {
    let alone = Fleet::alone();
    // The engine holds 5 of 8 (other clients' included), 2 of them this replica's.
    assert!(alone.has_room(8, 2, Some(5)));
    assert!(!alone.has_room(8, 2, Some(8)));
    // No reading: its own requests against the limit.
    assert!(alone.has_room(8, 7, None));
    assert!(!alone.has_room(8, 8, None));
}

#[test]
fn several_replicas_each_hold_their_part_of_the_limit() {
    // Three replicas and a limit of 8: 3, 3 and 2, however empty the engine reads.
    let fleets: Vec<Fleet> = (0..3).map(|i| Fleet::new(3, Some(i))).collect();
    for (fleet, part) in fleets.iter().zip([3, 3, 2]) {
        assert!(fleet.has_room(8, part - 1, None));
        assert!(!fleet.has_room(8, part, None), "past its part");
        assert!(!fleet.has_room(8, part, Some(part)), "an engine with room lends nothing");
    }
    // A fuller engine than the parts suggest (another client) holds a replica back.
    assert!(!fleets[2].has_room(8, 1, Some(8)));
    // Not knowing its index, a replica takes the even part only.
    assert!(!Fleet::new(3, None).has_room(8, 2, None));
}

proptest! {
    /// One replica decides as before the split existed: room while neither its own open
    /// requests nor the engine's count reach the limit.
    #[test]
    fn one_replica_decides_as_it_did_alone(limit in 1u32..64, own in 0u32..80, holds in proptest::option::of(0u32..80)) {
        let before = own.max(holds.unwrap_or(0)) < limit;
        prop_assert_eq!(Fleet::alone().has_room(limit, own, holds), before);
    }

    /// Replicas told their number, each reading the engine as anything at all (stale,
    /// missing, wrong), with requests ending in any order, together never put more in
    /// the engine than its limit; and a replica below its part, reading an engine with
    /// room, always gets a place.
    #[test]
    fn told_replicas_together_never_fill_an_engine_past_its_limit(
        limit in 1u32..16,
        n in 1u32..6,
        indexed in any::<bool>(),
        events in prop::collection::vec((0u32..6, proptest::option::of(0u32..20), any::<bool>()), 1..300),
    ) {
        let fleets: Vec<Fleet> = (0..n).map(|i| Fleet::new(n, indexed.then_some(i))).collect();
        let mut open = vec![0u32; n as usize];
        for (who, reads, ends) in events {
            let r = (who % n) as usize;
            if ends {
                open[r] = open[r].saturating_sub(1);
                continue;
            }
            let room = fleets[r].has_room(limit, open[r], reads);
            if open[r] < fleets[r].part(limit) && reads.is_none_or(|h| h < limit) {
                prop_assert!(room, "replica {} below its part, the engine not full", r);
            }
            if room {
                open[r] += 1;
            }
            let held: u32 = open.iter().sum();
            prop_assert!(held <= limit, "the engine holds {}, past its limit of {}", held, limit);
        }
    }
}
