//! Calibrating a device row on the machine the planner runs on. The bundled `this-cpu` row
//! describes the CPU its calibration was fitted on; machines of one kind differ (another CPU
//! model, another share of the host's memory bandwidth), and predictions for this machine were
//! off by up to 62%. [`calibrate_device`] takes runs measured here and finds the bandwidth and
//! FLOP/s that make the roofline reproduce the fitted ones, keeping the backend's calibration
//! (the share of the roofline this engine reaches) as it is. The other measured runs are held
//! out: their error is what the calibration is worth. [`measure_level`] is the one measurement
//! both faces run (`tpslab plan --calibrate` and the window's planner): the default model at
//! [`LEVELS`], each level's requests all at once.

use std::sync::atomic::AtomicBool;

use tpslab_kernels::WType;

use super::PlanError;
use super::devices::{DeviceSpec, DeviceTable, MeasuredRow, Sourced};
use super::roofline::{ModelShape, Workload, predict};
use crate::serving::loadgen::{self, LoadSpec, LoadTarget, PromptSet};
use crate::serving::metrics::BenchSummary;

/// The levels a calibration measures: the first is fitted, the others held out.
pub const LEVELS: [usize; 3] = [1, 4, 16];
/// The workload of every level (the bundled rows' shape).
pub const PROMPT_LEN: usize = 128;
pub const OUTPUT_LEN: usize = 128;
/// The model measured (the default model's shape) and its weight type.
pub const SHAPE: &str = "smollm2-135m";
pub const PRECISION: WType = WType::Q4_1;
/// The device row that stands for this machine.
pub const THIS_CPU: &str = "this-cpu";

/// Where and when a calibration ran, for its rows and the refitted figures' sources: `face`
/// (`tpslab plan --calibrate`, the window's planner), the time, the compute threads and the
/// kernels chosen at run time.
pub fn run_source(face: &str, threads: usize) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{face}, {}, {threads} threads, {} kernels",
        crate::text::chat::strftime_utc("%Y-%m-%d %H:%M:%S UTC", secs),
        tpslab_kernels::Backend::detect().name()
    )
}

/// Why a calibration level has no figures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LevelError {
    #[error("concurrency {concurrency}: a request was refused: {why}")]
    Refused { concurrency: usize, why: String },
    #[error("the calibration was stopped")]
    Stopped,
    #[error("concurrency {0}: no request decoded two tokens")]
    NoDecode(usize),
}

/// Level `index` of [`LEVELS`] measured on `target` (an engine running the default model with
/// room for the level's requests and a step budget of `token_budget`), as a measured row;
/// `source` says where and when. Fails when a request is refused, the run is stopped, or no
/// request decoded two tokens.
pub fn measure_level(
    target: &dyn LoadTarget,
    prompts: &PromptSet,
    index: usize,
    token_budget: usize,
    source: &str,
    stop: &AtomicBool,
) -> Result<MeasuredRow, LevelError> {
    let c = LEVELS[index.min(LEVELS.len() - 1)];
    let spec = LoadSpec::all_at_once(c, PROMPT_LEN, OUTPUT_LEN, index as u64);
    let run = loadgen::run(target, prompts, &spec, stop, &mut |_, _| {});
    if let Some(r) = run.refused.first() {
        return Err(LevelError::Refused {
            concurrency: c,
            why: r.to_string(),
        });
    }
    if stop.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(LevelError::Stopped);
    }
    let s = BenchSummary::from_requests(&run.timings, run.duration_s, None);
    let per_request = (s.mean_per_request_tps).ok_or(LevelError::NoDecode(c))?;
    Ok(MeasuredRow {
        model: SHAPE.into(),
        precision: PRECISION.to_string(),
        concurrency: c,
        prompt_len: PROMPT_LEN,
        output_len: OUTPUT_LEN,
        token_budget,
        aggregate_tps: s.output_throughput,
        per_request_tps: per_request,
        ttft_ms: s.median_ttft_ms,
        fitted: index == 0,
        source: source.into(),
    })
}

/// The fit searches factors from 1/SPAN to SPAN times the table's bandwidth and FLOP/s.
const SPAN: f64 = 1e4;
/// Halvings of each search: 64 leave the factor within 1e-17 of its logarithm's range.
const HALVINGS: usize = 64;
/// Where decode cannot reach its measured speed at some FLOP/s, the fit takes the least
/// bandwidth that brings it within this share (log) of what any bandwidth gives: past that
/// point decode is compute-bound, and only the KV reads still gain.
const KNEE: f64 = 1e-3;
/// A fit left further off than this says so in its source: the roofline cannot reproduce that
/// run's decode and TTFT together (see [`calibrate_device`]).
pub const INEXACT: f64 = 1e-2;

