//! The dashboard's KV cache section driven by its labels (egui_kittest) over the real default
//! model and engine: K and V types picked from their menus, what they hold against f16, their
//! quality measured against f16 KV on a worker, and the pool rebuilt with them.

use crate::gui_wait;
use crate::gui_window;
use gui_wait::wait_until;
use gui_window::{dashboard_on_default_model, has};

use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use tpslab::ui::TpsApp;
use tpslab_engine::kv::{KvType, KvTypes};

fn pick(h: &mut Harness<'static, TpsApp>, combo: &str, item: &str) {
    h.get_by_role_and_label(egui::accesskit::Role::ComboBox, combo)
        .click();
    h.run_steps(2);
    // The open menu's entry (the combo's own text may carry the same name).
    h.get_all_by_label(item)
        .last()
        .expect("the menu entry")
        .click();
    h.run_steps(2);
}

#[test]
fn kv_types_are_picked_measured_against_f16_and_applied_to_the_pool() {
    let mut h = dashboard_on_default_model(|s| {
        s.dash.load.prompt_len = 16;
        s.dash.load.output_len = 8;
    });
    wait_until(&mut h, "the engine's first stats", 30, |h| {
        h.state().engine().expect("engine").stats().kv_total_blocks > 0
    });
    let before = h.state().engine().expect("engine").stats();
    assert!(before.knobs.kv.types.is_f16());
    // f16 is the baseline: nothing to measure yet.
    let disabled = |h: &Harness<'static, TpsApp>| {
        h.get_by_label("Measure KV quality")
            .accesskit_node()
            .is_disabled()
    };
    assert!(disabled(&h));
    wait_until(&mut h, "the f16 capacity line", 10, |h| {
        has(h, "(1.00x f16): ")
    });

    pick(&mut h, "K type", "q8_0");
    pick(&mut h, "V type", "q8_0");
    wait_until(&mut h, "the q8_0 capacity line", 10, |h| {
        has(h, "(1.88x f16): ") && has(h, "requests of 24 tokens at once")
    });
    assert!(!disabled(&h));

    // Quality: the loaded model with a q8_0 cache against itself with f16 KV, on a worker
    // (the window keeps drawing: the progress shows while it runs).
    h.get_by_label("Measure KV quality").click();
    wait_until(&mut h, "the KV quality result", 600, |h| {
        has(h, "q8_0 KV against f16 KV: perplexity ")
    });
    // Small, as engine/tests/serving/kv_types.rs and tests/commands/perplexity_kl.rs measure it.
    assert!(
        has(&h, "mean KL 0.0"),
        "the KL of a q8_0 cache is below 0.1"
    );
    assert!(
        has(&h, "same top token 9"),
        "top-1 agreement of 90% or more"
    );

    // Applied: the engine rebuilds its pool in q8_0, holding more blocks in the same budget.
    h.get_by_label("Apply KV settings").click();
    let q8 = KvTypes::same(KvType::Q8_0);
    wait_until(&mut h, "the engine to run a q8_0 cache", 60, |h| {
        h.state().engine().expect("engine").stats().knobs.kv.types == q8
    });
    let after = h.state().engine().expect("engine").stats();
    let ratio = after.kv_total_blocks as f64 / before.kv_total_blocks as f64;
    assert!(
        (1.85..1.89).contains(&ratio),
        "{} blocks in f16, {} in q8_0",
        before.kv_total_blocks,
        after.kv_total_blocks
    );
    wait_until(&mut h, "the engine line to say q8_0", 10, |h| {
        has(h, "tok, q8_0")
    });
}
