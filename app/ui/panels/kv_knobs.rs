//! The dashboard's KV cache section: budget, block size and the K and V element types (f16,
//! bf16, q8_0, q4_0, as llama.cpp's `--cache-type-k/-v`), edited as a draft that applying
//! rebuilds the pool with; what the draft buys: the tokens the budget holds in those types
//! against f16, and how many requests of the load generator's size fit at once; and what it
//! costs in quality ([`KvQuality`]: the loaded model with the draft's cache against itself with
//! f16 KV over the bundled text, on a worker: perplexity of both and the KL divergence, as
//! `tpslab perplexity -ctk q8_0 --kl-base` prints them). Its TPS cost shows on the plots once
//! the types are applied.

use std::sync::Arc;

use tpslab_engine::kv::{KvType, KvTypes};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::config::ModelConfig;
use tpslab_engine::serving::engine::KvSettings;
use tpslab_engine::serving::kl::{KlReport, kl_divergence};
use tpslab_engine::serving::perplexity::{BUNDLED_TEXT, BUNDLED_TEXT_NAME};

use crate::ui::command::Command;
use crate::ui::task::Task;

/// Tokens per window of the quality run (the second half of each is scored).
pub const QUALITY_CTX: usize = 256;

/// The settings' grid (edits `kv` in place).
pub fn kv_grid(ui: &mut egui::Ui, kv: &mut KvSettings) {
    let mut mib = (kv.budget_bytes >> 20).max(1);
    egui::Grid::new("kv_grid").num_columns(2).show(ui, |ui| {
        let l = ui.label("KV budget (MiB)");
        if ui
            .add(egui::DragValue::new(&mut mib).range(1..=65536))
            .labelled_by(l.id)
            .changed()
        {
            kv.budget_bytes = mib << 20;
        }
        ui.end_row();
        let l = ui.label("Block size");
        egui::ComboBox::from_id_salt("kv_block_size")
            .selected_text(kv.block_size.to_string())
            .show_ui(ui, |ui| {
                for b in [8usize, 16, 32, 64] {
                    ui.selectable_value(&mut kv.block_size, b, b.to_string());
                }
            })
            .response
            .labelled_by(l.id);
        ui.end_row();
        type_combo(ui, "K type", "kv_type_k", &mut kv.types.k);
        type_combo(ui, "V type", "kv_type_v", &mut kv.types.v);
    });
}

fn type_combo(ui: &mut egui::Ui, label: &str, id: &str, t: &mut KvType) {
    let l = ui.label(label);
    egui::ComboBox::from_id_salt(id)
        .selected_text(t.name())
        .show_ui(ui, |ui| {
            for ty in KvType::ALL {
                ui.selectable_value(t, ty, ty.name());
            }
        })
        .response
        .labelled_by(l.id);
    ui.end_row();
}

/// What `kv` holds for a model of `cfg`, for requests of `request_tokens`: "holds 23296 tokens
/// (1.88x f16): 72 requests of 320 tokens at once", or why it holds none.
pub fn capacity_text(kv: &KvSettings, cfg: &ModelConfig, request_tokens: usize) -> String {
    let bs = kv.block_size.max(1);
    let blocks = |t: KvTypes| t.pool_for_budget(cfg, bs, kv.budget_bytes);
    let blocks = match (blocks(kv.types), blocks(KvTypes::F16)) {
        (Err(e), _) => return e.to_string(),
        (Ok(b), f16) => (b, f16.unwrap_or(0)),
    };
    if let Err(e) = kv.types.check(cfg) {
        return e.to_string();
    }
    let tokens = blocks.0 * bs;
    let ratio = tokens as f64 / (blocks.1 * bs).max(1) as f64;
    let per_request = request_tokens.max(1).div_ceil(bs);
    format!(
        "holds {tokens} tokens ({ratio:.2}x f16): {} requests of {request_tokens} tokens at once",
        blocks.0 / per_request
    )
}

/// The KV quality run: in flight, or its last result as the line the panel shows (made once,
/// on the worker, not every frame).
#[derive(Default)]
pub struct KvQuality {
    task: Option<Task<String>>,
    last: Option<Result<String, String>>,
}

impl KvQuality {
    /// Starts measuring `types` on `lm` (a run in flight is cancelled first); refused for f16,
    /// which is the baseline itself.
    pub fn start(
        &mut self,
        lm: Arc<LoadedModel>,
        types: KvTypes,
        threads: usize,
        ctx: &egui::Context,
    ) -> Result<(), String> {
        if types.is_f16() {
            return Err("f16 KV is the baseline the quality run compares against".into());
        }
        types.check(&lm.model.cfg).map_err(|e| e.to_string())?;
        self.cancel();
        let what = format!("KV quality of {types}");
        let task = Task::spawn("kv-quality", what, ctx, move |rep| {
            let cancel = rep.cancel_flag();
            let mut progress = |done: usize, total: usize| {
                rep.report(
                    done as u64,
                    total as u64,
                    &format!("window {done} of {total}"),
                );
            };
            kl_divergence(
                &lm,
                &lm,
                BUNDLED_TEXT,
                QUALITY_CTX,
                threads,
                types,
                Some(&cancel),
                &mut progress,
            )
            .map(|r| result_line(types, &r))
            .map_err(|e| e.to_string())
        })?;
        self.task = Some(task);
        Ok(())
    }

    pub fn cancel(&mut self) {
        if let Some(t) = self.task.take() {
            t.cancel();
        }
    }

    /// Takes in the worker's news (each frame).
    pub fn poll(&mut self) {
        if let Some(r) = self.task.as_mut().and_then(Task::poll) {
            self.last = Some(r);
            self.task = None;
        }
    }

    /// The button (for the draft's types), the run's progress, the last result.
    pub fn ui(&self, ui: &mut egui::Ui, draft: KvTypes, loaded: bool, cmds: &mut Vec<Command>) {
        if let Some(task) = &self.task {
            task.progress_ui(ui, false, None);
            if ui.button("Cancel KV quality").clicked() {
                cmds.push(Command::CancelKvQuality);
            }
        } else if ui
            .add_enabled(
                loaded && !draft.is_f16(),
                egui::Button::new("Measure KV quality"),
            )
            .on_hover_text(
                "Perplexity and KL divergence of the loaded model with these KV types against \
                 f16 KV over the bundled text (about a minute on the default model)",
            )
            .clicked()
        {
            cmds.push(Command::MeasureKvQuality(draft));
        }
        match &self.last {
            Some(Ok(text)) => {
                ui.label(egui::RichText::new(text).small());
            }
            Some(Err(e)) => {
                ui.colored_label(ui.visuals().error_fg_color, format!("KV quality: {e}"));
            }
            None => {}
        }
    }
}

/// A quality run as a line: "q8_0 KV against f16 KV: perplexity 19.631 vs 19.756 (-0.63%),
/// mean KL 0.00123, same top token 98.7% (bundled text, windows of 256)".
fn result_line(types: KvTypes, r: &KlReport) -> String {
    format!(
        "{types} KV against f16 KV: perplexity {:.3} vs {:.3} ({:+.2}%), mean KL {:.5}, same \
         top token {:.1}% ({BUNDLED_TEXT_NAME}, {} windows of {})",
        r.ppl.value,
        r.ppl_base.value,
        100.0 * (r.ppl.value / r.ppl_base.value - 1.0),
        r.kld.value,
        100.0 * r.same_top.value,
        r.windows,
        r.ctx
    )
}
