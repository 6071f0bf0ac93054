//! The dashboard's speculative decoding section: method, proposed tokens, the draft model, the
//! policy that pauses it, and what it does live (acceptance, tokens per step, proposal time, why
//! it is paused).

use tpslab_engine::library::entry::ModelEntry;
use tpslab_engine::serving::engine::EngineSnapshot;
use tpslab_engine::spec::{MAX_SPEC_TOKENS, SpecConfig, SpecMethod};

use crate::ui::command::Command;

/// What the section shows besides the knobs.
pub struct SpecView<'a> {
    pub snapshot: Option<&'a EngineSnapshot>,
    /// The library's models, offered as draft models.
    pub models: &'a [ModelEntry],
}

/// Draws the section; true when a setting changed and should be applied now. A draft model
/// chosen here is a command (it loads on a worker).
pub fn spec_ui(
    ui: &mut egui::Ui,
    c: &mut SpecConfig,
    view: &SpecView<'_>,
    cmds: &mut Vec<Command>,
) -> bool {
    let mut commit = false;
    // Folded by default: an advanced lever, and the knobs column must leave room for the rest.
    egui::CollapsingHeader::new("Speculative decoding")
        .default_open(false)
        .show(ui, |ui| commit = spec_grid(ui, c, view, cmds));
    if let Some(sn) = (view.snapshot).filter(|sn| sn.knobs.spec.method != SpecMethod::Off) {
        ui.label(egui::RichText::new(status(sn)).small());
    }
    commit
}

/// The knobs' grid; true when a setting changed and should be applied now.
fn spec_grid(
    ui: &mut egui::Ui,
    c: &mut SpecConfig,
    view: &SpecView<'_>,
    cmds: &mut Vec<Command>,
) -> bool {
    let mut commit = false;
    let has_draft = view.snapshot.is_some_and(|s| s.spec_draft.is_some());
    egui::Grid::new("spec_grid").num_columns(2).show(ui, |ui| {
        let l = ui.label("Method");
        egui::ComboBox::from_id_salt("spec_method")
            .selected_text(label(c.method))
            .show_ui(ui, |ui| {
                for m in [
                    SpecMethod::Off,
                    SpecMethod::Ngram,
                    SpecMethod::SelfDraft,
                    SpecMethod::Draft,
                ] {
                    // The draft method applies once the engine has a draft model: choosing
                    // one below sends both.
                    let waits = m == SpecMethod::Draft && !has_draft;
                    commit |= ui.selectable_value(&mut c.method, m, label(m)).changed() && !waits;
                }
            })
            .response
            .labelled_by(l.id)
            .on_hover_text(
                "Proposed tokens are checked by the model in the same step: outputs do not \
                 change (greedy: the same tokens), one stream gets faster when guesses land, \
                 and the batch spends compute on the guesses.",
            );
        ui.end_row();
        if c.method == SpecMethod::Draft {
            draft_row_ui(ui, view, cmds);
            ui.end_row();
        }
        let l = ui.label("Proposed tokens");
        let r = ui
            .add(egui::DragValue::new(&mut c.num_tokens).range(1..=MAX_SPEC_TOKENS))
            .labelled_by(l.id);
        commit |= (r.changed() && !r.dragged()) || r.drag_stopped();
        ui.end_row();
        let mut capped = c.max_batch.is_some();
        commit |= ui
            .checkbox(&mut capped, "Off above batch size")
            .on_hover_text("A full batch needs its compute for real tokens.")
            .changed();
        if capped {
            let mut n = c.max_batch.unwrap_or(8);
            let r = ui.add(egui::DragValue::new(&mut n).range(1..=512));
            commit |= (r.changed() && !r.dragged()) || r.drag_stopped();
            c.max_batch = Some(n);
        } else {
            c.max_batch = None;
            ui.label("");
        }
        ui.end_row();
        let mut floor = c.min_acceptance.is_some();
        commit |= ui.checkbox(&mut floor, "Pause below acceptance").changed();
        if floor {
            let mut pct = c.min_acceptance.unwrap_or(0.3) * 100.0;
            let r = ui.add(
                egui::DragValue::new(&mut pct)
                    .range(0.0..=100.0)
                    .suffix(" %"),
            );
            commit |= (r.changed() && !r.dragged()) || r.drag_stopped();
            c.min_acceptance = Some(pct / 100.0);
        } else {
            c.min_acceptance = None;
            ui.label("");
        }
        ui.end_row();
        commit |= ui
            .checkbox(&mut c.payoff, "Only when it pays")
            .on_hover_text(
                "Each request's proposals are checked only when the tokens it can expect to \
                 keep pay for the longer step, judged from the measured step times and its \
                 own recent acceptance; the others are compared with what it goes on to write, \
                 so proposals resume when the text starts to repeat.",
            )
            .changed();
        ui.label("");
        ui.end_row();
    });
    commit
}

