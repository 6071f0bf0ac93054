//! Paged-KV block bookkeeping: the block pool (free list in eviction order, reference counts,
//! prefix-cache hashes) and the per-request [`KvManager`] the scheduler talks to.
//!
//! This is pure bookkeeping in the shape of vLLM v1's `BlockPool` / `KVCacheManager`: it hands
//! out block ids; the K/V bytes live in [`crate::kv::KvCache`], addressed through the block
//! tables kept here. Nothing here ever copies a block: a sequence grows by appending a fresh
//! block to its table once its last block is full.
//!
//! Prefix caching: once every token of a *full* block has been computed, the block is
//! registered under a hash of (parent block's hash, its token ids), so a later request whose
//! tokens start the same way reuses the block instead of recomputing it. A cached block whose
//! reference count drops to 0 stays in the free list with its hash and can still be hit until
//! the allocator takes it for reuse (eviction).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// Index of a block in the pool (and in [`crate::kv::KvCache`]).
pub type BlockId = u32;
/// Chained hash of a full block's tokens and everything before them.
pub type BlockHash = u64;
/// Requests are keyed by the scheduler's id.
pub type RequestId = u64;

/// Sentinel index of the free list's head/tail node (one past the last block).
const NIL: u32 = u32::MAX;

/// Hash of a full block given its parent's hash (`None` for a sequence's first block).
///
/// `DefaultHasher::new()` is SipHash with fixed keys, so the value is stable for the life of
/// the process, which is all a cache that lives in memory needs.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// What a cached block holds, kept so a hash hit can be verified token for token (a 64-bit hash
/// collision must never hand out the wrong K/V).
#[derive(Debug, Clone)]
struct CacheEntry {
    hash: BlockHash,
    parent: Option<BlockHash>,
    tokens: Box<[u32]>,
}

/// A broken invariant of a pool's bookkeeping: what [`BlockPool::check`] found first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("block pool inconsistent: {0}")]
pub struct PoolInconsistency(pub String);

/// Fixed set of KV blocks with reference counts, an LRU-ordered free list and a prefix cache.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    ref_cnt: Vec<u32>,
    /// Doubly linked free list threaded through the blocks, so a cached block that gets hit can
    /// leave the middle of the list in O(1). `NIL` ends the list.
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: usize,
    /// Set for blocks registered in the prefix cache (in use or free-but-evictable).
    cached: Vec<Option<CacheEntry>>,
    by_hash: HashMap<BlockHash, BlockId>,
}

