//! The engine thread's changes while it runs: knobs applied (the KV pool rebuilt when its
//! settings change), the draft model swapped, and the weights re-quantized on a worker and
//! swapped in between steps.

use std::sync::Arc;

use tpslab_kernels::WType;

use super::{Command, EngineThread, Knobs, KvSettings, spec_step};
use crate::model::LoadedModel;
use crate::sched::stop::FinishReason;
use crate::serving::requant::{RequantError, RequantReport};

impl EngineThread {
    pub(super) fn start_requant(&mut self, ty: WType) {
        self.last_error = None;
        if let Some(busy) = self.requantizing {
            self.last_error = Some(format!(
                "already re-quantizing to {busy}; try again when it is done"
            ));
            return;
        }
        // Asking for the type the matrices already have changes nothing (those that fell back
        // would fall back again).
        if ty == self.lm.precision.main {
            return;
        }
        let (lm, inbox, threads) = (Arc::clone(&self.lm), self.inbox.clone(), self.threads);
        let spawned = std::thread::Builder::new()
            .name("tpslab-requant".into())
            .spawn(move || {
                let r = crate::serving::requant::requantize(&lm, ty, threads);
                let _ = inbox.send(Command::PrecisionReady(Box::new(r)));
            });
        match spawned {
            Ok(_) => self.requantizing = Some(ty),
            Err(e) => self.last_error = Some(format!("cannot start re-quantizing: {e}")),
        }
        self.publish();
    }

    pub(super) fn finish_requant(&mut self, r: Result<(LoadedModel, RequantReport), RequantError>) {
        self.requantizing = None;
        let (lm, report) = match r {
            Ok(v) => v,
            Err(e) => {
                self.last_error = Some(format!("precision unchanged: {e}"));
                self.publish();
                return;
            }
        };
        let lm = Arc::new(lm);
        if let Err(e) = self.backend.set_model(&lm) {
            self.last_error = Some(format!("precision unchanged: {e}"));
            self.publish();
            return;
        }
        // The KV written by the old weights is stale: a fresh pool of the same size (and prefix
        // cache); everything running is preempted and recomputed on the new weights.
        let (blocks, bs) = (self.backend.num_blocks(), self.backend.block_size());
        match self.sched.rebuild_pool(blocks, bs) {
            Ok(dropped) => {
                for id in dropped {
                    self.end(id, FinishReason::Abort);
                }
            }
            Err(e) => self.last_error = Some(e.to_string()),
        }
        self.lm = lm;
        // The self-drafter runs the new weights too (and lets the old ones go).
        if let Err(e) = self.rebuild_proposer() {
            self.last_error = Some(format!("{e}; speculation off"));
        }
        self.last_requant = Some((
            report.from,
            report.to,
            report.weights_bytes_before,
            report.weights_bytes_after,
            report.seconds,
        ));
        crate::model::loaded::release_free_memory();
        self.publish();
    }

    pub(super) fn set_knobs(&mut self, k: Knobs) {
        self.last_error = None;
        if k.kv != self.knobs.kv {
            // A new pool: everything running is preempted (recomputed later), nothing is lost.
            if let Err(e) = self.rebuild_kv(&k.kv) {
                self.last_error = Some(e);
            }
        }
        match self.sched.set_config(k.scheduler.clone()) {
            Ok(()) => self.knobs.scheduler = k.scheduler,
            Err(e) => self.last_error = Some(e.to_string()),
        }
        if k.spec != self.knobs.spec {
            let old = std::mem::replace(&mut self.knobs.spec, k.spec);
            if let Err(e) = self.rebuild_proposer() {
                self.last_error = Some(format!("{e}; kept the previous speculation settings"));
                self.knobs.spec = old;
                if let Err(e) = self.rebuild_proposer() {
                    self.last_error = Some(format!("{e}; speculation off"));
                }
            }
        }
        self.publish();
    }

    pub(super) fn set_draft(&mut self, draft: Option<Arc<LoadedModel>>) {
        self.last_error = None;
        // Checked whatever the method now, so a later switch to the draft method cannot fail.
        if let Some(e) = draft
            .as_ref()
            .and_then(|d| spec_step::vocab_check(&self.lm, d).err())
        {
            self.last_error = Some(format!("{e}; kept the previous draft model"));
            self.publish();
            return;
        }
        let old = std::mem::replace(&mut self.spec.draft_lm, draft);
        if let Err(e) = self.rebuild_proposer() {
            self.spec.draft_lm = old;
            self.last_error = Some(match self.rebuild_proposer() {
                Ok(()) => format!("{e}; kept the previous draft model"),
                Err(e2) => format!("{e}; {e2}; speculation off"),
            });
        }
        self.publish();
    }

    /// A new KV pool of the given settings: the scheduler's block pool and the backend's storage
    /// together (everything running is preempted and recomputed later; nothing is lost). On a
    /// failure the old geometry is restored.
    pub(super) fn rebuild_kv(&mut self, kv: &KvSettings) -> Result<(), String> {
        let blocks = kv
            .types
            .pool_for_budget(&self.lm.model.cfg, kv.block_size, kv.budget_bytes)
            .map_err(|e| e.to_string())?;
        let old = (
            self.backend.block_size(),
            self.backend.num_blocks(),
            self.backend.kv_types(),
        );
        let dropped = self
            .sched
            .rebuild_pool(blocks, kv.block_size)
            .map_err(|e| e.to_string())?;
        for id in dropped {
            self.end(id, FinishReason::Abort);
        }
        if let Err(e) = self.backend.rebuild_kv(kv.block_size, blocks, kv.types) {
            let restored = self.backend.rebuild_kv(old.0, old.1, old.2).is_ok()
                && self.sched.rebuild_pool(old.1, old.0).is_ok();
            return Err(if restored {
                format!("{e}; kept the previous KV pool")
            } else {
                format!("{e}; the previous KV pool could not be restored either")
            });
        }
        self.knobs.kv = kv.clone();
        // A drafter's pool follows the target's size.
        self.rebuild_proposer()
            .map_err(|e| format!("{e}; speculation off"))
    }
}