/// The draft model: the engine's now, or one of the library's (it must share the tokenizer:
/// the engine refuses one that does not, and the error bar says why). Choosing one loads it,
/// then applies the draft method.
fn draft_row_ui(ui: &mut egui::Ui, view: &SpecView<'_>, cmds: &mut Vec<Command>) {
    let current = view.snapshot.and_then(|s| s.spec_draft.as_deref());
    let name = |p: &std::path::Path| {
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    let l = ui.label("Draft model");
    egui::ComboBox::from_id_salt("spec_draft")
        .selected_text(current.map_or_else(|| "none".into(), name))
        .show_ui(ui, |ui| {
            for m in view.models {
                let chosen = current == Some(m.path.as_path());
                let text = format!("{} ({}, {})", m.name, m.precision, m.arch);
                if ui.selectable_label(chosen, text).clicked() && !chosen {
                    cmds.push(Command::SetDraftModel(m.path.clone()));
                }
            }
        })
        .response
        .labelled_by(l.id)
        .on_hover_text(
            "A smaller model with the same tokenizer proposes the tokens; it runs batched with \
             its own KV pool.",
        );
}

fn label(m: SpecMethod) -> &'static str {
    match m {
        SpecMethod::Off => "off",
        SpecMethod::Ngram => "n-gram (prompt lookup)",
        SpecMethod::SelfDraft => "self (first layers)",
        SpecMethod::Draft => "draft model",
    }
}

/// "acceptance 62% · 2.9 tok/step · propose 0.4 ms · verify 9.8 ms" or why it is paused.
pub fn status(sn: &EngineSnapshot) -> String {
    if sn.knobs.spec.method == SpecMethod::Off {
        return "speculation off".into();
    }
    let w = &sn.live.spec;
    let mut s = format!(
        "{} k={}: acceptance {} · {} tok/step · propose {} · verify {}",
        sn.knobs.spec.method,
        sn.knobs.spec.num_tokens,
        w.acceptance_rate
            .map_or("-".into(), |r| format!("{:.0}%", r * 100.0)),
        w.mean_acceptance_length
            .map_or("-".into(), |r| format!("{r:.2}")),
        w.propose_ms.map_or("-".into(), |r| format!("{r:.1} ms")),
        w.verify_ms.map_or("-".into(), |r| format!("{r:.1} ms")),
    );
    if let Some(p) = &sn.spec_pause {
        s.push_str(&format!(" · {p}"));
    }
    if sn.spec_switches > 0 {
        s.push_str(&format!(" · policy switched {} times", sn.spec_switches));
    }
    s
}

/// The plots' mark when the policy turned speculation off or on since the `old` snapshot:
/// "speculation paused: 9 running > 8" or "speculation resumed" (with the count when the policy
/// switched more than once between the two).
pub fn switch_mark(old: &EngineSnapshot, new: &EngineSnapshot) -> Option<String> {
    let n = new.spec_switches.checked_sub(old.spec_switches)?;
    if n == 0 || new.knobs.spec.method == SpecMethod::Off {
        return None;
    }
    let now = match &new.spec_pause {
        Some(p) => format!("speculation {p}"),
        None => "speculation resumed".to_string(),
    };
    Some(match n {
        1 => now,
        n => format!("{now} ({n} switches)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpslab_engine::spec::SpecPause;

    #[test]
    fn a_policy_switch_marks_the_plots_with_what_it_did() {
        let mut old = EngineSnapshot::default();
        old.knobs.spec.method = SpecMethod::Ngram;
        let mut new = old.clone();
        assert_eq!(switch_mark(&old, &new), None);
        new.spec_switches = 1;
        new.spec_pause = Some(SpecPause::BatchFull {
            running: 9,
            max_batch: 8,
        });
        assert_eq!(
            switch_mark(&old, &new).as_deref(),
            Some("speculation paused: 9 running > 8")
        );
        let (old, mut back) = (new.clone(), new);
        back.spec_switches = 4;
        back.spec_pause = None;
        assert_eq!(
            switch_mark(&old, &back).as_deref(),
            Some("speculation resumed (3 switches)")
        );
        // A new engine (its count starts again) or speculation turned off by hand: no mark.
        assert_eq!(switch_mark(&back, &old), None);
        back.knobs.spec.method = SpecMethod::Off;
        assert_eq!(switch_mark(&old, &back), None);
    }
}
