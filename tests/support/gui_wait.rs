//! Shared by the window tests: run frames until a condition holds.

use std::time::{Duration, Instant};

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use tpslab::ui::TpsApp;

/// Runs frames until `done` holds, failing after `secs` seconds with `what`, the app's errors and
/// any label that says "Error".
pub fn wait_until(
    h: &mut Harness<'static, TpsApp>,
    what: &str,
    secs: u64,
    mut done: impl FnMut(&mut Harness<'static, TpsApp>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        h.step();
        if done(h) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; errors shown: {:?}; labels with 'Error': {:?}",
            h.state().errors(),
            h.query_all_by_label_contains("Error")
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
