//! The device selector (top bar) and the status bar: the model, the backend the engine reports
//! (with its fallback note) and memory, weights / KV / activations apart.

use tpslab_engine::serving::engine::EngineSnapshot;

use crate::ui::command::Command;
use crate::ui::engine_link::{DevicePref, ModelSlot};

/// What the status bar and the device selector show.
pub struct StatusView<'a> {
    pub model: Option<&'a ModelSlot>,
    pub snapshot: Option<&'a EngineSnapshot>,
    /// The device the user chose (saved).
    pub device: DevicePref,
    /// Why the device cannot be switched right now, if it cannot.
    pub device_locked: Option<&'static str>,
    /// The blocks whose experts stay in host memory on a GPU (saved).
    pub cpu_moe_layers: usize,
    /// Why the window draws fewer frames than the display's rate now, if it does.
    pub frames: Option<String>,
}

pub fn ui(ui: &mut egui::Ui, view: &StatusView<'_>) {
    ui.horizontal_wrapped(|ui| match view.model {
        None | Some(ModelSlot::NotStarted) => {
            ui.label("Model: not loaded");
        }
        Some(ModelSlot::Loading { status, .. }) => {
            ui.spinner();
            ui.label(format!("Model: {status}"));
        }
        Some(ModelSlot::Failed(e)) => {
            ui.colored_label(
                ui.visuals().error_fg_color,
                format!("Engine not running: {e}"),
            );
        }
        Some(ModelSlot::Ready(b)) => {
            ui.label(format!("Model: {}", b.model_name()));
            ui.separator();
            let precision = (view.snapshot.and_then(|s| s.precision)).unwrap_or(b.lm.precision);
            ui.label(format!("Precision: {precision}"));
            if let Some(s) = view.snapshot {
                engine_ui(ui, s);
            }
            if let Some(note) = &view.frames {
                ui.separator();
                ui.label(note);
            }
        }
    });
}

/// Backend, fallback note, memory and load, as the engine reports them.
fn engine_ui(ui: &mut egui::Ui, s: &EngineSnapshot) {
    ui.separator();
    ui.label(format!("Backend: {}", s.device));
    if let Some(note) = &s.device_note {
        ui.colored_label(ui.visuals().warn_fg_color, note);
    }
    ui.separator();
    let rss = crate::mem::rss_bytes().map(|(cur, _)| cur);
    ui.label(memory_line(s, rss));
    ui.separator();
    let state = if s.running + s.waiting == 0 {
        "idle".to_string()
    } else {
        format!("busy: {} running, {} waiting", s.running, s.waiting)
    };
    ui.label(format!("Engine: {state}"));
}

/// Auto / CPU / CUDA; choosing one restarts the engine on it (the model stays loaded). After a
/// failed start the chosen one can be clicked again to retry. In the top bar, whose layout never
/// shifts under the pointer as the status bar's does while the engine restarts.
pub fn device_ui(ui: &mut egui::Ui, view: &StatusView<'_>, cmds: &mut Vec<Command>) {
    let failed = matches!(view.model, Some(ModelSlot::Failed(_)));
    let (cuda, cuda_text) = match view.device {
        DevicePref::Cuda(n) if n > 0 => (DevicePref::Cuda(n), format!("cuda:{n}")),
        _ => (DevicePref::Cuda(0), "CUDA".to_string()),
    };
    let options = [
        (
            DevicePref::Auto,
            "Auto".to_string(),
            "The first GPU when a CUDA driver and GPU are present, else the CPU",
        ),
        (DevicePref::Cpu, "CPU".to_string(), "The CPU kernels"),
        (
            cuda,
            cuda_text,
            "The GPU (an error if there is no CUDA driver or GPU)",
        ),
    ];
    ui.label("Device");
    let r = ui.add_enabled_ui(view.device_locked.is_none(), |ui| {
        for (pref, text, hover) in options {
            let r = ui
                .selectable_label(view.device == pref, text)
                .on_hover_text(format!("{hover}. Switching restarts the engine."));
            if r.clicked() && (view.device != pref || failed) {
                cmds.push(Command::SetDevice(pref));
            }
        }
    });
    if let Some(why) = view.device_locked {
        r.response.on_disabled_hover_text(why);
    }
}

