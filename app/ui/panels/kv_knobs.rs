//! The dashboard's KV cache section: budget, block size and the K and V element types (f16,
//! bf16, q8_0, q4_0, as llama.cpp's `--cache-type-k/-v`), edited as a draft that applying
//! rebuilds the pool with; and what the draft buys: the tokens the budget holds in those types
//! against f16, and how many requests of the load generator's size fit at once.

use tpslab_engine::kv::{KvType, KvTypes};
use tpslab_engine::model::config::ModelConfig;
use tpslab_engine::serving::engine::KvSettings;

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
