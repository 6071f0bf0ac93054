//! A finished sweep saved: its points as JSON and CSV, and its plot as a PNG beside them.

use std::path::{Path, PathBuf};

use super::load::SweepPoint;
use super::plot_png;

/// Writes `points` as `<base>.json`, `<base>.csv` and the plot as `<base>.png`; returns the paths.
pub fn save_sweep(base: &Path, points: &[SweepPoint]) -> Result<[PathBuf; 3], String> {
    if let Some(dir) = base.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let json_path = base.with_extension("json");
    let csv_path = base.with_extension("csv");
    let json = serde_json::to_string_pretty(points).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, json)
        .map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    let mut csv = String::from(
        "concurrency,prompt_len,output_len,precision,completed,duration_s,output_throughput,\
         mean_per_request_tps,p10_per_request_tps,median_ttft_ms,p99_ttft_ms,max_batch,device\n",
    );
    for p in points {
        csv.push_str(&format!(
            "{},{},{},{},{},{:.3},{:.3},{},{},{:.3},{:.3},{},\"{}\"\n",
            p.concurrency,
            p.prompt_len,
            p.output_len,
            p.precision_label(),
            p.completed,
            p.duration_s,
            p.output_throughput,
            opt(p.mean_per_request_tps),
            opt(p.p10_per_request_tps),
            p.median_ttft_ms,
            p.p99_ttft_ms,
            p.max_batch,
            p.device.replace('"', "'")
        ));
    }
    std::fs::write(&csv_path, csv)
        .map_err(|e| format!("cannot write {}: {e}", csv_path.display()))?;
    let png_path = base.with_extension("png");
    plot_png::save(&png_path, points)?;
    Ok([json_path, csv_path, png_path])
}
