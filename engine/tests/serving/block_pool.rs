//! Block pool and KV manager: eviction order, prefix-cache hits, all-or-nothing allocation, and
//! a property test that checks every prefix-cache hit hands back blocks holding exactly the
//! requested tokens, with reference counts matching the block tables.

use std::collections::HashMap;

use proptest::prelude::*;
use tpslab_engine::kv::block_pool::{BlockPool, KvManager, RequestId, hash_block};

#[test]
fn block_pool_evicts_least_recently_freed_and_revives_hits() {
    let mut p = BlockPool::new(4, 2);
    let a = p.allocate(3).expect("free");
    assert_eq!(a, vec![0, 1, 2]);
    assert!(p.allocate(2).is_none(), "all or nothing");
    assert_eq!(p.num_free(), 1);
    let h = hash_block(None, &[1, 2]);
    p.register(0, h, None, &[1, 2]);
    p.free([2, 1, 0]);
    assert_eq!(p.free_list(), vec![3, 2, 1, 0]);
    assert_eq!(
        p.lookup(None, &[1, 2]),
        Some((0, h)),
        "free cached blocks can be hit"
    );
    assert_eq!(
        p.lookup(Some(h), &[1, 2]),
        None,
        "the parent is part of the key"
    );
    p.touch(&[0]);
    assert_eq!(p.free_list(), vec![3, 2, 1]);
    p.free([0]);
    // Taking every block evicts the cached one last, and forgets it.
    let all = p.allocate(4).expect("free");
    assert_eq!(all, vec![3, 2, 1, 0]);
    assert_eq!(p.lookup(None, &[1, 2]), None);
    p.check().expect("consistent");
}

#[test]
fn kv_manager_allocation_is_all_or_nothing() {
    let mut kv = KvManager::new(3, 4, true);
    assert_eq!(kv.allocate_slots(1, 8, &[]), Some(2));
    assert_eq!(kv.allocate_slots(2, 8, &[]), None);
    assert!(kv.block_table(2).is_empty());
    assert_eq!(kv.usage(), (2, 3));
    assert_eq!(kv.allocate_slots(1, 9, &[]), Some(1));
    assert_eq!(
        kv.allocate_slots(1, 12, &[]),
        Some(0),
        "last block has room"
    );
    kv.free(1);
    assert_eq!(kv.usage(), (0, 3));
    kv.pool().check().expect("consistent");
}

#[derive(Debug, Clone)]
enum Op {
    /// Start request from token stream `seq` (a prefix of length `len`), using cache hits.
    Start {
        seq: usize,
        len: usize,
    },
    /// Grow a live request by `n` computed tokens.
    Grow {
        pick: usize,
        n: usize,
    },
    Free(usize),
    Caching(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..3, 1usize..40).prop_map(|(seq, len)| Op::Start { seq, len }),
        4 => (any::<usize>(), 1usize..12).prop_map(|(pick, n)| Op::Grow { pick, n }),
        2 => any::<usize>().prop_map(Op::Free),
        1 => any::<bool>().prop_map(Op::Caching),
    ]
}

/// A live request in the model: its tokens and how many are computed (written to its blocks).
struct Live {
    tokens: Vec<u32>,
    computed: usize,
}

proptest! {
    #[test]
    fn hits_hold_the_right_tokens_and_refs_match_tables(
        num_blocks in 1usize..24,
        block_size in 1usize..6,
        seqs in prop::collection::vec(prop::collection::vec(0u32..3, 60), 3),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut kv = KvManager::new(num_blocks, block_size, true);
        // What each block slot holds: written by the request that owns the block privately.
        let mut content: Vec<Option<u32>> = vec![None; num_blocks * block_size];
        let mut live: HashMap<RequestId, Live> = HashMap::new();
        let mut next: RequestId = 0;
        for op in ops {
            match op {
                Op::Start { seq, len } => {
                    let tokens = seqs[seq][..len].to_vec();
                    let (hits, n) = kv.computed_blocks(&tokens);
                    prop_assert!(n < tokens.len());
                    prop_assert_eq!(n, hits.len() * block_size);
                    for (i, &b) in hits.iter().enumerate() {
                        for j in 0..block_size {
                            let slot = b as usize * block_size + j;
                            prop_assert_eq!(content[slot], Some(tokens[i * block_size + j]));
                        }
                    }
                    next += 1;
                    let want = (n + 1).min(tokens.len());
                    if kv.allocate_slots(next, want, &hits).is_some() {
                        live.insert(next, Live { tokens, computed: n });
                    } else {
                        prop_assert!(kv.block_table(next).is_empty());
                    }
                }
                Op::Grow { pick, n } => {
                    let mut ids: Vec<_> = live.keys().copied().collect();
                    ids.sort_unstable();
                    let Some(&id) = ids.get(pick % ids.len().max(1)) else { continue };
                    let r = live.get_mut(&id).expect("live");
                    let end = (r.computed + n).min(r.tokens.len());
                    if kv.allocate_slots(id, end, &[]).is_none() {
                        continue;
                    }
                    let table = kv.block_table(id);
                    for pos in r.computed..end {
                        let b = table[pos / block_size];
                        prop_assert_eq!(kv.pool().ref_count(b), 1, "writes a shared block");
                        prop_assert_eq!(kv.pool().block_hash(b), None, "writes a cached block");
                        content[b as usize * block_size + pos % block_size] = Some(r.tokens[pos]);
                    }
                    r.computed = end;
                    kv.cache_blocks(id, &r.tokens, end);
                }
                Op::Free(pick) => {
                    let mut ids: Vec<_> = live.keys().copied().collect();
                    ids.sort_unstable();
                    if let Some(&id) = ids.get(pick % ids.len().max(1)) {
                        kv.free(id);
                        live.remove(&id);
                    }
                }
                Op::Caching(on) => kv.set_prefix_caching(on),
            }
            kv.pool().check().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut refs = vec![0u32; num_blocks];
            for id in kv.holders() {
                prop_assert!(live.contains_key(&id));
                for &b in kv.block_table(id) {
                    refs[b as usize] += 1;
                }
            }
            for (b, &r) in refs.iter().enumerate() {
                prop_assert_eq!(kv.pool().ref_count(b as u32), r);
            }
            let used = refs.iter().filter(|&&r| r > 0).count();
            prop_assert_eq!(kv.usage(), (used, num_blocks));
        }
        for id in live.keys() {
            kv.free(*id);
        }
        prop_assert_eq!(kv.usage(), (0, num_blocks));
        prop_assert_eq!(kv.pool().free_list().len(), num_blocks);
    }
}
