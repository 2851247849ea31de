use proptest::prelude::*;

use super::*;
use crate::Phase;

const BS: u32 = 4;

/// The tokens of a conversation's first `blocks` blocks: conversations share none.
fn tokens(conversation: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * BS).map(|i| conversation * 10_000 + i).collect()
}

/// Admits a request whose prompt is `prompt` and that will hold `total` blocks, and
/// caches the prompt's full blocks, as vLLM does once they are computed.
fn admit(pool: &mut KvPool, prompt: &[u32], total: u32) -> Option<(Held, Vec<BlockHash>)> {
    let hashes = block_hashes(None, prompt, BS);
    let held = pool.admit(&hashes, total, prompt.len() as u32)?;
    for (i, h) in hashes.iter().enumerate() {
        pool.cache(&held, i as u32, *h);
    }
    Some((held, hashes))
}

#[test]
fn a_block_is_named_by_every_token_before_it() {
    let a = block_hashes(None, &tokens(1, 3), BS);
    let mut other = tokens(1, 3);
    other[0] = 7;
    let b = block_hashes(None, &other, BS);
    assert_eq!(a.len(), 3);
    assert!(
        a.iter().zip(&b).all(|(x, y)| x != y),
        "a change in the first block renames every block after it"
    );
    assert_eq!(block_hashes(None, &tokens(1, 3)[..10], BS).len(), 2, "a block not yet full has no name");
    let tail = block_hashes(Some(a[0]), &tokens(1, 3)[4..], BS);
    assert_eq!(tail, a[1..], "hashing on from a block's name gives the same chain");
}

#[test]
fn a_request_hits_the_cached_blocks_of_its_prefix_and_counts_them_as_vllm_does() {
    let mut pool = KvPool::new(8, BS, Eviction::Lru);
    let (first, _) = admit(&mut pool, &tokens(1, 3), 4).unwrap();
    pool.release(first, |_| Tier::OutputCritical);
    let mut next = tokens(1, 2);
    next.extend([99; 8]); // the same first two blocks, then new ones
    let (second, _) = admit(&mut pool, &next, 5).unwrap();
    assert_eq!(second.hit_blocks(), 2);
    let c = pool.counters();
    assert_eq!((c.queried_tokens, c.hit_tokens), (12 + 16, 8));
    assert_eq!(pool.free(), 8 - 5);
}

#[test]
fn a_request_the_pool_cannot_hold_changes_nothing() {
    let mut pool = KvPool::new(4, BS, Eviction::ByTier);
    let (held, _) = admit(&mut pool, &tokens(1, 2), 3).unwrap();
    let before = (pool.free(), pool.counters(), pool.free_order());
    assert!(pool.admit(&block_hashes(None, &tokens(2, 2), BS), 2, 8).is_none());
    assert_eq!((pool.free(), pool.counters(), pool.free_order()), before);
    pool.release(held, |_| Tier::OutputCritical);
    assert_eq!(pool.free(), 4);
}

/// Two requests that thought and finished, A before B, then a request that needs two
/// fresh blocks: which of A's prompt blocks survive for A's next turn.
fn next_turn_hits(eviction: Eviction) -> u32 {
    let mut pool = KvPool::new(6, BS, eviction);
    for conversation in [1, 2] {
        // Two prompt blocks, one block of thought (it and all after it can never be hit).
        let (held, _) = admit(&mut pool, &tokens(conversation, 2), 3).unwrap();
        let thought = block_hashes(None, &tokens(conversation + 100, 3), BS)[2];
        pool.cache(&held, 2, thought);
        let released = Released::Finished { thought: true };
        pool.release(held, |i| tier_at_release(i, 2 * BS, BS, released));
    }
    let filler = admit(&mut pool, &tokens(3, 2), 2).unwrap();
    let hits = pool.cached_prefix(&block_hashes(None, &tokens(1, 2), BS));
    drop(filler);
    hits
}