/// "Experts on CPU: N blocks" for a mixture of experts: on a GPU the experts of the first N
/// blocks stay in host memory and the CPU runs them (llama.cpp's `--n-cpu-moe`), for a model
/// larger than the GPU's memory. Edited in `draft`; "Apply" restarts the engine with it. On the
/// CPU every weight is in host memory already: the choice is kept for a GPU, and says so.
pub fn cpu_moe_ui(
    ui: &mut egui::Ui,
    view: &StatusView<'_>,
    blocks: usize,
    draft: &mut usize,
    cmds: &mut Vec<Command>,
) {
    let on_cpu = view.device == DevicePref::Cpu
        || view.snapshot.is_some_and(|s| s.device.starts_with("CPU"));
    let why = view.device_locked;
    ui.separator();
    let l = ui.label("Experts on CPU");
    let r = ui.add_enabled_ui(why.is_none(), |ui| {
        *draft = (*draft).min(blocks);
        ui.add(
            egui::DragValue::new(draft)
                .range(0..=blocks)
                .suffix(format!(" of {blocks} blocks")),
        )
        .labelled_by(l.id)
        .on_hover_text(
            "The experts of the first N blocks stay in host memory and run on the CPU while \
             attention stays on the GPU (llama.cpp's --n-cpu-moe).",
        );
        let current = view.cpu_moe_layers.min(blocks);
        if *draft != current
            && ui
                .button("Apply")
                .on_hover_text("Restarts the engine")
                .clicked()
        {
            cmds.push(Command::SetCpuMoe(*draft));
        }
    });
    if let Some(why) = why {
        r.response.on_disabled_hover_text(why);
    }
    if on_cpu {
        ui.weak("(applies on a GPU)").on_hover_text(
            "On the CPU every weight is in host memory already; the choice is kept for when the \
             engine runs on a GPU.",
        );
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// "Memory: VRAM 1200 MiB / 143771 MiB used (...)" on a GPU, "Memory: RSS 300 MiB ..." on the CPU, then
/// weights (and a GPU's experts kept in host memory), KV pool and activations apart.
pub fn memory_line(s: &EngineSnapshot, rss: Option<u64>) -> String {
    let m = &s.memory;
    let host = match m.host_weights {
        0 => String::new(),
        b => format!(" + {} experts in host memory", mib(b as u64)),
    };
    let parts = format!(
        "weights {}{host}, KV {}, activations {}",
        mib(m.weights as u64),
        mib(m.kv as u64),
        mib(m.activations as u64)
    );
    match (m.device_used, m.device_total) {
        (Some(used), Some(total)) => {
            format!("Memory: VRAM {} / {} used ({parts})", mib(used), mib(total))
        }
        _ => format!("Memory: RSS {} ({parts})", rss.map_or("–".to_string(), mib)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpslab_engine::device::MemoryUse;

    fn snapshot(memory: MemoryUse) -> EngineSnapshot {
        EngineSnapshot {
            memory,
            ..EngineSnapshot::default()
        }
    }

    #[test]
    fn memory_line_names_vram_on_a_gpu_and_rss_on_the_cpu() {
        let parts = MemoryUse {
            weights: 100 << 20,
            host_weights: 0,
            kv: 64 << 20,
            activations: 3 << 20,
            device_used: None,
            device_total: None,
        };
        assert_eq!(
            memory_line(&snapshot(parts), Some(300 << 20)),
            "Memory: RSS 300 MiB (weights 100 MiB, KV 64 MiB, activations 3 MiB)"
        );
        let gpu = MemoryUse {
            device_used: Some(1200 << 20),
            device_total: Some(143_771 << 20),
            ..parts
        };
        assert_eq!(
            memory_line(&snapshot(gpu), Some(300 << 20)),
            "Memory: VRAM 1200 MiB / 143771 MiB used (weights 100 MiB, KV 64 MiB, activations 3 MiB)"
        );
        let offloaded = MemoryUse {
            host_weights: 900 << 20,
            ..gpu
        };
        assert_eq!(
            memory_line(&snapshot(offloaded), None),
            "Memory: VRAM 1200 MiB / 143771 MiB used (weights 100 MiB + 900 MiB experts in host \
             memory, KV 64 MiB, activations 3 MiB)"
        );
    }
}
