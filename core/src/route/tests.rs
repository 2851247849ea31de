use proptest::prelude::*;

use super::*;

fn engine(name: &str, answering: u32, in_flight: u32, kv_usage: Option<f64>) -> EngineView<'_> {
    EngineView { name, answering, in_flight, kv_usage }
}

const NO_KEY: RouteRequest<'static> = RouteRequest { affinity_key: None };

#[test]
fn roles_split_thinking_from_answering_and_both_takes_anything() {
    let takes = |r: Role| [Work::Think, Work::Answer, Work::Unknown].map(|w| r.takes(w));
    assert_eq!(takes(Role::Both), [true, true, true]);
    assert_eq!(takes(Role::Think), [true, false, false]);
    assert_eq!(takes(Role::Answer), [false, true, false]);
    let parsed: Role = serde_json::from_str("\"think\"").unwrap();
    assert_eq!((parsed, parsed.as_str(), Role::default()), (Role::Think, "think", Role::Both));
}

#[test]
fn phase_aware_weighs_answering_streams_then_kv_pressure_then_requests_in_flight() {
    let p = PhaseAwareLeastLoad::default();
    // Fewer answering streams wins even with more in flight and a fuller cache.
    let engines = [engine("a", 3, 3, Some(0.1)), engine("b", 1, 9, Some(0.9))];
    assert_eq!(p.choose(&NO_KEY, &engines), Some(1));
    // Equal answering: the emptier cache, by a tenth or more, wins over fewer in flight.
    let engines = [engine("a", 1, 2, Some(0.75)), engine("b", 1, 6, Some(0.42))];
    assert_eq!(p.choose(&NO_KEY, &engines), Some(1));
    // Within the same tenth the cache reads as equal, and fewer in flight decides.
    let engines = [engine("a", 1, 2, Some(0.41)), engine("b", 1, 6, Some(0.47))];
    assert_eq!(p.choose(&NO_KEY, &engines), Some(0));
    // A cache not read yet counts as empty.
    let engines = [engine("a", 0, 0, Some(0.5)), engine("b", 0, 0, None)];
    assert_eq!(p.choose(&NO_KEY, &engines), Some(1));
}

#[test]
fn equal_engines_share_the_load_under_phase_aware_routing() {
    let p = PhaseAwareLeastLoad::default();
    let engines = [engine("a", 0, 1, None), engine("b", 0, 1, None), engine("c", 0, 1, None)];
    let mut picks = [0; 3];
    for _ in 0..30 {
        picks[p.choose(&NO_KEY, &engines).unwrap()] += 1;
    }
    assert_eq!(picks, [10, 10, 10]);
}

#[test]
fn round_robin_takes_each_engine_in_turn_whatever_its_load() {
    let p = RoundRobin::default();
    let engines = [engine("a", 9, 9, Some(1.0)), engine("b", 0, 0, None)];
    let picks: Vec<_> = (0..4).map(|_| p.choose(&NO_KEY, &engines).unwrap()).collect();
    assert_eq!(picks, [0, 1, 0, 1]);
}

#[test]
fn two_choices_never_take_the_busiest_engine_and_spread_over_the_rest() {
    let p = PowerOfTwoChoices::seeded(7);
    let engines =
        [engine("a", 0, 1, None), engine("b", 0, 2, None), engine("c", 0, 3, None), engine("d", 5, 9, None)];
    let mut picks = [0; 4];
    for _ in 0..4000 {
        picks[p.choose(&NO_KEY, &engines).unwrap()] += 1;
    }
    // The busiest wins no pair; the least loaded wins every pair it is in (half of
    // them), the next every pair but the one with the least loaded.
    assert_eq!(picks[3], 0);
    assert!((1800..2200).contains(&picks[0]), "{picks:?}");
    assert!((1100..1550).contains(&picks[1]), "{picks:?}");
    assert!(picks[2] > 400, "{picks:?}");
    // Of two, the less loaded every time.
    let two = [engine("a", 1, 0, None), engine("b", 0, 4, None)];
    assert!((0..100).all(|_| p.choose(&NO_KEY, &two) == Some(1)));
}

#[test]
fn a_key_goes_to_the_same_engine_from_every_replica() {
    let names = ["engine-0", "engine-1", "engine-2", "engine-3"];
    let engines: Vec<_> = names.iter().map(|n| engine(n, 0, 2, None)).collect();
    let (one, other) = (PrefixAffinity::new(1.25), PrefixAffinity::new(1.25));
    let mut used = std::collections::BTreeSet::new();
    for k in 0..200 {
        let key = format!("conversation-{k}");
        let request = RouteRequest { affinity_key: Some(&key) };
        let first = one.choose(&request, &engines).unwrap();
        used.insert(first);
        assert_eq!(one.choose(&request, &engines), Some(first), "the same replica, again");
        assert_eq!(other.choose(&request, &engines), Some(first), "another replica");
    }
    assert_eq!(used.len(), 4, "keys spread over every engine");
}