impl BlockPool {
    /// A pool of blocks `0..num_blocks`, all free, in id order.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        // Ids are u32 and u32::MAX is the list sentinel.
        let n = num_blocks.min(NIL as usize);
        let mut pool = Self {
            block_size,
            ref_cnt: vec![0; n],
            prev: vec![NIL; n],
            next: vec![NIL; n],
            head: NIL,
            tail: NIL,
            num_free: 0,
            cached: vec![None; n],
            by_hash: HashMap::new(),
        };
        for b in 0..n as u32 {
            pool.push_free_tail(b);
        }
        pool
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks not referenced by any request (including evictable cached ones).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks currently registered in the prefix cache (used or free).
    pub fn num_cached(&self) -> usize {
        self.by_hash.len()
    }

    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_cnt.get(block as usize).copied().unwrap_or(0)
    }

    /// The prefix-cache hash of `block`, if it is registered.
    pub fn block_hash(&self, block: BlockId) -> Option<BlockHash> {
        self.cached.get(block as usize)?.as_ref().map(|e| e.hash)
    }

    /// The free list from the next block to be allocated to the last.
    pub fn free_list(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut b = self.head;
        while b != NIL && out.len() <= self.num_blocks() {
            out.push(b);
            b = self.next[b as usize];
        }
        out
    }

    fn push_free_tail(&mut self, b: BlockId) {
        let i = b as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn unlink_free(&mut self, b: BlockId) {
        let i = b as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.num_free -= 1;
    }

    /// Drops `block`'s prefix-cache registration (its contents are about to change).
    fn uncache(&mut self, block: BlockId) {
        if let Some(e) = self.cached[block as usize].take()
            && self.by_hash.get(&e.hash) == Some(&block)
        {
            self.by_hash.remove(&e.hash);
        }
    }

    /// Takes `n` blocks from the head of the free list (evicting any cached contents), each
    /// with reference count 1; `None`, with nothing taken, if fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let b = self.head;
            self.unlink_free(b);
            self.uncache(b);
            self.ref_cnt[b as usize] = 1;
            out.push(b);
        }
        Some(out)
    }

    /// Takes one more reference on each block (a prefix-cache hit); a block that was free
    /// leaves the free list so it cannot be evicted while in use.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            if self.ref_cnt[b as usize] == 0 {
                self.unlink_free(b);
            }
            self.ref_cnt[b as usize] += 1;
        }
    }

    /// Drops one reference on each block, in the order given; blocks reaching 0 go to the
    /// free-list tail (cached ones keep their hash until evicted).
    pub fn free(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        for b in blocks {
            let rc = &mut self.ref_cnt[b as usize];
            debug_assert!(*rc > 0, "block {b} freed with ref count 0");
            if *rc == 0 {
                continue;
            }
            *rc -= 1;
            if *rc == 0 {
                self.push_free_tail(b);
            }
        }
    }

    /// The cached block holding exactly `tokens` after the chain ending in `parent`.
    pub fn lookup(
        &self,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> Option<(BlockId, BlockHash)> {
        let hash = hash_block(parent, tokens);
        let &b = self.by_hash.get(&hash)?;
        let e = self.cached[b as usize].as_ref()?;
        (e.parent == parent && *e.tokens == *tokens).then_some((b, hash))
    }

    /// Registers a fully computed block under `hash`. If another block already holds the same
    /// contents this one stays unregistered (the duplicate is simply not shared).
    pub fn register(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) {
        if self.cached[block as usize].is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        self.by_hash.insert(hash, block);
        self.cached[block as usize] = Some(CacheEntry {
            hash,
            parent,
            tokens: tokens.into(),
        });
    }

    /// Forgets every prefix-cache registration (caching switched off): nothing stale can be hit
    /// later, and blocks in use are simply plain blocks from now on.
    pub fn clear_cache(&mut self) {
        self.by_hash.clear();
        self.cached.iter_mut().for_each(|c| *c = None);
    }

    /// Checks the pool's internal bookkeeping; a description of the first problem found.
    pub fn check(&self) -> Result<(), PoolInconsistency> {
        let list = self.free_list();
        if list.len() != self.num_free {
            return Err(PoolInconsistency(format!(
                "free list has {} blocks, count says {}",
                list.len(),
                self.num_free
            )));
        }
        let mut seen = vec![false; self.num_blocks()];
        for &b in &list {
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(PoolInconsistency(format!(
                    "block {b} twice in the free list"
                )));
            }
            if self.ref_cnt[b as usize] != 0 {
                return Err(PoolInconsistency(format!(
                    "free block {b} has ref count {}",
                    self.ref_cnt[b as usize]
                )));
            }
        }
        if let Some(b) = (0..self.num_blocks()).find(|&b| !seen[b] && self.ref_cnt[b] == 0) {
            return Err(PoolInconsistency(format!(
                "block {b} has ref count 0 but is not in the free list"
            )));
        }
        for (&h, &b) in &self.by_hash {
            match &self.cached[b as usize] {
                Some(e) if e.hash == h && hash_block(e.parent, &e.tokens) == h => {}
                _ => {
                    return Err(PoolInconsistency(format!(
                        "hash {h:x} maps to block {b} which does not hold it"
                    )));
                }
            }
        }
        let registered = self.cached.iter().filter(|c| c.is_some()).count();
        if registered != self.by_hash.len() {
            return Err(PoolInconsistency(format!(
                "{registered} blocks carry a hash, map has {}",
                self.by_hash.len()
            )));
        }
        Ok(())
    }
}

