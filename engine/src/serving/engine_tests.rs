//! The engine thread stepped by hand: its failure isolation (a request whose batch share makes
//! the forward pass fail is refused alone, and the requests batched with it run to their end),
//! and the batches each request's tokens were sampled in, as its usage reports them.

use super::*;
use crate::device::{BackendError, DeviceChoice, RowNeed, StepOutput};
use crate::kv::{Batch, KvTypes};
use crate::sched::stop::StopCriteria;

/// The real CPU backend, except that any batch holding `poison` fails (as a bad input would).
struct Poisoned {
    inner: Box<dyn Backend>,
    poison: u32,
}

impl Backend for Poisoned {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn forward(
        &mut self,
        batch: &Batch,
        needs: &[RowNeed],
    ) -> Result<StepOutput<'_>, BackendError> {
        if batch.tokens.contains(&self.poison) {
            return Err(BackendError::Other("poisoned token".into()));
        }
        self.inner.forward(batch, needs)
    }
    fn rebuild_kv(
        &mut self,
        block_size: usize,
        num_blocks: usize,
        types: KvTypes,
    ) -> Result<(), BackendError> {
        self.inner.rebuild_kv(block_size, num_blocks, types)
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn kv_types(&self) -> KvTypes {
        self.inner.kv_types()
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn memory(&self) -> MemoryUse {
        self.inner.memory()
    }
    fn threads(&self) -> usize {
        self.inner.threads()
    }
    fn set_model(&mut self, lm: &Arc<LoadedModel>) -> Result<(), BackendError> {
        self.inner.set_model(lm)
    }
}

/// An engine thread on a synthetic model (two threads, a small KV pool), stepped by hand.
fn engine_thread() -> (Arc<LoadedModel>, EngineThread) {
    let lm = LoadedModel::synthetic("smollm2-135m", WType::Q8_0, 0, 2).expect("synthetic model");
    let config = EngineConfig {
        threads: 2,
        device: DeviceChoice::Cpu,
        knobs: Knobs {
            kv: KvSettings {
                budget_bytes: 8 << 20,
                block_size: 16,
                ..KvSettings::default()
            },
            ..Knobs::default()
        },
        ..EngineConfig::default()
    };
    let lm = Arc::new(lm);
    let (tx, rx) = mpsc::channel();
    let t = EngineThread::new(Arc::clone(&lm), &config, rx, tx, Arc::default(), None)
        .expect("engine thread");
    (lm, t)
}

#[test]
fn a_request_that_fails_the_forward_pass_fails_alone() {
    let (lm, mut t) = engine_thread();
    let inner = crate::device::open(
        lm,
        DeviceChoice::Cpu,
        2,
        &KvSettings {
            budget_bytes: 8 << 20,
            block_size: 16,
            types: KvTypes::F16,
        },
        0.0,
        0,
    )
    .expect("backend")
    .backend;
    assert_eq!(inner.num_blocks(), t.backend.num_blocks());
    t.backend = Box::new(Poisoned { inner, poison: 77 });
    let (etx, erx) = mpsc::channel();
    let req = |prompt: Vec<u32>| Request {
        prompt,
        stop: StopCriteria::new(Some(4), Vec::new()),
        ..Request::default()
    };
    t.submit(1, req(vec![10, 11, 12]), etx.clone());
    t.submit(2, req(vec![20, 77, 22]), etx.clone());
    t.submit(3, req(vec![30, 31]), etx);
    for _ in 0..20 {
        if t.live.is_empty() {
            break;
        }
        t.step();
    }
    let mut ends = HashMap::new();
    for ev in erx.try_iter() {
        match ev {
            Event::Finished { id, usage, .. } => {
                ends.insert(id, Ok(usage.completion_tokens));
            }
            Event::Refused { id, reason } => {
                ends.insert(id, Err(reason.to_string()));
            }
            _ => {}
        }
    }
    assert_eq!(ends.get(&1), Some(&Ok(4)), "{ends:?}");
    assert_eq!(ends.get(&3), Some(&Ok(4)), "{ends:?}");
    assert!(
        matches!(ends.get(&2), Some(Err(r)) if r.contains("poisoned")),
        "{ends:?}"
    );
}

/// Two requests decoded together report batches of two for every token; one decoded alone
/// reports batches of one.
#[test]
fn usage_reports_the_batches_a_request_ran_in() {
    let (_, mut t) = engine_thread();
    let (etx, erx) = mpsc::channel();
    let req = |prompt: Vec<u32>| Request {
        prompt,
        stop: StopCriteria::new(Some(4), Vec::new()),
        ..Request::default()
    };
    let mut run = |reqs: Vec<(u64, Vec<u32>)>| {
        for (id, prompt) in reqs {
            t.submit(id, req(prompt), etx.clone());
        }
        for _ in 0..20 {
            if t.live.is_empty() {
                break;
            }
            t.step();
        }
    };
    run(vec![(1, vec![10, 11, 12]), (2, vec![20, 21, 22])]);
    run(vec![(3, vec![30, 31])]);
    let mut batches = HashMap::new();
    for ev in erx.try_iter() {
        if let Event::Finished { id, usage, .. } = ev {
            assert_eq!(usage.batch.steps, usage.completion_tokens, "{usage:?}");
            batches.insert(id, (usage.batch.mean(), usage.batch.max));
        }
    }
    assert_eq!(batches.get(&1), Some(&(Some(2.0), 2)), "{batches:?}");
    assert_eq!(batches.get(&2), Some(&(Some(2.0), 2)), "{batches:?}");
    assert_eq!(batches.get(&3), Some(&(Some(1.0), 1)), "{batches:?}");
}
