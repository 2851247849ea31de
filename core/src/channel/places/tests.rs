use super::*;

fn claim(holder: &str, held: u32, want: u32, limit: u32) -> Claim {
    Claim {
        holder: holder.into(),
        held,
        want,
        limit,
        lease_s: 10.0,
        waited_s: 0.0,
        class: 1,
        withdraw: false,
    }
}

/// An answer in a table of the two replicas `a` and `b`, to `a`.
fn granted(granted: bool, held: u32, total: u32) -> Granted {
    Granted { granted, held, total, ahead: 0, freed: 0, replicas: 2, rank: 0 }
}

#[test]
fn replicas_share_every_place_of_the_limit_by_need() {
    let mut p = Places::default();
    // One replica may take the whole limit when the others hold nothing.
    for held in 0..8 {
        assert!(p.claim(&claim("a", held, 1, 8), 0.0).granted, "place {held}");
    }
    assert_eq!(p.claim(&claim("b", 0, 1, 8), 0.0), Granted { rank: 1, ..granted(false, 0, 8) });
    // Two of a's requests end; its report frees both places for b at once.
    assert_eq!(p.claim(&claim("a", 6, 0, 8), 0.1), Granted { freed: 2, ..granted(true, 6, 6) });
    assert!(p.claim(&claim("b", 0, 1, 8), 0.12).granted);
    assert!(p.claim(&claim("b", 1, 1, 8), 0.12).granted);
    assert_eq!(p.claim(&claim("a", 6, 1, 8), 0.12), Granted { freed: 2, ..granted(false, 6, 8) });
    assert_eq!((p.total(0.12), p.holders(0.12)), (8, 2));
}

#[test]
fn a_claim_states_the_whole_holding_so_a_lost_reply_mends_itself() {
    let mut p = Places::default();
    // Granted, but the reply was lost: the replica thinks it holds none.
    assert!(p.claim(&claim("a", 0, 1, 2), 0.0).granted);
    assert_eq!(p.total(0.0), 1);
    // Its next message states its true holding, and the engine takes it.
    assert_eq!(p.claim(&claim("a", 0, 1, 2), 0.1), Granted { replicas: 1, ..granted(true, 1, 1) });
    // A replica holding nothing leaves the table.
    p.claim(&claim("a", 0, 0, 2), 0.2);
    assert_eq!(p.holders(0.2), 0);
}

#[test]
fn a_silent_replicas_places_lapse_with_its_lease() {
    let mut p = Places::default();
    for held in 0..4 {
        p.claim(&Claim { lease_s: 1.0, ..claim("gone", held, 1, 4) }, 0.0);
    }
    assert!(!p.claim(&claim("b", 0, 1, 4), 0.5).granted, "within the lease");
    assert!(p.claim(&claim("b", 0, 1, 4), 1.01).granted, "after it");
    assert_eq!(p.holders(1.01), 1);
    // A lease outside the bounds is clamped, not trusted: an endless one still ends.
    p.claim(&Claim { lease_s: f64::INFINITY, ..claim("c", 0, 1, 4) }, 2.0);
    p.claim(&Claim { lease_s: f64::NAN, ..claim("d", 0, 1, 4) }, 2.0);
    assert_eq!(p.holders(2.0 + MIN_LEASE_S + 0.01), 2, "b and c: NaN gets the shortest lease");
    assert_eq!(p.holders(2.0 + MAX_LEASE_S + 0.01), 0);
}