/// `device` with its bandwidth and FLOP/s refitted so that the predictions for the `fitted`
/// row of `measured` (concurrency 1) match it, and `measured` as its measured rows (`source`
/// says where the run came from). At each FLOP/s the fit takes the bandwidth that reproduces
/// decode at one request, and it moves FLOP/s until decode and the first request's TTFT are
/// equally off, which is both exact wherever the roofline can reproduce them: decode's error
/// only falls as FLOP/s rises and TTFT's only rises, so one bisection inside another finds it
/// for any run. Where one request's decode is compute-bound (a slow prefill for its decode,
/// as a run under load can measure), the roofline ties both figures to the same FLOP/s and no
/// bandwidth and FLOP/s reproduce both: the fit stops where predicted decode is as much
/// slower than measured as the predicted TTFT is shorter, and a fit left more than
/// [`INEXACT`] off says how far in its source. Fails without a fitted row at concurrency 1,
/// or where the model does not fit the device.
pub fn calibrate_device(
    table: &DeviceTable,
    device: &DeviceSpec,
    measured: Vec<MeasuredRow>,
    source: &str,
) -> Result<DeviceSpec, PlanError> {
    let fit = (measured.iter())
        .find(|r| r.fitted && r.concurrency == 1)
        .ok_or_else(|| PlanError::Table("calibration needs a fitted run at concurrency 1".into()))?
        .clone();
    let good = |v: f64| v.is_finite() && v > 0.0;
    if !good(fit.per_request_tps) || !good(fit.ttft_ms) {
        return Err(PlanError::Table(format!(
            "the fitted run's figures ({} tok/s, TTFT {} ms) are not positive numbers",
            fit.per_request_tps, fit.ttft_ms
        )));
    }
    let shape = ModelShape::synthetic(&fit.model)?;
    let ty = (fit.precision.parse()).map_err(|e| PlanError::Table(format!("precision: {e}")))?;
    let w = Workload {
        concurrency: 1,
        prompt_len: fit.prompt_len,
        output_len: fit.output_len,
        token_budget: fit.token_budget,
    };
    // The log errors of decode and TTFT (predicted over measured) at log factors (bw, flops).
    let errs = |bw: f64, flops: f64| -> Result<(f64, f64), PlanError> {
        let p = predict(
            table,
            &scaled(device, bw.exp(), flops.exp()),
            &shape,
            ty,
            &w,
        )?;
        match (p.per_request_tps, p.ttft_ms) {
            (Some(tps), Some(ttft)) => {
                Ok(((tps / fit.per_request_tps).ln(), (ttft / fit.ttft_ms).ln()))
            }
            _ => Err(PlanError::Table(format!(
                "{} does not fit {}: nothing to calibrate against",
                fit.model, device.id
            ))),
        }
    };
    let span = SPAN.ln();
    // The bandwidth (log factor) for decode at log FLOP/s factor `flops`, and the errors there:
    // decode exact where some bandwidth reaches it, else the knee past which it is compute-bound.
    let at_flops = |flops: f64| -> Result<(f64, f64, f64), PlanError> {
        let best = errs(span, flops)?.0;
        let goal = if best < 0.0 { best - KNEE } else { 0.0 };
        let (mut lo, mut hi) = (-span, span);
        for _ in 0..HALVINGS {
            let mid = 0.5 * (lo + hi);
            if errs(mid, flops)?.0 < goal {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (d, t) = errs(hi, flops)?;
        Ok((hi, d, t))
    };
    let (mut lo, mut hi) = (-span, span);
    for _ in 0..HALVINGS {
        let mid = 0.5 * (lo + hi);
        let (_, d, t) = at_flops(mid)?;
        if d < t {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (bw_log, d_log, t_log) = at_flops(hi)?;
    // What the fit leaves, as `check` reports it: predicted over measured, less one.
    let left = (d_log.exp() - 1.0, t_log.exp() - 1.0);
    let (bw_factor, flops_factor) = (bw_log.exp(), hi.exp());
    let mut d = scaled(device, bw_factor, flops_factor);
    let mut why = format!(
        "calibrated here ({source}): the {} run at concurrency 1 ({:.1} tok/s per request, TTFT \
         {:.0} ms) through the {} calibration",
        fit.model, fit.per_request_tps, fit.ttft_ms, device.backend
    );
    if left.0.abs() > INEXACT || left.1.abs() > INEXACT {
        why.push_str(&inexact_note(left.0, left.1));
    }
    d.bandwidth_gb_s = Sourced {
        value: device.bandwidth_gb_s.value * bw_factor,
        source: format!(
            "{why}; {:.2}x the table's {} GB/s",
            bw_factor, device.bandwidth_gb_s.value
        ),
    };
    for (p, f) in &mut d.tflops {
        let old = device.tflops.get(p).map_or(f.value, |o| o.value);
        f.source = format!("{why}; {flops_factor:.2}x the table's {old} TFLOP/s");
    }
    d.measured = measured;
    Ok(d)
}

/// What a calibration says when it could not reproduce its run: the errors it left.
pub fn inexact_note(decode_err: f64, ttft_err: f64) -> String {
    format!(
        " (reproduced within {:+.1}% per-request TPS and {:+.1}% TTFT: {INEXACT_WHY})",
        decode_err * 100.0,
        ttft_err * 100.0
    )
}

/// Why a calibration can be left more than [`INEXACT`] off.
pub const INEXACT_WHY: &str =
    "this run's decode was compute-bound, and no bandwidth and FLOP/s reproduce both";

/// `base` with its bandwidth times `bw` and every FLOP/s figure times `flops`.
fn scaled(base: &DeviceSpec, bw: f64, flops: f64) -> DeviceSpec {
    let mut d = base.clone();
    d.measured = Vec::new();
    d.bandwidth_gb_s.value *= bw;
    for f in d.tflops.values_mut() {
        f.value *= flops;
    }
    d
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::plan::check;
    use tpslab_kernels::WType;

    fn row(table: &DeviceTable, d: &DeviceSpec, c: usize, fitted: bool) -> MeasuredRow {
        let shape = ModelShape::synthetic("smollm2-135m").unwrap();
        let w = Workload {
            concurrency: c,
            prompt_len: 128,
            output_len: 128,
            token_budget: 2048,
        };
        let p = predict(table, d, &shape, WType::Q4_1, &w).unwrap();
        MeasuredRow {
            model: "smollm2-135m".into(),
            precision: "Q4_1".into(),
            concurrency: c,
            prompt_len: 128,
            output_len: 128,
            token_budget: 2048,
            aggregate_tps: p.aggregate_tps.unwrap(),
            per_request_tps: p.per_request_tps.unwrap(),
            ttft_ms: p.ttft_ms.unwrap(),
            fitted,
            source: "a machine of known speed".into(),
        }
    }

    /// A run at one request of `tps` tok/s and `ttft` ms, the device calibrated to it, and what
    /// the fit leaves: predicted over measured less one, decode and TTFT.
    fn fit_run(
        table: &DeviceTable,
        cpu: &DeviceSpec,
        tps: f64,
        ttft: f64,
    ) -> (MeasuredRow, DeviceSpec, f64, f64) {
        let mut fit = row(table, cpu, 1, true);
        fit.per_request_tps = tps;
        fit.ttft_ms = ttft;
        let d = calibrate_device(table, cpu, vec![fit.clone()], "test").unwrap();
        let p = row(table, &d, 1, true);
        let de = p.per_request_tps / tps - 1.0;
        let te = p.ttft_ms / ttft - 1.0;
        (fit, d, de, te)
    }

    /// Runs "measured" on a machine with 0.6x the bandwidth and 0.45x the FLOP/s of the table's
    /// CPU: the calibration finds both, so the held-out rows (other concurrencies) are predicted
    /// as that machine runs them, where the uncalibrated row was far off.
    #[test]
    fn finds_the_bandwidth_and_flops_of_a_slower_machine() {
        let table = DeviceTable::bundled().unwrap();
        let cpu = table.device("this-cpu").unwrap();
        let other = scaled(cpu, 0.6, 0.45);
        let rows: Vec<MeasuredRow> = [(1, true), (4, false), (16, false)]
            .iter()
            .map(|&(c, f)| row(&table, &other, c, f))
            .collect();
        let mut before = cpu.clone();
        before.measured = rows.clone();
        let was = check(&table, &before).unwrap().unwrap();
        assert!(was.max_abs_pct > 20.0, "{}", was.text());

        let d = calibrate_device(&table, cpu, rows, "test").unwrap();
        let bw = d.bandwidth_gb_s.value / cpu.bandwidth_gb_s.value;
        let fl = d.tflops["int8"].value / cpu.tflops["int8"].value;
        assert!((bw - 0.6).abs() < 0.01, "bandwidth x{bw}");
        assert!((fl - 0.45).abs() < 0.01, "FLOP/s x{fl}");
        assert!(d.bandwidth_gb_s.source.contains("calibrated here (test)"));
        assert!(
            !d.bandwidth_gb_s.source.contains("reproduce both"),
            "an exact fit"
        );
        let now = check(&table, &d).unwrap().unwrap();
        assert!(now.max_abs_pct < 1.0, "{}", now.text());
        assert_eq!(now.held_out_mean_abs_pct.map(|m| m < 1.0), Some(true));
    }

    #[test]
    fn without_a_fitted_run_at_one_request_there_is_nothing_to_fit() {
        let table = DeviceTable::bundled().unwrap();
        let cpu = table.device("this-cpu").unwrap();
        let rows = vec![row(&table, cpu, 4, true), row(&table, cpu, 1, false)];
        let e = calibrate_device(&table, cpu, rows, "test").unwrap_err();
        assert!(e.to_string().contains("concurrency 1"), "{e}");
    }

    /// Runs whose prefill is slow for their decode, both measured under load during a full test
    /// run (70.5 tok/s a request with a TTFT of 506 ms; 139.6 tok/s with 412 ms in CI). Past the
    /// point where one request's decode is compute-bound, the roofline ties its decode and
    /// prefill to the same FLOP/s, and no bandwidth and FLOP/s reproduce both: the fit stops
    /// where the two are equally off (predicted decode as much slower than measured as the
    /// predicted TTFT is shorter), the least-squares point of their logarithms. How far that is
    /// depends on the run (3.2% and 25% for these two under the bundled calibration of
    /// 2026-12-06); it is said in the calibration's source, as `check` computes it.
    #[test]
    fn a_slow_prefill_for_its_decode_is_fitted_where_both_are_equally_off() {
        let table = DeviceTable::bundled().unwrap();
        let cpu = table.device("this-cpu").unwrap();
        for (tps, ttft) in [
            (70.530_060_427_678_88, 506.246_002),
            (139.633_536, 411.636_406),
        ] {
            let (_, d, de, te) = fit_run(&table, cpu, tps, ttft);
            assert!(
                de < -INEXACT && te < -INEXACT,
                "{de} {te}: not reproducible"
            );
            assert!((de - te).abs() < 1e-6, "{de} vs {te}");
            let src = &d.bandwidth_gb_s.source;
            assert!(src.contains(&inexact_note(de, te)), "{src}");
        }
    }

    /// Any run, however odd (decode from 20 to 580 tok/s, TTFT from 30 ms to 3 s), gets a fit:
    /// exact, or both figures equally off, or (where a fast TTFT is out of reach of the
    /// bandwidth a slow decode pins) decode exact and TTFT as close as any FLOP/s brings it. The
    /// fit this replaced diverged on some of these (a TTFT predicted at 1 ms for 2.8 s).
    #[test]
    fn every_run_gets_an_exact_or_balanced_fit() {
        let table = DeviceTable::bundled().unwrap();
        let cpu = table.device("this-cpu").unwrap();
        let (mut exact, mut balanced, mut out_of_reach) = (0, 0, 0);
        for i in 0..12 {
            for j in 0..12 {
                let (tps, ttft) = (20.0 * 1.35_f64.powi(i), 30.0 * 1.47_f64.powi(j));
                let (fit, d, de, te) = fit_run(&table, cpu, tps, ttft);
                let at = format!("{fit:?}: {de} {te}");
                if de.abs() < 1e-6 && te.abs() < 1e-6 {
                    exact += 1;
                } else if (de - te).abs() < 1e-6 {
                    assert!(de < 0.0, "decode predicted too slow, TTFT too short: {at}");
                    balanced += 1;
                } else {
                    assert!(de.abs() < 1e-6 && te > 0.0, "{at}");
                    out_of_reach += 1;
                }
                let inexact = de.abs() > INEXACT || te.abs() > INEXACT;
                let src = &d.bandwidth_gb_s.source;
                assert_eq!(src.contains(&inexact_note(de, te)), inexact, "{src}");
            }
        }
        assert!(
            exact > 0 && balanced > 0 && out_of_reach > 0,
            "{exact} {balanced} {out_of_reach}"
        );
    }

    #[test]
    fn a_fitted_run_that_is_not_a_positive_number_is_refused() {
        let table = DeviceTable::bundled().unwrap();
        let cpu = table.device("this-cpu").unwrap();
        for (tps, ttft) in [
            (0.0, 100.0),
            (f64::NAN, 100.0),
            (100.0, -1.0),
            (100.0, f64::INFINITY),
        ] {
            let mut fit = row(&table, cpu, 1, true);
            fit.per_request_tps = tps;
            fit.ttft_ms = ttft;
            let e = calibrate_device(&table, cpu, vec![fit], "test").unwrap_err();
            assert!(e.to_string().contains("not positive numbers"), "{e}");
        }
    }
}
