//! Shared by the window tests: the window opened in an egui_kittest harness (never a real file
//! dialog: a test answers with its own), and its labels searched.

use std::sync::Arc;

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use tpslab::ui::files::{DialogAnswer, FixedDialog};
use tpslab::ui::{AppOptions, AppState, TpsApp};
use tpslab_engine::device::DeviceChoice;

/// The window on `model` (a GGUF path, or `default`) with one compute thread, `size` points,
/// file dialogs that answer "cancelled"; `setup` changes the app before the first frame.
pub fn window(
    state: AppState,
    model: &str,
    device: DeviceChoice,
    size: [f32; 2],
    setup: impl FnOnce(&mut TpsApp),
) -> Harness<'static, TpsApp> {
    let mut app = TpsApp::new(
        state,
        AppOptions {
            model: model.into(),
            threads: 1,
            device: Some(device),
        },
    );
    // Never a real file dialog in a test (it could block on zenity); tests set their answer.
    app.set_file_dialog(Arc::new(FixedDialog(DialogAnswer::Cancelled)));
    setup(&mut app);
    Harness::builder()
        .with_size(size)
        // The model may answer with characters (emoji) the bundled fonts lack.
        .allow_missing_glyphs()
        .build_ui_state(|ui, app: &mut TpsApp| app.app_ui(ui), app)
}

/// Some node's label contains `text` (several may).
pub fn has(h: &Harness<'static, TpsApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

/// The window on the default model (CPU, one thread) with its Dashboard open, once the model
/// has loaded (the first run may fetch it with pip); `edit` changes the saved state first.
pub fn dashboard_on_default_model(edit: impl FnOnce(&mut AppState)) -> Harness<'static, TpsApp> {
    let mut state = AppState {
        tab: tpslab::ui::Tab::Dashboard,
        ..AppState::default()
    };
    edit(&mut state);
    let mut h = window(
        state,
        "default",
        DeviceChoice::Cpu,
        [1400.0, 1600.0],
        |_| {},
    );
    crate::gui_wait::wait_until(&mut h, "the model to load", 600, |h| {
        h.state().engine().is_some()
    });
    h
}
