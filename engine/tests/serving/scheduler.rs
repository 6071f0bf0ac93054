//! Scheduler and KV block bookkeeping: unit tests of the policies, and a property test that
//! drives random workloads through a simulated model whose "KV cache" is a hash chain stored in
//! the paged slots, so any wrong block table, early eviction or lost token changes the output.
//! With speculation on, a fake proposer guesses each decoding request's next tokens (some right,
//! some wrong) and the fake model verifies them: a rejected proposal's slot that stayed counted
//! as computed, or entered the prefix cache, changes the output too.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::sched::{
    ClientId, Policy, RequestId, RequestStatus, SchedError, SchedRequest, Scheduler,
    SchedulerConfig, SchedulerOutput,
};

// ---------------------------------------------------------------------------------------------
// The fake model: the K/V of position p is mix(K/V of p-1, token, p), so the value read at the
// last position depends on every earlier token exactly as stored through the block table.

const VOCAB: u64 = 5;
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(prev: u64, token: u32, pos: usize) -> u64 {
    let mut x = prev ^ (u64::from(token) << 32) ^ pos as u64;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The deterministic "sampler": keyed by the request and the model state at its last position.
fn fake_sample(id: RequestId, state: u64) -> u32 {
    (mix(state, id as u32, (id >> 32) as usize) % VOCAB) as u32
}

/// What a request generates when run alone with no batching, paging or preemption.
fn alone(id: RequestId, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut state = SEED;
    let mut pos = 0;
    for &t in prompt {
        state = mix(state, t, pos);
        pos += 1;
    }
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let t = fake_sample(id, state);
        out.push(t);
        state = mix(state, t, pos);
        pos += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The simulated engine loop.

struct Track {
    prompt: Vec<u32>,
    max_tokens: usize,
    generated: Vec<u32>,
    expected: Vec<u32>,
}

struct Sim {
    sched: Scheduler,
    config: SchedulerConfig,
    /// Fake KV storage: one value per token slot; `None` = never written.
    slots: Vec<Option<u64>>,
    live: HashMap<RequestId, Track>,
    finished: HashMap<RequestId, (FinishReason, Track)>,
    refused: HashSet<RequestId>,
    next_id: RequestId,
    steps: usize,
    /// Speculation: (most proposed tokens per step, percent of proposals that guess right).
    spec: Option<(usize, u64)>,
    /// Proposed and accepted tokens so far.
    spec_counts: (usize, usize),
}

impl Sim {
    fn new(config: SchedulerConfig, num_blocks: usize, block_size: usize) -> Self {
        let sched = Scheduler::new(config.clone(), num_blocks, block_size).expect("valid");
        Self {
            sched,
            config,
            slots: vec![None; num_blocks * block_size],
            live: HashMap::new(),
            finished: HashMap::new(),
            refused: HashSet::new(),
            next_id: 1,
            steps: 0,
            spec: None,
            spec_counts: (0, 0),
        }
    }

    /// Proposals for every decoding request: each token the right continuation with the
    /// configured odds, else a random one; lengths vary with the step.
    fn propose(&mut self) {
        let Some((k, hit)) = self.spec else {
            return;
        };
        for (id, room) in self.sched.decode_ready() {
            let t = &self.live[&id];
            let n = t.generated.len();
            let r = mix(SEED, id as u32, self.steps);
            let len = ((r % (k as u64 + 1)) as usize).min(room);
            let draft: Vec<u32> = (0..len)
                .map(|i| {
                    let r = mix(r, i as u32, n);
                    match t.expected.get(n + i) {
                        Some(&e) if r % 100 < hit => e,
                        _ => ((r >> 8) % VOCAB) as u32,
                    }
                })
                .collect();
            self.sched.set_draft(id, draft);
        }
    }

    fn block_size(&self) -> usize {
        self.sched.kv().block_size()
    }

    fn num_blocks(&self) -> usize {
        self.sched.kv().pool().num_blocks()
    }

    fn submit(&mut self, prompt: Vec<u32>, max_tokens: usize, priority: i32) {
        // Ids far apart in their high bits too, so the sampler differs per request.
        let id = self.next_id.wrapping_mul(0x1_0000_0001);
        self.next_id += 1;
        let need = (prompt.len() + max_tokens - 1).div_ceil(self.block_size());
        let queue_full = self
            .config
            .max_waiting
            .is_some_and(|m| self.sched.stats().waiting >= m);
        let res = self.sched.add_request(SchedRequest {
            id,
            prompt: prompt.clone(),
            max_tokens,
            priority,
            // Three clients, so fair shares preempt too.
            client: ClientId(self.next_id % 3),
            prompt_rows: false,
            whole_prompt: false,
        });
        match res {
            Ok(()) => {
                assert!(
                    !queue_full && need <= self.num_blocks(),
                    "should have been refused"
                );
                let expected = alone(id, &prompt, max_tokens);
                let t = Track {
                    prompt,
                    max_tokens,
                    generated: Vec::new(),
                    expected,
                };
                self.live.insert(id, t);
            }
            Err(SchedError::QueueFull { .. }) => {
                assert!(queue_full);
                self.refused.insert(id);
            }
            Err(SchedError::TooLong { .. }) => {
                assert!(!queue_full && need > self.num_blocks());
                self.refused.insert(id);
            }
            Err(e) => panic!("unexpected refusal: {e}"),
        }
    }

    fn end(&mut self, id: RequestId, reason: FinishReason) {
        if let Some(t) = self.live.remove(&id) {
            let prev = self.finished.insert(id, (reason, t));
            assert!(prev.is_none(), "request {id} finished twice");
        }
    }

    fn cancel(&mut self, pick: usize, reason: FinishReason) {
        let mut ids: Vec<RequestId> = self.live.keys().copied().collect();
        ids.sort_unstable();
        if ids.is_empty() {
            return;
        }
        let id = ids[pick % ids.len()];
        let removed = self.sched.finish(&[id], reason);
        assert_eq!(removed, vec![id]);
        self.end(id, reason);
        // Unknown ids are ignored.
        assert!(self.sched.finish(&[id], reason).is_empty());
    }

    fn set_config(&mut self, config: SchedulerConfig) {
        self.sched.set_config(config.clone()).expect("valid config");
        self.config = config;
    }

    fn rebuild(&mut self, num_blocks: usize, block_size: usize) {
        let aborted = self
            .sched
            .rebuild_pool(num_blocks, block_size)
            .expect("valid pool");
        self.slots = vec![None; num_blocks * block_size];
        for id in aborted {
            let t = &self.live[&id];
            let need = (t.prompt.len() + t.max_tokens - 1).div_ceil(block_size);
            assert!(need > num_blocks, "request {id} aborted though it fits");
            self.end(id, FinishReason::Abort);
        }
    }

    /// Runs the fake forward pass over `out`, checking every read and write against the pool.
    fn forward(&mut self, out: &SchedulerOutput) -> Vec<(RequestId, Vec<u32>)> {
        let bs = self.block_size();
        let pool = self.sched.kv().pool();
        let mut sampled = Vec::new();
        for s in &out.scheduled {
            let slot = |pos: usize| {
                let b = s.block_table[pos / bs];
                (b, b as usize * bs + pos % bs)
            };
            let mut state = if s.start_pos == 0 {
                SEED
            } else {
                let (_, sl) = slot(s.start_pos - 1);
                self.slots[sl].unwrap_or_else(|| panic!("{}: reads an unwritten slot", s.id))
            };
            // The state after each position whose logits are wanted: the last real token's
            // and each proposal's.
            let mut rows = Vec::new();
            let real = s.tokens.len() - s.draft.len();
            for (j, &t) in s.tokens.iter().enumerate() {
                let pos = s.start_pos + j;
                let (b, sl) = slot(pos);
                // Shared or cached blocks are immutable: only a private block may be written.
                assert_eq!(pool.ref_count(b), 1, "writes shared block {b}");
                assert_eq!(pool.block_hash(b), None, "writes cached block {b}");
                state = mix(state, t, pos);
                self.slots[sl] = Some(state);
                if j + 1 >= real {
                    rows.push(state);
                }
            }
            if s.sample {
                assert_eq!(rows.len(), s.num_logits());
                // Verification: each proposal kept while it is what the model samples.
                let mut toks = Vec::new();
                for (i, &st) in rows.iter().enumerate() {
                    let tok = fake_sample(s.id, st);
                    toks.push(tok);
                    if s.draft.get(i) != Some(&tok) {
                        break;
                    }
                }
                self.spec_counts.0 += s.draft.len();
                self.spec_counts.1 += toks.len() - 1;
                let t = self.live.get_mut(&s.id).expect("scheduled request is live");
                let n = t.generated.len();
                assert_eq!(
                    Some(&toks[..]),
                    t.expected.get(n..n + toks.len()),
                    "request {} tokens {n}.. differ from running alone",
                    s.id
                );
                t.generated.extend_from_slice(&toks);
                sampled.push((s.id, toks));
            } else {
                assert!(s.draft.is_empty(), "proposals on a prompt chunk");
            }
        }
        sampled
    }

    /// One engine step; false when there was nothing to do.
    fn step(&mut self) -> bool {
        self.propose();
        let out = self.sched.schedule();
        self.steps += 1;
        self.check_output(&out);
        if out.is_empty() {
            assert!(
                !self.sched.has_unfinished(),
                "requests left but nothing scheduled: {:?}",
                self.sched.stats()
            );
            return false;
        }
        let sampled = self.forward(&out);
        let ends = |a: tpslab_engine::sched::Appended| {
            (a.generated >= a.max_tokens).then_some(FinishReason::Length)
        };
        for (id, reason) in self.sched.update_tokens(&out, &sampled, ends) {
            assert_eq!(reason, FinishReason::Length);
            let t = &self.live[&id];
            assert_eq!(t.generated.len(), t.max_tokens);
            self.end(id, reason);
        }
        for (id, t) in &self.live {
            assert_eq!(self.sched.generated(*id), Some(&t.generated[..]), "{id}");
        }
        self.check_state();
        true
    }

    fn check_output(&self, out: &SchedulerOutput) {
        let total: usize = out.scheduled.iter().map(|s| s.tokens.len()).sum();
        assert_eq!(total, out.num_batched_tokens);
        assert!(
            total <= self.config.max_num_batched_tokens,
            "token budget exceeded"
        );
        assert!(
            out.scheduled.len() <= self.config.max_num_seqs,
            "sequence cap exceeded"
        );
        let mut ids = HashSet::new();
        let bs = self.block_size();
        for s in &out.scheduled {
            assert!(ids.insert(s.id), "{} scheduled twice", s.id);
            assert!(!s.tokens.is_empty());
            let end = s.start_pos + s.tokens.len();
            assert!(
                s.block_table.len() * bs >= end,
                "table does not cover the step"
            );
            let all = self.sched.tokens(s.id).expect("live");
            let real = s.real_tokens();
            let real_end = s.start_pos + real.len();
            assert_eq!(&all[s.start_pos..real_end], real);
            assert_eq!(s.sample, real_end == all.len());
            assert!(
                s.draft.is_empty() || s.sample,
                "proposals on a prompt chunk"
            );
            let generated = self.sched.generated(s.id).map_or(0, <[u32]>::len);
            let max_tokens = self.live[&s.id].max_tokens;
            assert!(
                generated + s.draft.len() < max_tokens,
                "proposals past max_tokens"
            );
            assert_eq!(self.sched.status(s.id), Some(RequestStatus::Running));
            assert_eq!(self.sched.num_computed_tokens(s.id), Some(s.start_pos));
            assert_eq!(self.sched.kv().block_table(s.id), &s.block_table[..]);
        }
        for id in &out.preempted {
            assert_eq!(self.sched.status(*id), Some(RequestStatus::Waiting));
            assert!(self.sched.kv().block_table(*id).is_empty());
        }
    }

    /// Pool and queue invariants that hold between steps.
    fn check_state(&self) {
        let kv = self.sched.kv();
        let pool = kv.pool();
        pool.check().expect("pool bookkeeping");
        let (used, total) = kv.usage();
        assert_eq!(used + pool.num_free(), total);
        let mut refs = vec![0u32; pool.num_blocks()];
        for id in kv.holders() {
            assert_eq!(
                self.sched.status(id),
                Some(RequestStatus::Running),
                "{id} holds blocks"
            );
            let table = kv.block_table(id);
            let uniq: HashSet<_> = table.iter().collect();
            assert_eq!(uniq.len(), table.len(), "block twice in one table");
            for &b in table {
                refs[b as usize] += 1;
            }
            let computed = self.sched.num_computed_tokens(id).unwrap_or(0);
            assert!(table.len() * kv.block_size() >= computed);
        }
        for (b, &r) in refs.iter().enumerate() {
            assert_eq!(pool.ref_count(b as u32), r, "block {b} ref count");
        }
        assert_eq!(refs.iter().filter(|&&r| r > 0).count(), used);
        // Every request is exactly one of waiting / running / finished (or refused).
        let waiting = self.sched.waiting_ids();
        let running = self.sched.running_ids();
        let mut seen = HashSet::new();
        for id in waiting.iter().chain(&running) {
            assert!(seen.insert(*id), "{id} queued twice");
        }
        for id in &waiting {
            assert_eq!(self.sched.status(*id), Some(RequestStatus::Waiting));
            assert_eq!(self.sched.num_computed_tokens(*id), Some(0));
        }
        for id in &running {
            assert_eq!(self.sched.status(*id), Some(RequestStatus::Running));
        }
        let live: HashSet<_> = self.live.keys().copied().collect();
        assert_eq!(seen, live);
        assert!(
            self.finished
                .keys()
                .all(|id| self.sched.status(*id).is_none())
        );
        let stats = self.sched.stats();
        assert_eq!(
            (stats.waiting, stats.running),
            (waiting.len(), running.len())
        );
        assert_eq!((stats.kv_used_blocks, stats.kv_total_blocks), (used, total));
    }

    fn drain(&mut self) {
        let limit = self.steps + 200_000;
        while self.step() {
            assert!(self.steps < limit, "no progress");
        }
    }

    /// After draining: everything ended, nothing leaked, every token as if run alone.
    fn check_end(&self) {
        assert!(self.live.is_empty());
        let kv = self.sched.kv();
        assert_eq!(kv.usage().0, 0);
        assert_eq!(kv.pool().num_free(), kv.pool().num_blocks());
        assert_eq!(kv.holders().count(), 0);
        for (id, (reason, t)) in &self.finished {
            assert!(t.expected.starts_with(&t.generated), "{id}: tokens changed");
            if *reason == FinishReason::Length {
                assert_eq!(t.generated, t.expected, "{id}: tokens lost");
            }
        }
        assert_eq!(
            self.finished.len() + self.refused.len(),
            self.next_id as usize - 1
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Property test.

#[derive(Debug, Clone)]
enum Op {
    Submit {
        stem: usize,
        shared: usize,
        suffix: Vec<u32>,
        max_tokens: usize,
        priority: i32,
    },
    Step(usize),
    Cancel(usize),
    Stop(usize),
    Config(SchedulerConfig),
    Rebuild(usize, usize),
}

fn config_strategy() -> impl Strategy<Value = SchedulerConfig> {
    (
        1usize..8,
        prop_oneof![1usize..8, 8usize..64],
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(Policy::Fcfs), Just(Policy::Priority)],
        prop_oneof![3 => Just(None), 1 => (0usize..6).prop_map(Some)],
    )
        .prop_map(
            |(seqs, tokens, chunked, caching, policy, max_waiting)| SchedulerConfig {
                max_num_seqs: seqs,
                max_num_batched_tokens: tokens,
                chunked_prefill: chunked,
                prefix_caching: caching,
                policy,
                max_waiting,
                ..SchedulerConfig::default()
            },
        )
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let submit = (
        0usize..3,
        prop_oneof![0usize..12, 0usize..120],
        prop_oneof![
            prop::collection::vec(0u32..VOCAB as u32, 0..6),
            prop::collection::vec(0u32..VOCAB as u32, 0..40),
        ],
        prop_oneof![1usize..4, 1usize..50],
        -2i32..3,
    )
        .prop_map(|(stem, shared, suffix, max_tokens, priority)| Op::Submit {
            stem,
            shared,
            suffix,
            max_tokens,
            priority,
        });
    prop_oneof![
        8 => submit,
        6 => (1usize..20).prop_map(Op::Step),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => any::<usize>().prop_map(Op::Stop),
        1 => config_strategy().prop_map(Op::Config),
        1 => (prop_oneof![4usize..80, 4usize..400], 1usize..17).prop_map(|(t, b)| Op::Rebuild(t.div_ceil(b), b)),
    ]
}

fn run_ops(
    config: SchedulerConfig,
    num_blocks: usize,
    block_size: usize,
    stems: &[Vec<u32>],
    ops: &[Op],
) {
    run_ops_spec(config, num_blocks, block_size, stems, ops, None);
}

fn run_ops_spec(
    config: SchedulerConfig,
    num_blocks: usize,
    block_size: usize,
    stems: &[Vec<u32>],
    ops: &[Op],
    spec: Option<(usize, u64)>,
) -> (usize, usize) {
    let mut sim = Sim::new(config, num_blocks, block_size);
    sim.spec = spec;
    for op in ops {
        match op {
            Op::Submit {
                stem,
                shared,
                suffix,
                max_tokens,
                priority,
            } => {
                let stem = &stems[stem % stems.len()];
                let mut prompt = stem[..(*shared).min(stem.len())].to_vec();
                prompt.extend_from_slice(suffix);
                if prompt.is_empty() {
                    prompt.push(1);
                }
                sim.submit(prompt, *max_tokens, *priority);
            }
            Op::Step(n) => {
                for _ in 0..*n {
                    if !sim.step() {
                        break;
                    }
                }
            }
            Op::Cancel(pick) => sim.cancel(*pick, FinishReason::Abort),
            Op::Stop(pick) => sim.cancel(*pick, FinishReason::Stop),
            Op::Config(c) => sim.set_config(c.clone()),
            Op::Rebuild(n, b) => sim.rebuild(*n, *b),
        }
        sim.check_state();
    }
    sim.drain();
    sim.check_end();
    sim.spec_counts
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_workloads_keep_invariants_and_tokens(
        config in config_strategy(),
        pool_tokens in prop_oneof![4usize..80, 4usize..400],
        block_size in 1usize..17,
        stems in prop::collection::vec(prop::collection::vec(0u32..VOCAB as u32, 0..160), 3),
        ops in prop::collection::vec(op_strategy(), 1..60),
    ) {
        run_ops(config, pool_tokens.div_ceil(block_size), block_size, &stems, &ops);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Speculation mixed with everything above (rejections, cancels, preemption, pool rebuilds,
    /// prefix sharing): every token as if run alone, no block leaked or double-owned.
    #[test]
    fn speculation_keeps_tokens_and_blocks(
        config in config_strategy(),
        pool_tokens in prop_oneof![4usize..80, 4usize..400],
        block_size in 1usize..17,
        stems in prop::collection::vec(prop::collection::vec(0u32..VOCAB as u32, 0..160), 3),
        ops in prop::collection::vec(op_strategy(), 1..60),
        k in 1usize..7,
        hit in 0u64..101,
    ) {
        run_ops_spec(config, pool_tokens.div_ceil(block_size), block_size, &stems, &ops, Some((k, hit)));
    }
}

/// The property test's speculation is not vacuous: proposals are verified, some accepted and
/// some rejected, over a workload that runs to the end.
#[test]
fn speculation_sim_accepts_and_rejects() {
    let stems = vec![vec![1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2]; 3];
    let ops: Vec<Op> = (0..8)
        .map(|i| Op::Submit {
            stem: i % 3,
            shared: 4 + i,
            suffix: vec![(i % 5) as u32; i],
            max_tokens: 30,
            priority: 0,
        })
        .collect();
    let config = SchedulerConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 24,
        ..SchedulerConfig::default()
    };
    let (proposed, accepted) = run_ops_spec(config, 12, 4, &stems, &ops, Some((4, 60)));
    assert!(proposed > 50, "{proposed} proposed");
    assert!(
        accepted > 0 && accepted < proposed,
        "{accepted} of {proposed} accepted"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Many short requests at once over a pool that holds only a few of them: preemption and
    /// recompute on most steps, with occasional cancels.
    #[test]
    fn memory_pressure_preempts_without_losing_tokens(
        config in config_strategy(),
        pool_tokens in 8usize..64,
        block_size in 1usize..9,
        stems in prop::collection::vec(prop::collection::vec(0u32..VOCAB as u32, 0..24), 3),
        reqs in prop::collection::vec(
            (0usize..3, 0usize..24, prop::collection::vec(0u32..VOCAB as u32, 0..8),
             1usize..40, -2i32..3),
            4..30,
        ),
        cancels in prop::collection::vec((0usize..200, any::<usize>()), 0..4),
    ) {
        let config = SchedulerConfig {
            max_num_seqs: config.max_num_seqs.max(2),
            max_num_batched_tokens: config.max_num_batched_tokens.max(4),
            max_waiting: None,
            ..config
        };
        let mut ops: Vec<Op> = reqs
            .into_iter()
            .map(|(stem, shared, suffix, max_tokens, priority)| Op::Submit {
                stem,
                shared,
                suffix,
                max_tokens,
                priority,
            })
            .collect();
        let mut at = 0;
        let mut cancels = cancels;
        cancels.sort_unstable();
        for (step, pick) in cancels {
            ops.push(Op::Step(step - at.min(step)));
            at = at.max(step);
            ops.push(Op::Cancel(pick));
        }
        run_ops(config, pool_tokens.div_ceil(block_size), block_size, &stems, &ops);
    }
}

// ---------------------------------------------------------------------------------------------
// Unit tests.

fn cfg() -> SchedulerConfig {
    SchedulerConfig::default()
}

fn req(id: RequestId, prompt: &[u32], max_tokens: usize, priority: i32) -> SchedRequest {
    SchedRequest {
        id,
        prompt: prompt.to_vec(),
        max_tokens,
        priority,
        client: ClientId::LOCAL,
        prompt_rows: false,
        whole_prompt: false,
    }
}

/// One step with token `7` sampled for every sequence that asks.
fn step(s: &mut Scheduler) -> (SchedulerOutput, Vec<(RequestId, FinishReason)>) {
    let out = s.schedule();
    let sampled: Vec<_> = out
        .scheduled
        .iter()
        .filter(|x| x.sample)
        .map(|x| (x.id, 7))
        .collect();
    let done = s.update(&out, &sampled);
    (out, done)
}

fn ids(out: &SchedulerOutput) -> Vec<RequestId> {
    out.scheduled.iter().map(|s| s.id).collect()
}

#[test]
fn fcfs_and_priority_order() {
    for (policy, first) in [(Policy::Fcfs, 1), (Policy::Priority, 2)] {
        let config = SchedulerConfig {
            max_num_seqs: 1,
            policy,
            ..cfg()
        };
        let mut s = Scheduler::new(config, 64, 4).expect("valid");
        s.add_request(req(1, &[1, 2, 3], 2, 5)).expect("ok");
        s.add_request(req(2, &[4, 5], 2, 0)).expect("ok");
        s.add_request(req(3, &[6], 2, 5)).expect("ok");
        let (out, _) = step(&mut s);
        assert_eq!(ids(&out), vec![first], "{policy:?}");
    }
}

#[test]
fn load_shedding_refuses_when_queue_full() {
    let config = SchedulerConfig {
        max_waiting: Some(2),
        max_num_seqs: 1,
        ..cfg()
    };
    let mut s = Scheduler::new(config, 64, 4).expect("valid");
    s.add_request(req(1, &[1], 5, 0)).expect("ok");
    s.add_request(req(2, &[1], 5, 0)).expect("ok");
    let err = s.add_request(req(3, &[1], 5, 0)).expect_err("queue full");
    assert_eq!(err, SchedError::QueueFull { max_waiting: 2 });
    assert!(err.to_string().contains("busy"));
    step(&mut s); // request 1 starts: one waiting left
    s.add_request(req(3, &[1], 5, 0)).expect("room again");
}

#[test]
fn add_request_refusals() {
    let mut s = Scheduler::new(cfg(), 4, 4).expect("valid");
    s.add_request(req(1, &[1], 1, 0)).expect("ok");
    assert_eq!(
        s.add_request(req(1, &[2], 1, 0)),
        Err(SchedError::DuplicateId(1))
    );
    assert_eq!(
        s.add_request(req(2, &[], 1, 0)),
        Err(SchedError::EmptyPrompt)
    );
    assert_eq!(
        s.add_request(req(2, &[1], 0, 0)),
        Err(SchedError::ZeroMaxTokens)
    );
    // 16 slots: 10 + 7 - 1 = 16 fits, one more does not.
    s.add_request(req(2, &[0; 10], 7, 0)).expect("fits exactly");
    let err = s.add_request(req(3, &[0; 10], 8, 0)).expect_err("too long");
    assert!(matches!(
        err,
        SchedError::TooLong {
            needed_blocks: 5,
            num_blocks: 4,
            ..
        }
    ));
    assert!(Scheduler::new(cfg(), 0, 4).is_err());
    assert!(
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 0,
                ..cfg()
            },
            4,
            4
        )
        .is_err()
    );
}

#[test]
fn preempted_request_goes_to_the_front() {
    let config = SchedulerConfig {
        max_num_seqs: 2,
        prefix_caching: false,
        ..cfg()
    };
    // 4 blocks of 2: A and B fill the pool with their prompts; C waits.
    let mut s = Scheduler::new(config, 4, 2).expect("valid");
    s.add_request(req(1, &[1, 2, 3, 4], 5, 0)).expect("ok");
    s.add_request(req(2, &[5, 6, 7, 8], 5, 0)).expect("ok");
    s.add_request(req(3, &[9], 1, 0)).expect("ok");
    let (out, _) = step(&mut s);
    assert_eq!(ids(&out), vec![1, 2]);
    assert_eq!(s.stats().kv_used_blocks, 4);
    // Both now need a fifth slot: the newest (2) is preempted so the oldest can go on.
    let (out, _) = step(&mut s);
    assert_eq!(ids(&out), vec![1]);
    assert_eq!(out.preempted, vec![2]);
    assert_eq!(s.waiting_ids(), vec![2, 3]);
    assert_eq!(s.status(2), Some(RequestStatus::Waiting));
    assert_eq!(s.num_computed_tokens(2), Some(0));
    assert_eq!(s.generated(2), Some(&[7][..]), "generated tokens kept");
    assert_eq!(s.stats().preemptions_total, 1);
    // Preempted 2 is recomputed (prompt + its token) before 3 starts.
    s.finish(&[1], FinishReason::Stop);
    let (out, _) = step(&mut s);
    assert_eq!(out.scheduled[0].id, 2);
    assert_eq!(out.scheduled[0].tokens, vec![5, 6, 7, 8, 7]);
}

#[test]
fn priority_policy_preempts_lowest_priority() {
    let config = SchedulerConfig {
        max_num_seqs: 2,
        policy: Policy::Priority,
        ..cfg()
    };
    let mut s = Scheduler::new(config, 4, 2).expect("valid");
    s.add_request(req(1, &[1, 2, 3, 4], 5, 3)).expect("ok");
    s.add_request(req(2, &[5, 6, 7, 8], 5, 0)).expect("ok");
    step(&mut s);
    let (out, _) = step(&mut s);
    assert_eq!(out.preempted, vec![1], "priority 3 loses to priority 0");
    assert_eq!(ids(&out), vec![2]);
}

#[test]
fn priority_policy_makes_room_in_a_full_batch() {
    // Two priority-1 requests fill the batch; a priority-0 one arrives.
    for (policy, late_priority, preempts) in [
        (Policy::Fcfs, 0, false),
        (Policy::Priority, 1, false),
        (Policy::Priority, 0, true),
    ] {
        let config = SchedulerConfig {
            max_num_seqs: 2,
            policy,
            ..cfg()
        };
        let mut s = Scheduler::new(config, 64, 4).expect("valid");
        s.add_request(req(1, &[1, 2], 50, 1)).expect("ok");
        s.add_request(req(2, &[3, 4], 50, 1)).expect("ok");
        step(&mut s);
        s.add_request(req(3, &[5, 6], 50, late_priority))
            .expect("ok");
        let (out, _) = step(&mut s);
        let case = format!("{policy:?}, late priority {late_priority}");
        if preempts {
            assert_eq!(
                out.preempted,
                vec![2],
                "{case}: the newest of the worst goes"
            );
            let case_ids = ids(&out);
            assert_eq!(
                case_ids,
                vec![1, 3],
                "{case}: the better one takes its slot"
            );
            for _ in 0..3 {
                let (out, _) = step(&mut s);
                assert!(out.preempted.is_empty(), "{case}: no thrash");
            }
            let (out, _) = step(&mut s);
            assert!(out.preempted.is_empty(), "{case}: no thrash");
            assert_eq!(s.stats().preemptions_total, 1, "{case}");
        } else {
            assert!(out.preempted.is_empty(), "{case}");
            assert_eq!(ids(&out), vec![1, 2], "{case}: it waits for a free slot");
        }
    }
}

#[test]
fn prefix_cache_hits_and_switching_off() {
    let mut s = Scheduler::new(cfg(), 32, 4).expect("valid");
    let prompt: Vec<u32> = (0..10).collect();
    s.add_request(req(1, &prompt, 1, 0)).expect("ok");
    let (_, done) = step(&mut s);
    assert_eq!(done, vec![(1, FinishReason::Length)]);
    assert_eq!(s.stats().kv_used_blocks, 0);
    assert_eq!(
        s.stats().kv_cached_blocks,
        2,
        "two full blocks stay cached when free"
    );

    s.add_request(req(2, &prompt, 1, 0)).expect("ok");
    let (out, _) = step(&mut s);
    assert_eq!(out.scheduled[0].start_pos, 8);
    assert_eq!(out.scheduled[0].tokens, vec![8, 9]);
    let st = s.stats();
    assert_eq!((st.prefix_cache_queries, st.prefix_cache_hits), (20, 8));

    // A prompt made only of cached blocks still leaves its last token to compute.
    s.add_request(req(3, &prompt[..8], 1, 0)).expect("ok");
    let (out, _) = step(&mut s);
    assert_eq!(out.scheduled[0].start_pos, 4);

    let mut off = cfg();
    off.prefix_caching = false;
    s.set_config(off).expect("ok");
    assert_eq!(s.stats().kv_cached_blocks, 0);
    s.add_request(req(4, &prompt, 1, 0)).expect("ok");
    let (out, _) = step(&mut s);
    assert_eq!(out.scheduled[0].start_pos, 0);
    assert_eq!(s.stats().prefix_cache_hits, 8 + 4);

    // Back on: nothing from before is hit, new computations are cached again.
    s.set_config(cfg()).expect("ok");
    s.add_request(req(5, &prompt, 1, 0)).expect("ok");
    let (out, _) = step(&mut s);
    assert_eq!(out.scheduled[0].start_pos, 0);
    s.add_request(req(6, &prompt, 1, 0)).expect("ok");
    let (out, _) = step(&mut s);
    assert_eq!(out.scheduled[0].start_pos, 8);
}

#[test]
fn chunking_splits_prompts_and_off_keeps_them_whole() {
    let config = SchedulerConfig {
        max_num_batched_tokens: 4,
        ..cfg()
    };
    let mut s = Scheduler::new(config.clone(), 64, 4).expect("valid");
    s.add_request(req(1, &[1; 10], 1, 0)).expect("ok");
    let starts: Vec<(usize, usize, bool)> = (0..3)
        .map(|_| {
            let (out, _) = step(&mut s);
            let x = &out.scheduled[0];
            (x.start_pos, x.tokens.len(), x.sample)
        })
        .collect();
    assert_eq!(starts, vec![(0, 4, false), (4, 4, false), (8, 2, true)]);

    // Off: 3 + 3 tokens do not fit a budget of 4 together, so the second waits a step; a
    // 10-token prompt that can never fit goes alone, in budget-sized chunks.
    let off = SchedulerConfig {
        chunked_prefill: false,
        prefix_caching: false,
        ..config
    };
    let mut s = Scheduler::new(off, 64, 4).expect("valid");
    s.add_request(req(1, &[1; 3], 1, 0)).expect("ok");
    s.add_request(req(2, &[2; 3], 1, 0)).expect("ok");
    s.add_request(req(3, &[3; 10], 1, 0)).expect("ok");
    let order: Vec<Vec<RequestId>> = (0..5).map(|_| ids(&step(&mut s).0)).collect();
    assert_eq!(order, vec![vec![1], vec![2], vec![3], vec![3], vec![3]]);
    assert!(!s.has_unfinished());
}

#[test]
fn update_ignores_requests_finished_after_schedule() {
    let mut s = Scheduler::new(cfg(), 16, 4).expect("valid");
    s.add_request(req(1, &[1, 2], 3, 0)).expect("ok");
    s.add_request(req(2, &[3, 4], 3, 0)).expect("ok");
    let out = s.schedule();
    s.finish(&[1], FinishReason::Abort);
    let done = s.update(&out, &[(1, 9), (2, 9)]);
    assert!(done.is_empty());
    assert_eq!(s.status(1), None);
    assert_eq!(s.generated(2), Some(&[9][..]));
    assert_eq!(s.stats().running, 1);
}

#[test]
fn missing_sample_recomputes_last_position() {
    let mut s = Scheduler::new(cfg(), 16, 4).expect("valid");
    s.add_request(req(1, &[1, 2, 3], 3, 0)).expect("ok");
    let out = s.schedule();
    s.update(&out, &[]);
    let out = s.schedule();
    assert_eq!(
        (out.scheduled[0].start_pos, out.scheduled[0].sample),
        (2, true)
    );
}

#[test]
fn rebuild_pool_preempts_and_drops_what_cannot_fit() {
    let mut s = Scheduler::new(cfg(), 16, 4).expect("valid");
    s.add_request(req(1, &[1; 4], 2, 0)).expect("ok");
    s.add_request(req(2, &[2; 30], 4, 0)).expect("ok");
    step(&mut s);
    assert_eq!(s.stats().running, 2);
    assert!(s.rebuild_pool(0, 4).is_err());
    let aborted = s.rebuild_pool(4, 2).expect("valid");
    assert_eq!(aborted, vec![2], "33 tokens cannot fit 8 slots");
    let st = s.stats();
    assert_eq!(
        (
            st.running,
            st.waiting,
            st.kv_total_blocks,
            st.kv_used_blocks
        ),
        (0, 1, 4, 0)
    );
    assert_eq!(s.generated(1), Some(&[7][..]));
    let (out, _) = step(&mut s);
    assert_eq!(out.scheduled[0].tokens, vec![1, 1, 1, 1, 7]);
    assert!(out.scheduled[0].block_table.iter().all(|&b| b < 4));
}

#[test]
fn update_with_asks_the_caller_once_per_appended_token() {
    let mut s = Scheduler::new(cfg(), 16, 4).expect("valid");
    s.add_request(req(1, &[1, 2], 5, 0)).expect("ok");
    s.add_request(req(2, &[3, 4], 5, 0)).expect("ok");
    s.add_request(req(3, &[5, 6], 5, 0)).expect("ok");
    let mut asked = Vec::new();
    let out = s.schedule();
    // 3 finished between schedule and update: its token is dropped, and nobody is asked.
    s.finish(&[3], FinishReason::Abort);
    let done = s.update_with(&out, &[(1, 9), (2, 8), (3, 7)], |a| {
        asked.push(a);
        (a.token == 8).then_some(FinishReason::Stop)
    });
    assert_eq!(done, vec![(2, FinishReason::Stop)]);
    assert_eq!(
        asked
            .iter()
            .map(|a| (a.id, a.token, a.generated, a.max_tokens))
            .collect::<Vec<_>>(),
        vec![(1, 9, 1, 5), (2, 8, 1, 5)]
    );
    assert_eq!(s.status(2), None, "ended by the caller: finished and freed");
    assert_eq!(s.kv().block_table(2), &[] as &[u32]);
    assert_eq!(s.generated(1), Some(&[9][..]));
    // No ending said: the request runs on, whatever its count (the caller owns max_tokens).
    let out = s.schedule();
    let done = s.update_with(&out, &[(1, 9)], |_| None);
    assert!(done.is_empty());
    assert_eq!(s.generated(1), Some(&[9, 9][..]));
}

fn from(client: u64, r: SchedRequest) -> SchedRequest {
    SchedRequest {
        client: ClientId(client),
        ..r
    }
}

/// One client filling the batch (four `n = 16` requests, as the attacker) cannot keep
/// another's short request waiting for a slot: a slot is made for it at the next step, and
/// shares settle without thrashing.
#[test]
fn a_client_filling_the_batch_makes_room_for_another() {
    for policy in [Policy::Fcfs, Policy::Priority] {
        let config = SchedulerConfig {
            max_num_seqs: 64,
            policy,
            ..cfg()
        };
        let mut s = Scheduler::new(config, 4096, 16).expect("valid");
        for i in 0..64 {
            s.add_request(from(1, req(i, &[1, 2, 3], 1000, 0)))
                .expect("ok");
        }
        step(&mut s);
        assert_eq!(s.num_running(), 64);
        // The attacker's queue is long; the other client's chat arrives behind it.
        for i in 64..128 {
            s.add_request(from(1, req(i, &[1, 2, 3], 1000, 0)))
                .expect("ok");
        }
        s.add_request(from(2, req(500, &[9, 9], 8, 0))).expect("ok");
        let (out, _) = step(&mut s);
        assert_eq!(out.preempted, vec![63], "{policy:?}: the hog's newest goes");
        assert!(ids(&out).contains(&500), "{policy:?}: the chat starts now");
        // The chat runs to its end without losing its slot, and nothing thrashes.
        let mut finished = false;
        for _ in 0..10 {
            let (out, done) = step(&mut s);
            assert!(out.preempted.is_empty(), "{policy:?}: no thrash");
            finished |= done.iter().any(|&(id, _)| id == 500);
        }
        assert!(finished, "{policy:?}: the chat ended");
    }
}

#[test]
fn waiting_requests_start_by_the_fewest_running_per_client() {
    let config = SchedulerConfig {
        max_num_seqs: 4,
        ..cfg()
    };
    let mut s = Scheduler::new(config, 4096, 16).expect("valid");
    // Client 1 queued first and more; clients 2 and 3 get a slot each before its third.
    for i in 0..4 {
        s.add_request(from(1, req(i, &[1, 2], 50, 0))).expect("ok");
    }
    s.add_request(from(2, req(10, &[3, 4], 50, 0))).expect("ok");
    s.add_request(from(3, req(20, &[5, 6], 50, 0))).expect("ok");
    let (out, _) = step(&mut s);
    let mut got = ids(&out);
    got.sort_unstable();
    assert_eq!(got, vec![0, 1, 10, 20]);
    // Priorities still come first: a better priority from the busiest client goes ahead.
    let config = SchedulerConfig {
        max_num_seqs: 1,
        policy: Policy::Priority,
        ..cfg()
    };
    let mut s = Scheduler::new(config, 4096, 16).expect("valid");
    s.add_request(from(1, req(1, &[1], 50, 0))).expect("ok");
    step(&mut s);
    s.add_request(from(2, req(2, &[2], 50, 5))).expect("ok");
    s.add_request(from(1, req(3, &[3], 50, 1))).expect("ok");
    s.finish(&[1], FinishReason::Stop);
    let (out, _) = step(&mut s);
    assert_eq!(ids(&out), vec![3]);
}