#[test]
fn stock_lru_evicts_an_older_prompt_before_a_newer_dead_thought_and_the_tiers_do_not() {
    assert_eq!(next_turn_hits(Eviction::Lru), 1, "LRU took A's thought and then A's own prompt block");
    assert_eq!(next_turn_hits(Eviction::ByTier), 2, "by tier, both dead thoughts went first");
    assert_eq!(next_turn_hits(Eviction::DeadFirst), 2, "the hook's way, both dead thoughts went first");
}

#[test]
fn the_hooks_way_evicts_the_thought_finished_last_first_in_block_order() {
    let mut pool = KvPool::new(6, BS, Eviction::DeadFirst);
    let mut held = Vec::new();
    for conversation in [1, 2] {
        // One prompt block, then two blocks of thought.
        let (h, _) = admit(&mut pool, &tokens(conversation, 1), 3).unwrap();
        let thought = block_hashes(None, &tokens(conversation + 100, 3), BS);
        pool.cache(&h, 1, thought[1]);
        pool.cache(&h, 2, thought[2]);
        held.push(h);
    }
    let (a, b) = (held[0].blocks.clone(), held[1].blocks.clone());
    let released = Released::Finished { thought: true };
    for h in held {
        pool.release(h, |i| tier_at_release(i, BS, BS, released));
    }
    // B's thought (block order), A's thought, then the prompts as LRU left them.
    assert_eq!(pool.free_order(), vec![b[1], b[2], a[1], a[2], a[0], b[0]]);
}

/// One step of a random workload.
#[derive(Debug, Clone)]
enum Op {
    /// A request of conversation `conversation` whose prompt is its first `prompt`
    /// blocks (conversations share their first blocks), holding `extra` blocks more.
    Admit { conversation: u32, prompt: u32, extra: u32 },
    /// The `which`-th held request gives its blocks back.
    Release { which: usize, released: Released },
}

fn op() -> impl Strategy<Value = Op> {
    let released = prop_oneof![
        any::<bool>().prop_map(|thought| Released::Finished { thought }),
        Just(Released::Preempted(Phase::Think)),
        Just(Released::Preempted(Phase::Output)),
    ];
    prop_oneof![
        (0u32..4, 1u32..5, 0u32..4).prop_map(|(conversation, prompt, extra)| Op::Admit {
            conversation,
            prompt,
            extra
        }),
        (0usize..8, released).prop_map(|(which, released)| Op::Release { which, released }),
    ]
}

/// The rule the pool must follow, kept the plain way: every free block with its place in
/// eviction order, found by sorting.
#[derive(Default)]
struct Reference {
    /// (block, queue, position) of each free block; lower sorts first.
    free: Vec<(u32, usize, i64)>,
    clock: i64,
}