/// Blocks held by one request.
#[derive(Debug, Clone, Default)]
struct ReqBlocks {
    table: Vec<BlockId>,
    /// Chained hashes of the request's full, computed blocks, extended as it progresses.
    hashes: Vec<BlockHash>,
    /// Leading table blocks already registered in (or taken from) the prefix cache.
    num_cached: usize,
    /// Leading table blocks released because they left a sliding window
    /// ([`KvManager::drop_before`]); their table entries are never read again.
    num_dropped: usize,
}

/// Prefix-cache counters in tokens, as vLLM reports them (hit rate = hits / queries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Tokens of requests looked up in the cache.
    pub queries: u64,
    /// Of those, tokens found already computed.
    pub hits: u64,
}

/// Per-request block tables over a [`BlockPool`]: the narrow interface the scheduler uses.
#[derive(Debug, Clone)]
pub struct KvManager {
    pool: BlockPool,
    reqs: HashMap<RequestId, ReqBlocks>,
    prefix_caching: bool,
    stats: PrefixCacheStats,
}

impl KvManager {
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        Self {
            pool: BlockPool::new(num_blocks, block_size),
            reqs: HashMap::new(),
            prefix_caching,
            stats: PrefixCacheStats::default(),
        }
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Switches prefix caching. Turning it off forgets every registration, so blocks freed
    /// while it was off (or cached before) are never hit once it is back on; turning it on
    /// again registers running requests' full blocks as they advance.
    pub fn set_prefix_caching(&mut self, on: bool) {
        if self.prefix_caching && !on {
            self.pool.clear_cache();
            for r in self.reqs.values_mut() {
                r.hashes.clear();
                r.num_cached = 0;
            }
        }
        self.prefix_caching = on;
    }

    /// (blocks in use by some request, all blocks). Free cached blocks count as free.
    pub fn usage(&self) -> (usize, usize) {
        let total = self.pool.num_blocks();
        (total - self.pool.num_free(), total)
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Carries counters over from a pool being replaced.
    pub fn restore_prefix_cache_stats(&mut self, stats: PrefixCacheStats) {
        self.stats = stats;
    }

    /// Counts one admitted request's lookup (`hit_tokens` of its `query_tokens` were cached).
    pub fn record_prefix_query(&mut self, query_tokens: usize, hit_tokens: usize) {
        if self.prefix_caching {
            self.stats.queries += query_tokens as u64;
            self.stats.hits += hit_tokens as u64;
        }
    }

    /// Blocks needed to hold `num_tokens` token slots.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.pool.block_size().max(1))
    }

    /// The longest chain of cached full blocks matching the start of `tokens`, and how many
    /// tokens they cover. Never the whole sequence: at least one token is left to compute so
    /// the step yields logits to sample from. Empty when caching is off.
    pub fn computed_blocks(&self, tokens: &[u32]) -> (Vec<BlockId>, usize) {
        let bs = self.pool.block_size();
        if !self.prefix_caching || bs == 0 || tokens.is_empty() {
            return (Vec::new(), 0);
        }
        let max_blocks = (tokens.len() - 1) / bs;
        let mut blocks = Vec::new();
        let mut parent = None;
        for chunk in tokens.chunks_exact(bs).take(max_blocks) {
            match self.pool.lookup(parent, chunk) {
                Some((b, h)) => {
                    blocks.push(b);
                    parent = Some(h);
                }
                None => break,
            }
        }
        let n = blocks.len() * bs;
        (blocks, n)
    }

    /// Makes `id`'s table cover `num_total_tokens` slots, first appending `new_computed` (the
    /// prefix-cache hit from [`Self::computed_blocks`], for a request that holds no blocks yet)
    /// then fresh blocks. All or nothing: `None`, with nothing changed, when the free list is
    /// too short. On success, the number of fresh blocks taken.
    pub fn allocate_slots(
        &mut self,
        id: RequestId,
        num_total_tokens: usize,
        new_computed: &[BlockId],
    ) -> Option<usize> {
        debug_assert!(
            new_computed.is_empty() || self.block_table(id).is_empty(),
            "prefix hits only start a table"
        );
        let needed = self.blocks_for(num_total_tokens);
        let have = self.reqs.get(&id).map_or(0, |r| r.table.len()) + new_computed.len();
        let fresh = needed.saturating_sub(have);
        // A hit on a free cached block takes it off the free list too.
        let revived = new_computed
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        if fresh + revived > self.pool.num_free() {
            return None;
        }
        // Touch the hits before allocating so the allocator cannot evict them.
        self.pool.touch(new_computed);
        let blocks = self.pool.allocate(fresh)?;
        let r = self.reqs.entry(id).or_default();
        if r.table.is_empty() {
            r.num_cached = new_computed.len();
        }
        r.table.extend_from_slice(new_computed);
        r.table.extend(blocks);
        Some(fresh)
    }