#[test]
fn a_freed_place_goes_to_the_request_that_has_waited_longest_at_any_replica() {
    let mut p = Places::default();
    let at = |holder: &str, held: u32, waited_s: f64, class: u8| Claim {
        waited_s,
        class,
        ..claim(holder, held, 1, 2)
    };
    assert!(p.claim(&at("a", 0, 0.0, 1), 0.0).granted);
    assert!(p.claim(&at("a", 1, 0.0, 1), 0.0).granted);
    // b's request finds both places held; it waits from t=1.0.
    assert!(!p.claim(&at("b", 0, 0.0, 1), 1.0).granted);
    // One of a's requests ends; a's own next request, newer than b's, asks first and is
    // refused: the place is kept for b's.
    p.claim(&claim("a", 1, 0, 2), 1.05);
    let newer = p.claim(&at("a", 1, 0.01, 1), 1.06);
    assert_eq!((newer.granted, newer.ahead), (false, 1));
    // b asks again and takes it.
    assert!(p.claim(&at("b", 0, 0.07, 1), 1.07).granted);
    // A class goes before any wait in a later one: b's batch request, waiting for five
    // seconds, and c's answer start, just arrived, both wait for a full engine.
    let mut p = Places::default();
    p.claim(&claim("a", 0, 2, 2), 10.0);
    assert!(!p.claim(&at("b", 0, 5.0, 2), 10.0).granted);
    assert!(!p.claim(&at("c", 0, 0.0, 0), 10.01).granted);
    p.claim(&claim("a", 1, 0, 2), 10.02);
    let batch = p.claim(&at("b", 0, 5.03, 2), 10.03);
    assert_eq!((batch.granted, batch.ahead), (false, 1), "kept for the answer's start");
    assert!(p.claim(&at("c", 0, 0.03, 0), 10.04).granted);
    // A waiter whose replica stopped asking (its request went elsewhere) holds nothing
    // back once it is stale.
    p.claim(&claim("a", 0, 0, 2), 10.05);
    assert!(!p.claim(&at("d", 0, 0.0, 2), 10.05).granted, "b's turn, while it still asks");
    let later = p.claim(&at("d", 0, 0.1, 2), 10.03 + WAITING_STALE_S + 0.01);
    assert_eq!((later.granted, later.ahead), (true, 0));
}

#[test]
fn a_refused_replica_learns_of_a_place_given_back_by_the_count_of_openings() {
    let mut p = Places::default();
    assert!(p.claim(&claim("a", 0, 2, 2), 0.0).granted);
    let refused = p.claim(&claim("b", 0, 1, 2), 0.01);
    assert!(!refused.granted);
    // Renewals and refusals open nothing: a waiting replica is not woken for them.
    p.claim(&claim("a", 2, 0, 2), 0.02);
    assert!(!p.claim(&claim("b", 0, 1, 2), 0.03).granted);
    assert_eq!(p.freed(), refused.freed);
    // One of a's requests ends: the count moves, and b's claim is granted.
    p.claim(&claim("a", 1, 0, 2), 0.04);
    assert_eq!(p.freed(), refused.freed + 1);
    assert!(p.claim(&claim("b", 0, 1, 2), 0.05).granted);
    // A grant takes a place and opens none.
    assert_eq!(p.freed(), refused.freed + 1);
}

#[test]
fn a_lapsed_holding_and_a_turn_no_one_asks_for_count_as_openings_as_time_passes() {
    let mut p = Places::default();
    p.claim(&Claim { lease_s: 1.0, ..claim("gone", 0, 3, 3) }, 0.0);
    assert!(!p.claim(&claim("b", 0, 1, 3), 0.5).granted);
    let seen = p.freed();
    // No message arrives; an engine holding b's wait tidies as time passes.
    p.tidy(0.7);
    assert_eq!(p.freed(), seen, "b asked 0.2 s ago: its turn stands, and the lease holds");
    p.tidy(0.5 + WAITING_STALE_S + 0.01);
    assert_eq!(p.freed(), seen + 1, "b's turn, no longer asked for");
    p.tidy(1.01);
    assert_eq!(p.freed(), seen + 4, "gone's three places lapsed");
    assert_eq!(p.total(1.01), 0);
}

#[test]
fn a_table_keeping_turns_longer_lets_them_go_stale_only_after_that() {
    let mut p = Places::keeping_turns_for(2.0);
    p.claim(&claim("a", 0, 1, 1), 0.0);
    assert!(!p.claim(&claim("b", 0, 1, 1), 0.0).granted);
    let seen = p.freed();
    p.tidy(WAITING_STALE_S + 0.5);
    assert_eq!(p.freed(), seen, "unasked for longer than the default, b's turn stands");
    p.tidy(2.01);
    assert_eq!(p.freed(), seen + 1, "and goes once the table's own time is up");
}