impl Reference {
    fn order(&self) -> Vec<u32> {
        let mut f = self.free.clone();
        f.sort_by_key(|&(_, q, pos)| (q, pos));
        f.into_iter().map(|(id, _, _)| id).collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn eviction_follows_the_tiers_and_the_pool_agrees_with_the_plain_rule(
        ops in prop::collection::vec(op(), 1..80),
        mode in 0u8..3,
    ) {
        let eviction = [Eviction::Lru, Eviction::ByTier, Eviction::DeadFirst][mode as usize];
        let by_tier = eviction == Eviction::ByTier;
        let capacity = 12;
        let mut pool = KvPool::new(capacity, BS, eviction);
        let mut reference = Reference { free: (0..capacity).map(|id| (id, 0, i64::from(id))).collect(), clock: 100 };
        let mut held: Vec<(Held, u32)> = Vec::new();
        for op in ops {
            match op {
                Op::Admit { conversation, prompt, extra } => {
                    let evicted_before = pool.counters().evicted;
                    let order_before = reference.order();
                    let Some((h, _)) = admit(&mut pool, &tokens(conversation, prompt), prompt + extra) else {
                        continue;
                    };
                    // The plain rule: the hit blocks leave the free list, and the fresh
                    // ones are the first of what remains, in order.
                    let (hits, fresh) = h.blocks.split_at(h.hit_blocks() as usize);
                    let expected: Vec<u32> =
                        order_before.iter().copied().filter(|id| !hits.contains(id)).take(fresh.len()).collect();
                    prop_assert_eq!(fresh, &expected[..], "fresh blocks come from the front of the free queues");
                    reference.free.retain(|(id, _, _)| !h.blocks.contains(id));
                    // No output-critical block went while a lower tier still held one.
                    let evicted = pool.counters().evicted;
                    if by_tier && evicted[2] > evicted_before[2] {
                        let left = pool.free_cached_by_tier();
                        prop_assert_eq!((left[0], left[1]), (0, 0), "an output-critical block went first");
                    }
                    held.push((h, prompt * BS));
                }
                Op::Release { which, released } => {
                    if held.is_empty() {
                        continue;
                    }
                    let (h, prompt_tokens) = held.remove(which % held.len());
                    let still_held: Vec<u32> = held.iter().flat_map(|(o, _)| o.blocks.clone()).collect();
                    for (index, &id) in h.blocks.iter().enumerate().rev() {
                        if still_held.contains(&id) || h.blocks[..index].contains(&id) {
                            continue;
                        }
                        let cached = pool.blocks[id as usize].hash.is_some();
                        let tier = tier_at_release(index as u32, prompt_tokens, BS, released) as usize;
                        reference.clock += 1;
                        let place = match (eviction, cached) {
                            (Eviction::Lru, _) => (0, reference.clock),
                            (Eviction::ByTier, false) => (0, -reference.clock),
                            (Eviction::ByTier, true) => (tier, reference.clock),
                            (Eviction::DeadFirst, true) if tier == 0 => (0, -reference.clock),
                            (Eviction::DeadFirst, _) => (0, reference.clock),
                        };
                        reference.free.push((id, place.0, place.1));
                    }
                    pool.release(h, |i| tier_at_release(i, prompt_tokens, BS, released));
                }
            }
            prop_assert_eq!(pool.free_order(), reference.order());
            prop_assert_eq!(pool.free() as usize, reference.free.len());
            let held_blocks: u32 = held.iter().map(|(h, _)| h.len()).sum::<u32>();
            prop_assert!(held_blocks >= capacity - pool.free(), "every block held is counted once");
            if by_tier {
                // Read front to back, the free cached blocks' tiers never go down.
                let tiers: Vec<Tier> = pool
                    .free_order()
                    .iter()
                    .filter(|id| pool.blocks[**id as usize].hash.is_some())
                    .map(|id| pool.blocks[*id as usize].tier)
                    .collect();
                prop_assert!(tiers.windows(2).all(|w| w[0] <= w[1]), "{:?}", tiers);
            }
            for conversation in 0..4 {
                let hashes = block_hashes(None, &tokens(conversation, 4), BS);
                let n = pool.cached_prefix(&hashes) as usize;
                prop_assert!(hashes[..n].iter().all(|h| pool.holds(*h)));
            }
        }
    }
}

/// A pool of `capacity` blocks (LRU) with an offload store of `stored` blocks below it.
fn offloading(capacity: u32, stored: u32, rule: OffloadRule) -> KvPool {
    KvPool::new(capacity, BS, Eviction::Lru).with_offload(Offload::new(stored, rule))
}

#[test]
fn a_prefix_the_pool_evicted_comes_back_from_the_offload_store_not_computed_again() {
    let mut pool = offloading(4, 8, OffloadRule::All);
    let (first, _) = admit(&mut pool, &tokens(1, 3), 3).unwrap();
    pool.release(first, |_| Tier::OutputCritical);
    // Another conversation takes all four blocks: the first one's three are evicted.
    let (filler, _) = admit(&mut pool, &tokens(2, 4), 4).unwrap();
    assert_eq!(pool.counters().offloaded, 3);
    pool.release(filler, |_| Tier::OutputCritical);
    // Its next turn: nothing in the pool, three blocks copied back up, one computed.
    let mut next = tokens(1, 3);
    next.extend([7; 4]);
    let hashes = block_hashes(None, &next, BS);
    let again = pool.admit(&hashes, 4, next.len() as u32).unwrap();
    assert_eq!((again.hit_blocks(), again.ingested_blocks()), (0, 3));
    let c = pool.counters();
    assert_eq!((c.ingested, c.hit_tokens), (3, 0), "a copy from below is no prefix-cache hit");
    for (i, hash) in hashes.iter().enumerate().take(3) {
        assert_eq!(
            pool.blocks[again.blocks[i] as usize].hash,
            Some(*hash),
            "block {i} cached again in place"
        );
    }
    assert_eq!(pool.blocks[again.blocks[3] as usize].hash, None, "the computed block waits to be cached");
    // Without the store, the same requests compute everything again.
    let mut plain = KvPool::new(4, BS, Eviction::Lru);
    let (f, _) = admit(&mut plain, &tokens(1, 3), 3).unwrap();
    plain.release(f, |_| Tier::OutputCritical);
    let (g, _) = admit(&mut plain, &tokens(2, 4), 4).unwrap();
    plain.release(g, |_| Tier::OutputCritical);
    let (h, _) = admit(&mut plain, &next, 4).unwrap();
    assert_eq!((h.hit_blocks(), h.ingested_blocks()), (0, 0));
}

#[test]
fn finished_thoughts_are_not_copied_down_under_the_skip_dead_rule() {
    for (rule, stored) in [(OffloadRule::All, 3), (OffloadRule::SkipDead, 1)] {
        let mut pool = offloading(3, 8, rule);
        // One prompt block, then two blocks of a finished thought (think-complete).
        let (held, _) = admit(&mut pool, &tokens(1, 1), 3).unwrap();
        let thought = block_hashes(None, &tokens(101, 3), BS);
        pool.cache(&held, 1, thought[1]);
        pool.cache(&held, 2, thought[2]);
        let released = Released::Finished { thought: true };
        pool.release(held, |i| tier_at_release(i, BS, BS, released));
        let _filler = admit(&mut pool, &tokens(2, 3), 3).unwrap();
        assert_eq!(pool.counters().offloaded, stored, "{rule:?}");
        assert!(
            pool.offload().unwrap().holds(block_hashes(None, &tokens(1, 1), BS)[0]),
            "the prompt went down"
        );
    }
}

#[test]
fn the_offload_store_forgets_its_least_recently_used_block_first() {
    let mut store = Offload::new(2, OffloadRule::All);
    let [a, b, c] = [BlockHash(1), BlockHash(2), BlockHash(3)];
    assert!(store.store(a, Tier::OutputCritical) && store.store(b, Tier::ThinkActive));
    assert_eq!(store.ingest_prefix(&[a, c], 2), 1, "a is used again, b is now the oldest");
    store.unpin();
    assert!(store.store(c, Tier::OutputCritical));
    assert!(store.holds(a) && store.holds(c) && !store.holds(b));
    assert_eq!(store.len(), 2);
    assert!(!store.store(c, Tier::OutputCritical), "held already: marked used, not copied again");
    assert!(!Offload::new(0, OffloadRule::All).store(a, Tier::OutputCritical), "no room at all");
    // Only a run from the first counts: a prefix cannot skip a block it lacks.
    assert_eq!(store.ingest_prefix(&[b, c], 2), 0, "b is gone, so c cannot follow");
    assert_eq!(store.ingest_prefix(&[c, b, a], 1), 1, "at most what the admission needs");
    store.unpin();
    // While an admission copies blocks up they are pinned: no newcomer pushes them out.
    assert_eq!(store.ingest_prefix(&[a, c], 2), 2);
    assert!(!store.store(b, Tier::OutputCritical), "every block pinned: no room");
    store.unpin();
    assert!(store.store(b, Tier::OutputCritical));
}

#[test]
fn an_admission_keeps_the_blocks_it_copies_up_though_its_own_evictions_fill_the_store() {
    // A pool of 4, a store of 2: A's two blocks go down when B fills the pool; A's next
    // turn copies them up while its fresh blocks evict all four of B's.
    let mut pool = offloading(4, 2, OffloadRule::All);
    let (a, a_hashes) = admit(&mut pool, &tokens(1, 2), 2).unwrap();
    pool.release(a, |_| Tier::OutputCritical);
    let (b, _) = admit(&mut pool, &tokens(2, 4), 4).unwrap();
    pool.release(b, |_| Tier::OutputCritical);
    let held = pool.admit(&a_hashes, 4, 2 * BS).unwrap();
    assert_eq!(held.ingested_blocks(), 2);
    let store = pool.offload().unwrap();
    assert!(a_hashes.iter().all(|h| store.holds(*h)), "the blocks copied up were not forgotten mid-copy");
    assert!(store.len() <= 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn ingested_blocks_continue_the_cached_prefix_and_the_store_keeps_its_bound(
        ops in prop::collection::vec(op(), 1..80),
        stored in 0u32..10,
        skip_dead in any::<bool>(),
    ) {
        let rule = if skip_dead { OffloadRule::SkipDead } else { OffloadRule::All };
        let mut pool = offloading(12, stored, rule);
        let mut held: Vec<(Held, u32)> = Vec::new();
        let mut thoughts: Vec<BlockHash> = Vec::new();
        for op in ops {
            match op {
                Op::Admit { conversation, prompt, extra } => {
                    let total = prompt + extra;
                    let hashes = block_hashes(None, &tokens(conversation, prompt), BS);
                    // What the pool holds of the prefix, then what the store holds next.
                    let hit = pool.cached_prefix(&hashes).min(total);
                    let store = pool.offload().unwrap().clone();
                    let up = hashes[hit as usize..].iter().take_while(|h| store.holds(**h)).count() as u32;
                    let Some(h) = pool.admit(&hashes, total, prompt * BS) else { continue };
                    prop_assert_eq!((h.hit_blocks(), h.ingested_blocks()), (hit, up.min(total - hit)));
                    for i in 0..h.ingested_blocks() {
                        let id = h.blocks[(hit + i) as usize];
                        prop_assert_eq!(pool.blocks[id as usize].hash, Some(hashes[(hit + i) as usize]));
                    }
                    for (i, x) in hashes.iter().enumerate() {
                        pool.cache(&h, i as u32, *x);
                    }
                    // A thought's block after the prompt: think-complete once it finishes.
                    if extra > 0 {
                        let thought = block_hashes(hashes.last().copied(), &[conversation + 50_000; BS as usize], BS)[0];
                        pool.cache(&h, prompt, thought);
                        thoughts.push(thought);
                    }
                    held.push((h, prompt * BS));
                }
                Op::Release { which, released } => {
                    if held.is_empty() {
                        continue;
                    }
                    let (h, prompt_tokens) = held.remove(which % held.len());
                    pool.release(h, |i| tier_at_release(i, prompt_tokens, BS, released));
                }
            }
            let store = pool.offload().unwrap();
            prop_assert!(store.len() <= stored, "{} stored, room for {}", store.len(), stored);
            let c = pool.counters();
            prop_assert!(c.offloaded <= c.evicted.iter().sum::<u64>());
            if skip_dead {
                prop_assert!(c.offloaded <= c.evicted[1] + c.evicted[2], "a think-complete block went down");
            }
        }
    }
}