    /// Registers `id`'s full blocks whose tokens are all computed (`tokens[..num_computed]`),
    /// so later requests can reuse them. No-op with caching off.
    pub fn cache_blocks(&mut self, id: RequestId, tokens: &[u32], num_computed: usize) {
        let bs = self.pool.block_size();
        if !self.prefix_caching || bs == 0 {
            return;
        }
        let Some(r) = self.reqs.get_mut(&id) else {
            return;
        };
        let full = (num_computed.min(tokens.len()) / bs).min(r.table.len());
        while r.hashes.len() < full {
            let i = r.hashes.len();
            let parent = r.hashes.last().copied();
            r.hashes
                .push(hash_block(parent, &tokens[i * bs..(i + 1) * bs]));
        }
        // A dropped block may already hold another request's tokens: never register it.
        for i in r.num_cached.max(r.num_dropped)..full {
            let parent = i.checked_sub(1).map(|p| r.hashes[p]);
            self.pool.register(
                r.table[i],
                r.hashes[i],
                parent,
                &tokens[i * bs..(i + 1) * bs],
            );
        }
        r.num_cached = r.num_cached.max(full);
    }

    /// Releases every block `id` holds. Blocks go to the free-list tail last block first, so a
    /// sequence's tail (least likely to be shared) is evicted before its prefix.
    pub fn free(&mut self, id: RequestId) {
        if let Some(r) = self.reqs.remove(&id) {
            self.pool
                .free(r.table[r.num_dropped..].iter().rev().copied());
        }
    }

    /// Releases `id`'s blocks past the first `num_tokens` positions (the slots of proposed
    /// tokens a speculative step rejected). Those blocks were never registered in the prefix
    /// cache (only computed, accepted tokens are), so they go back to the pool as plain free
    /// blocks. Returns how many were released.
    pub fn truncate(&mut self, id: RequestId, num_tokens: usize) -> usize {
        let keep = self.blocks_for(num_tokens);
        let Some(r) = self.reqs.get_mut(&id) else {
            return 0;
        };
        if r.table.len() <= keep {
            return 0;
        }
        let tail = r.table.split_off(keep.max(r.num_dropped));
        let n = tail.len();
        self.pool.free(tail.into_iter().rev());
        n
    }

    /// Releases `id`'s blocks wholly before position `first_pos`: with sliding-window
    /// attention in every layer, no later token reads them (vLLM frees them the same way). Their
    /// table entries stay, so positions keep their slots, but must never be read again: the
    /// caller passes a position no attention of this request will reach back past. Returns how
    /// many blocks were released.
    pub fn drop_before(&mut self, id: RequestId, first_pos: usize) -> usize {
        let bs = self.pool.block_size().max(1);
        let Some(r) = self.reqs.get_mut(&id) else {
            return 0;
        };
        let n = (first_pos / bs).min(r.table.len());
        if n <= r.num_dropped {
            return 0;
        }
        self.pool
            .free(r.table[r.num_dropped..n].iter().rev().copied());
        let released = n - r.num_dropped;
        r.num_dropped = n;
        released
    }

    /// `id`'s block table (empty if it holds no blocks; entries before a sliding window's edge
    /// may have been released, see [`Self::drop_before`]).
    pub fn block_table(&self, id: RequestId) -> &[BlockId] {
        self.reqs.get(&id).map_or(&[], |r| &r.table)
    }

    /// Ids of requests holding blocks.
    pub fn holders(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.reqs.keys().copied()
    }
}