#[test]
fn a_turn_that_moves_back_opens_the_kept_place_to_the_waiter_it_went_before() {
    let mut p = Places::default();
    let at = |holder: &str, waited_s: f64| Claim { waited_s, ..claim(holder, 0, 1, 1) };
    p.claim(&claim("a", 0, 1, 1), 0.0);
    assert!(!p.claim(&at("b", 0.0), 0.0).granted);
    assert!(!p.claim(&at("c", 0.0), 0.01).granted);
    p.claim(&claim("a", 0, 0, 1), 0.02);
    let kept = p.claim(&at("c", 0.02), 0.03);
    assert_eq!((kept.granted, kept.ahead), (false, 1), "kept for b");
    // b's request left; its replica's next one asks, newer than c's: c goes first now,
    // and the count tells c so.
    let seen = p.freed();
    assert!(!p.claim(&at("b", 0.0), 0.04).granted);
    assert_eq!(p.freed(), seen + 1);
    // b asking again for the same request (its wait as before) moves nothing.
    assert!(!p.claim(&at("b", 0.01), 0.05).granted);
    assert_eq!(p.freed(), seen + 1);
    assert!(p.claim(&at("c", 0.05), 0.06).granted);
}

#[test]
fn a_withdrawn_turn_holds_nothing_back_and_wakes_the_waiter_it_went_before() {
    let mut p = Places::default();
    let at = |holder: &str, waited_s: f64| Claim { waited_s, ..claim(holder, 0, 1, 1) };
    p.claim(&claim("a", 0, 1, 1), 0.0);
    assert!(!p.claim(&at("b", 0.0), 0.0).granted);
    let after = p.claim(&at("c", 0.0), 0.01).freed;
    // a's request ends; the place is kept for b, whose request meanwhile got a place at
    // another engine.
    p.claim(&claim("a", 0, 0, 1), 0.02);
    assert_eq!(p.claim(&at("c", 0.02), 0.03).ahead, 1, "kept for b");
    assert!(!p.wakes(&wait_of(Some("c"), after)));
    // A report without the withdrawal keeps b's turn; with it, the turn goes at once (long
    // before it would go stale), and c's wait wakes.
    p.claim(&claim("b", 0, 0, 1), 0.04);
    assert_eq!(p.claim(&at("c", 0.04), 0.05).ahead, 1, "a plain report keeps the turn");
    p.claim(&Claim { withdraw: true, ..claim("b", 0, 0, 1) }, 0.06);
    assert!(p.wakes(&wait_of(Some("c"), after)));
    assert!(p.claim(&at("c", 0.07), 0.07).granted);
    // Withdrawing a turn not held, or with a place asked for, moves nothing.
    let seen = p.freed();
    p.claim(&Claim { withdraw: true, ..claim("d", 0, 0, 1) }, 0.08);
    assert_eq!(p.freed(), seen);
    let asked = p.claim(&Claim { withdraw: true, ..at("d", 0.0) }, 0.09);
    assert!(!asked.granted);
    assert_eq!(p.claim(&at("e", 0.0), 0.1).ahead, 1, "d's turn stands: it asked for a place");
    // Only a withdrawal carries the field, so a hook from before it reads every other claim.
    let plain = serde_json::to_string(&claim("b", 0, 0, 1)).unwrap();
    assert!(!plain.contains("withdraw"), "{plain}");
    let from_before: Claim = serde_json::from_str(&plain).unwrap();
    assert!(!from_before.withdraw);
    let withdrawal = serde_json::to_string(&Claim { withdraw: true, ..claim("b", 0, 0, 1) }).unwrap();
    assert!(withdrawal.contains(r#""withdraw":true"#), "{withdrawal}");
}

#[test]
fn every_replica_heard_within_its_lease_is_on_the_roster_holding_places_or_not() {
    let mut p = Places::default();
    let renew = |holder: &str| Claim { lease_s: 5.0, ..claim(holder, 0, 0, 8) };
    // Three replicas renew holding nothing (an idle fleet): none is in the places table,
    // every one is on the roster, and each learns its place by name.
    assert_eq!((p.claim(&renew("pod-c"), 0.0).replicas, p.claim(&renew("pod-c"), 0.0).rank), (1, 0));
    p.claim(&renew("pod-a"), 0.1);
    let b = p.claim(&renew("pod-b"), 0.2);
    assert_eq!((b.replicas, b.rank), (3, 1));
    let c = p.claim(&renew("pod-c"), 0.3);
    assert_eq!((c.replicas, c.rank), (3, 2));
    assert_eq!((p.holders(0.3), p.replicas(0.3)), (0, 3));
    // One holding places is on it as well, once.
    assert!(p.claim(&Claim { lease_s: 5.0, ..claim("pod-a", 0, 1, 8) }, 1.0).granted);
    assert_eq!(p.replicas(1.0), 3);
    // pod-a goes quiet: it leaves the roster when its lease runs out (its place with it),
    // and the others' answers say so; renewals keep the others on it.
    p.claim(&renew("pod-b"), 4.0);
    p.claim(&renew("pod-c"), 4.0);
    assert_eq!(p.replicas(5.9), 3);
    let b = p.claim(&renew("pod-b"), 6.1);
    assert_eq!((b.replicas, b.rank, b.total), (2, 0, 0));
    let c = p.claim(&renew("pod-c"), 6.1);
    assert_eq!((c.replicas, c.rank), (2, 1));
    // A new replica joins, and the ranks after it move up.
    let a2 = p.claim(&renew("pod-a2"), 6.2);
    assert_eq!((a2.replicas, a2.rank), (3, 0));
    assert_eq!(p.claim(&renew("pod-c"), 6.3).rank, 2);
}

fn wait_of(holder: Option<&str>, after: u64) -> PlacesWait {
    PlacesWait { after, wait_s: 1.0, holder: holder.map(str::to_owned) }
}

#[test]
fn a_freed_place_wakes_only_the_replica_whose_turn_it_keeps() {
    let mut p = Places::default();
    let at = |holder: &str, waited_s: f64| Claim { waited_s, ..claim(holder, 0, 1, 2) };
    p.claim(&claim("a", 0, 2, 2), 0.0);
    // Three replicas' requests find the engine full, b's first.
    let after = p.claim(&at("b", 0.0), 0.0).freed;
    p.claim(&at("c", 0.0), 0.01);
    p.claim(&at("d", 0.0), 0.02);
    let wakes = |p: &Places, h: &str| p.wakes(&wait_of(Some(h), after));
    assert!(!wakes(&p, "b") && !wakes(&p, "c") && !wakes(&p, "d"), "nothing freed");
    // One of a's requests ends: the place is b's, and only b is woken.
    p.claim(&claim("a", 1, 0, 2), 0.03);
    assert!(wakes(&p, "b"));
    assert!(!wakes(&p, "c") && !wakes(&p, "d"), "their claims would be refused: kept for b");
    // A wait that names no replica (a replica before the targeted wake) wakes at any opening.
    assert!(p.wakes(&wait_of(None, after)));
    // b takes it: still nothing for c or d.
    assert!(p.claim(&at("b", 0.04), 0.04).granted);
    assert!(!wakes(&p, "c") && !wakes(&p, "d"));
    // a's other request ends: c's turn.
    p.claim(&claim("a", 0, 0, 2), 0.05);
    assert!(wakes(&p, "c") && !wakes(&p, "d"));
    // c's replica stops asking (its request went elsewhere): once its turn is stale, the
    // place is d's.
    p.claim(&at("d", 0.04), 0.06);
    p.tidy(0.05 + WAITING_STALE_S + 0.01);
    assert!(wakes(&p, "d"));
    // Two places freed at once wake the two waiters they are kept for.
    let mut p = Places::default();
    p.claim(&claim("a", 0, 2, 2), 0.0);
    let after = p.claim(&at("b", 0.0), 0.0).freed;
    p.claim(&at("c", 0.0), 0.01);
    p.claim(&at("d", 0.0), 0.02);
    p.claim(&claim("a", 0, 0, 2), 0.03);
    let woken: Vec<bool> = ["b", "c", "d"].iter().map(|h| p.wakes(&wait_of(Some(h), after))).collect();
    assert_eq!(woken, [true, true, false]);
}

#[test]
fn a_wait_wakes_when_the_engine_started_again_and_not_before_anything_opened() {
    let p = Places::default();
    // A restarted engine's count is below what the replica saw: its room is worth asking.
    assert!(p.wakes(&wait_of(Some("b"), 7)));
    // Nothing opened since the refusal: held, for a named replica or not.
    assert!(!p.wakes(&wait_of(Some("b"), 0)) && !p.wakes(&wait_of(None, 0)));
    // A replica with no turn kept (never refused here, or stale) wakes at any opening.
    let mut p = Places::default();
    p.claim(&claim("a", 0, 1, 1), 0.0);
    p.claim(&claim("a", 0, 0, 1), 0.1);
    assert!(p.wakes(&wait_of(Some("unknown"), 0)));
    // The answer says whether it woke; an engine before the targeted wake did not say,
    // and woke only when its count moved.
    let old: PlacesFreed = serde_json::from_str(r#"{"freed":3}"#).unwrap();
    assert!(old.woke(2) && !old.woke(3));
    assert!(!PlacesFreed { freed: 3, woken: Some(false) }.woke(2));
    // A wait that names no holder reads and writes as before.
    let plain = serde_json::to_string(&wait_of(None, 1)).unwrap();
    assert_eq!(plain, r#"{"after":1,"wait_s":1.0}"#);
}

#[test]
fn a_wait_is_held_for_a_bounded_time() {
    let wait = |wait_s| PlacesWait { after: 0, wait_s, holder: None }.held_s();
    assert_eq!(wait(0.5), 0.5);
    assert_eq!(wait(-1.0), 0.0);
    assert_eq!(wait(f64::INFINITY), MAX_WAIT_S);
    assert_eq!(wait(f64::NAN), 0.0);
    // A message from an older replica (no count) still reads.
    let old: Granted = serde_json::from_str(r#"{"granted":false,"held":0,"total":2}"#).unwrap();
    assert_eq!((old.freed, old.ahead, old.replicas, old.rank), (0, 0, 0, 0));
}

/// One replica as the proxy runs it: the places it believes it holds, changed only by
/// a reply it received.
#[derive(Debug, Clone, Copy, Default)]
struct Replica {
    held: u32,
}

proptest::proptest! {
    /// Replicas claiming and ending requests in any order, some replies lost: the places
    /// the replicas believe they hold never pass the limit, and a claim is refused only
    /// when the engine's table, as the replicas last stated it, is full.
    #[test]
    fn replicas_never_hold_more_than_the_limit_together(
        limit in 1u32..12,
        ops in proptest::collection::vec((0usize..4, 0u8..3, proptest::bool::ANY), 1..300),
    ) {
        let mut places = Places::default();
        let mut replicas = [Replica::default(); 4];
        let names = ["r0", "r1", "r2", "r3"];
        for (step, (r, op, reply_lost)) in ops.into_iter().enumerate() {
            let now = step as f64 * 0.01;
            let me = replicas[r];
            match op {
                // A request wants a place.
                0 | 1 => {
                    let answer = places.claim(&claim(names[r], me.held, 1, limit), now);
                    let others: u32 = replicas.iter().enumerate().filter(|(i, _)| *i != r).map(|(_, x)| x.held).sum();
                    if !answer.granted {
                        // Refused only when the others' believed holdings, and the places
                        // kept for requests waiting before it, leave no room (the engine
                        // may count more for them: a lost reply to a grant).
                        proptest::prop_assert!(answer.total >= others + me.held);
                        proptest::prop_assert!(answer.total + answer.ahead + 1 > limit);
                    }
                    if answer.granted && !reply_lost {
                        replicas[r].held += 1;
                    }
                }
                // One of its requests ends; it reports.
                _ => {
                    if me.held > 0 {
                        replicas[r].held -= 1;
                        if !reply_lost {
                            places.claim(&claim(names[r], replicas[r].held, 0, limit), now);
                        }
                    }
                }
            }
            let believed: u32 = replicas.iter().map(|x| x.held).sum();
            proptest::prop_assert!(believed <= limit, "replicas hold {believed} of {limit}");
        }
    }

    /// Replicas whose requests wait (each its own wait, as the proxy states it) and end in
    /// any order: the count of openings never goes back, and a replica that was refused
    /// is granted only after the count has passed the one its refusal carried, so a
    /// replica that asks again only when woken by the count misses no place; and a wait
    /// naming the replica wakes exactly when its claim, asked again, is granted: no
    /// place goes unannounced, and no replica is woken to be refused.
    #[test]
    fn no_refused_replica_is_granted_a_place_the_count_did_not_announce(
        limit in 1u32..6,
        ops in proptest::collection::vec((0usize..4, 0u8..4), 1..300),
    ) {
        let mut places = Places::default();
        let mut held = [0u32; 4];
        let mut waiting_since: [Option<f64>; 4] = [None; 4];
        let mut refused_at: [Option<u64>; 4] = [None; 4];
        let mut asked_at: [Option<f64>; 4] = [None; 4];
        let names = ["r0", "r1", "r2", "r3"];
        let mut last = 0u64;
        for (step, (r, op)) in ops.into_iter().enumerate() {
            let now = step as f64 * 0.01;
            // Each replica's requests keep one class (r0 answers' starts, r1 and r3
            // interactive, r2 batch), as a request's class does not change while it waits.
            let class = [0u8, 1, 2, 1][r];
            match op {
                // A request asks (or asks again) for a place.
                0 | 1 => {
                    let since = *waiting_since[r].get_or_insert(now);
                    places.tidy(now);
                    let woken = refused_at[r]
                        .map(|after| places.wakes(&PlacesWait { after, wait_s: 1.0, holder: Some(names[r].into()) }));
                    let answer = places.claim(
                        &Claim { waited_s: now - since, class, ..claim(names[r], held[r], 1, limit) },
                        now,
                    );
                    if let Some(woken) = woken {
                        // A turn gone stale (its replica did not ask for a while) is
                        // woken at any opening, to ask and take its turn back.
                        let kept = asked_at[r].is_some_and(|at| at >= now - WAITING_STALE_S);
                        if kept {
                            proptest::prop_assert_eq!(woken, answer.granted, "woken, against the claim it prompts");
                        } else {
                            proptest::prop_assert!(woken || !answer.granted, "a grant no wake announced");
                        }
                    }
                    asked_at[r] = Some(now);
                    if answer.granted {
                        if let Some(seen) = refused_at[r] {
                            proptest::prop_assert!(answer.freed > seen,
                                "granted at count {} after a refusal at {seen}", answer.freed);
                        }
                        held[r] += 1;
                        waiting_since[r] = None;
                        refused_at[r] = None;
                    } else {
                        refused_at[r] = Some(answer.freed);
                    }
                }
                // One of its requests ends.
                2 => {
                    if held[r] > 0 {
                        held[r] -= 1;
                        places.claim(&claim(names[r], held[r], 0, limit), now);
                    }
                }
                // Its waiting request leaves (went elsewhere): it stops asking.
                _ => {
                    waiting_since[r] = None;
                    refused_at[r] = None;
                }
            }
            proptest::prop_assert!(places.freed() >= last, "the count went back");
            last = places.freed();
        }
    }
}