#[test]
fn the_affinity_hash_is_fixed_across_builds() {
    // Replicas built from different releases must rank engines alike: the value is FNV-1a
    // 64 of "session-1", 0xff, "engine-0", through splitmix64's finaliser, computed apart
    // from this code (a few lines of Python over the same definition).
    assert_eq!(affinity_hash("session-1", "engine-0"), affinity_hash("session-1", "engine-0"));
    assert_eq!(affinity_hash("session-1", "engine-0"), 0x99d9_78dc_5a5f_08d6);
    assert_ne!(affinity_hash("session-1", "engine-0"), affinity_hash("session-1", "engine-1"));
    // The separator keeps "ab"+"c" apart from "a"+"bc".
    assert_ne!(affinity_hash("ab", "c"), affinity_hash("a", "bc"));
}

#[test]
fn a_hot_keys_engine_past_the_bound_spills_to_the_keys_next_engine() {
    let p = PrefixAffinity::new(1.25);
    let key = "hot";
    let request = RouteRequest { affinity_key: Some(key) };
    let names = ["e0", "e1", "e2", "e3"];
    let mut ranked: Vec<_> = names.iter().map(|n| (affinity_hash(key, n), *n)).collect();
    ranked.sort_by_key(|r| std::cmp::Reverse(r.0));
    let (first, second) = (ranked[0].1, ranked[1].1);
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    // Four in flight on each: the key's engine takes it.
    let even: Vec<_> = names.iter().map(|n| engine(n, 0, 4, None)).collect();
    assert_eq!(p.choose(&request, &even), Some(at(first)));
    // Its engine holds 8 while the others hold 4: the ceiling is ceil(1.25 x 21 / 4) - 1
    // = 6, so the request spills to the key's second engine.
    let hot: Vec<_> = names.iter().map(|n| engine(n, 0, if *n == first { 8 } else { 4 }, None)).collect();
    assert_eq!(p.ceiling(&hot), 6);
    assert_eq!(p.choose(&request, &hot), Some(at(second)));
}

#[test]
fn without_a_key_prefix_affinity_routes_by_least_load() {
    let p = PrefixAffinity::new(1.25);
    let engines = [engine("a", 2, 2, None), engine("b", 0, 5, None)];
    assert_eq!(p.choose(&NO_KEY, &engines), Some(1));
}

#[test]
fn every_kind_builds_the_policy_it_names() {
    for kind in RoutingKind::ALL {
        assert_eq!(kind.policy(1.25).name(), kind.as_str());
    }
    assert_eq!(RoutingKind::default(), RoutingKind::PhaseAware);
}

fn engines_strategy() -> impl Strategy<Value = Vec<(u32, u32, Option<f64>)>> {
    prop::collection::vec((0u32..20, 0u32..40, prop::option::of(0.0f64..1.0)), 1..8)
}

proptest! {
    #[test]
    fn every_policy_picks_one_of_the_engines(loads in engines_strategy(), key in prop::option::of("[a-z]{1,8}")) {
        let names: Vec<String> = (0..loads.len()).map(|i| format!("engine-{i}")).collect();
        let engines: Vec<_> = loads.iter().zip(&names).map(|(&(a, f, kv), n)| engine(n, a, f, kv)).collect();
        let request = RouteRequest { affinity_key: key.as_deref() };
        for kind in RoutingKind::ALL {
            let p = kind.policy(1.25);
            let i = p.choose(&request, &engines);
            prop_assert!(i.is_some_and(|i| i < engines.len()), "{} chose {i:?}", kind.as_str());
            prop_assert_eq!(p.choose(&request, &[]), None);
        }
    }

    #[test]
    fn affinity_never_overloads_past_its_bound(loads in engines_strategy(), key in "[a-z]{1,8}", bound in 1.0f64..3.0) {
        let names: Vec<String> = (0..loads.len()).map(|i| format!("engine-{i}")).collect();
        let engines: Vec<_> = loads.iter().zip(&names).map(|(&(a, f, kv), n)| engine(n, a, f, kv)).collect();
        let p = PrefixAffinity::new(bound);
        let i = p.choose(&RouteRequest { affinity_key: Some(&key) }, &engines).unwrap();
        prop_assert!(u64::from(engines[i].in_flight) <= p.ceiling(&engines));
    }

    #[test]
    fn an_engine_leaving_moves_only_the_keys_it_held(n in 2usize..8, gone in 0usize..8, keys in prop::collection::vec("[a-z0-9]{1,12}", 1..50)) {
        let gone = gone % n;
        let names: Vec<String> = (0..n).map(|i| format!("engine-{i}")).collect();
        let all: Vec<_> = names.iter().map(|name| engine(name, 0, 0, None)).collect();
        let rest: Vec<_> = all.iter().enumerate().filter(|&(i, _)| i != gone).map(|(_, e)| e.clone()).collect();
        let p = PrefixAffinity::new(1e9); // no load bound: placement by hash alone
        for key in &keys {
            let request = RouteRequest { affinity_key: Some(key) };
            let before = all[p.choose(&request, &all).unwrap()].name;
            let after = rest[p.choose(&request, &rest).unwrap()].name;
            if before != all[gone].name {
                prop_assert_eq!(before, after, "key {} moved though its engine stayed", key);
            }
        }
    }
}
