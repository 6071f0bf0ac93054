//! The planner's device table: each device's memory bandwidth, FLOP/s per precision, memory,
//! price and link to its peers (NVLink or PCIe: what a model split over GPUs pays to talk),
//! every value with where it comes from; each backend's calibration (the share of the roofline
//! an engine reaches, fitted on measured runs: this engine's, and vLLM's and SGLang's from their
//! published runs); the measured rows the predictions are checked against, and the published
//! multi-GPU runs of other engines. Users edit the JSON (`assets/devices.json` is bundled; any
//! copy can be passed instead); every number is checked before use.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::PlanError;

/// The table bundled with the binary.
pub const BUNDLED: &str = include_str!("../../../assets/devices.json");

/// A table file larger than this is not a device table.
const MAX_TABLE_BYTES: u64 = 4 << 20;

/// One figure and where it comes from (a datasheet, a price list, a measurement).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sourced {
    pub value: f64,
    pub source: String,
}

/// One device of the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceSpec {
    /// What `--device` names it by ("h200").
    pub id: String,
    pub name: String,
    /// Whose calibration applies ("cuda", "cpu"): the engine's backend that runs it, or the
    /// nearest one.
    pub backend: String,
    /// Peak memory bandwidth, GB/s (10^9 bytes).
    pub bandwidth_gb_s: Sourced,
    /// Peak dense FLOP/s per compute precision ("f16", "bf16", "f32", "int8"), in TFLOP/s.
    pub tflops: BTreeMap<String, Sourced>,
    /// Memory for weights and KV, GiB.
    pub memory_gib: Sourced,
    /// What an hour of the device costs, $.
    pub usd_per_hour: Sourced,
    /// Host-to-device copy bandwidth, GB/s (one way of its PCIe link): with the disk's read
    /// bandwidth, what a fleet's new replica takes to load its weights. Absent where the
    /// device shares the host's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_to_device_gb_s: Option<Sourced>,
    /// The link to the other GPUs of its machine, for tensor, pipeline and expert parallelism;
    /// absent where the device is planned alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<Link>,
    /// Runs of this engine on this device the predictions are checked against.
    #[serde(default)]
    pub measured: Vec<MeasuredRow>,
    /// Published runs of other engines (vLLM, SGLang) on one or several of this device, each
    /// predicted with its engine's calibration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published: Vec<PublishedRow>,
}

/// A GPU's link to its peers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// "NVLink4", "PCIe Gen4 x16".
    pub kind: String,
    /// Bandwidth per GPU, GB/s, both directions together as datasheets quote it (NVLink4: 900);
    /// a ring all-reduce or a send uses one direction of it, half.
    pub bandwidth_gb_s: Sourced,
    /// The fixed cost of one small collective (an all-reduce, an all-to-all, a send), µs.
    pub latency_us: Sourced,
}

impl Link {
    /// Bytes per second one way.
    pub fn one_way_bytes_s(&self) -> f64 {
        self.bandwidth_gb_s.value * 1e9 / 2.0
    }
}

/// A published run of another engine: its configuration, workload, the output tokens per second
/// it reported and where (the page, with its conditions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedRow {
    /// A `--synthetic` architecture of the model's shape ("qwen2.5-72b").
    pub model: String,
    pub precision: String,
    /// Whose calibration predicts it ("vllm", "sglang").
    pub engine: String,
    #[serde(default = "one")]
    pub tp: usize,
    #[serde(default = "one")]
    pub pp: usize,
    #[serde(default = "one")]
    pub ep: usize,
    pub concurrency: usize,
    pub prompt_len: usize,
    pub output_len: usize,
    pub token_budget: usize,
    /// Output tokens per second of the whole run, as published.
    pub output_tps: f64,
    /// Used to fit the engine's calibration (the other rows are held out).
    #[serde(default)]
    pub fitted: bool,
    pub source: String,
}

fn one() -> usize {
    1
}

/// Link figures past these are not a GPU's (NVLink5 is 1800 GB/s; a collective is microseconds).
const MAX_LINK_GB_S: f64 = 10_000.0;
const MAX_LINK_LATENCY_US: f64 = 10_000.0;

/// A measured run of `tpslab bench`: the workload and the figures it reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredRow {
    /// A `--synthetic` architecture of the model's shape ("llama-3-8b").
    pub model: String,
    pub precision: String,
    pub concurrency: usize,
    pub prompt_len: usize,
    pub output_len: usize,
    pub token_budget: usize,
    pub aggregate_tps: f64,
    pub per_request_tps: f64,
    /// Median TTFT.
    pub ttft_ms: f64,
    /// Used to fit the calibration (the other rows are held out).
    #[serde(default)]
    pub fitted: bool,
    pub source: String,
}

/// The share of the roofline this engine reaches on one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Share of peak bandwidth a step's weight reads reach, by weight type name ("F16",
    /// "Q4_K"); `default` for the others.
    pub weight_bandwidth_efficiency: BTreeMap<String, f64>,
    /// Share of peak bandwidth the attention's KV reads reach.
    pub kv_bandwidth_efficiency: f64,
    /// Share of peak FLOP/s of a decode step's matmuls (one row per sequence).
    pub decode_compute_efficiency: f64,
    /// Past this many sequences in a decode step, its matmuls run at
    /// `batched_compute_efficiency` instead, and their weight pass adds to the dots rather than
    /// overlapping them (the CPU backend's switch from reading weights in place to repacking
    /// them into panels at 10 rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batched_above_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batched_compute_efficiency: Option<f64>,
    /// Share of peak FLOP/s of a prefill step's matmuls (many rows per sequence).
    pub prefill_compute_efficiency: f64,
    /// Which of the device's FLOP/s the matmuls run at ("f16", "f32").
    pub compute_precision: String,
    /// Fixed time of every step (launches, host work), ms.
    pub step_overhead_ms: f64,
    /// Fixed time before a request's first token besides its prefill, ms.
    pub ttft_overhead_ms: f64,
    /// Past this many tokens in a step, quantized weights are dequantized to F16 every step (the
    /// CUDA backend's batched path): their bytes, then F16's written and read.
    #[serde(default)]
    pub dequant_above_tokens: Option<usize>,
    /// Memory kept free of weights and KV (activations, workspace), GiB.
    pub memory_reserve_gib: f64,
    /// How the values were found.
    pub source: String,
}

/// The whole table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceTable {
    pub devices: Vec<DeviceSpec>,
    pub calibrations: BTreeMap<String, Calibration>,
}

fn positive(what: &str, v: f64) -> Result<(), PlanError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(PlanError::Table(format!(
            "{what} must be a positive number, not {v}"
        )))
    }
}

fn share(what: &str, v: f64) -> Result<(), PlanError> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(PlanError::Table(format!(
            "{what} must be in (0, 1], not {v}"
        )))
    }
}

/// Positive, finite and at most `max` (past it a figure is a typo, not a device).
fn at_most(what: &str, v: f64, max: f64) -> Result<(), PlanError> {
    positive(what, v)?;
    if v <= max {
        Ok(())
    } else {
        Err(PlanError::Table(format!(
            "{what} {v} is past {max}: not a real device"
        )))
    }
}

fn non_negative(what: &str, v: f64) -> Result<(), PlanError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(PlanError::Table(format!(
            "{what} must be 0 or more, not {v}"
        )))
    }
}

impl DeviceTable {
    /// The table bundled with the binary.
    pub fn bundled() -> Result<Self, PlanError> {
        Self::parse(BUNDLED)
    }

    /// Puts `new` in the place of the device with its id (a calibrated row); returns the one it
    /// replaced.
    pub fn replace_device(&mut self, new: DeviceSpec) -> Result<DeviceSpec, PlanError> {
        let slot = (self.devices.iter_mut())
            .find(|d| d.id == new.id)
            .ok_or_else(|| PlanError::Table(format!("device {} is not in the table", new.id)))?;
        Ok(std::mem::replace(slot, new))
    }

    /// A table file (size-capped, then checked as [`Self::parse`]).
    pub fn load(path: &Path) -> Result<Self, PlanError> {
        let err = |e: std::io::Error| PlanError::Table(format!("{}: {e}", path.display()));
        let len = std::fs::metadata(path).map_err(err)?.len();
        if len > MAX_TABLE_BYTES {
            return Err(PlanError::Table(format!(
                "{}: {len} bytes, more than a device table's {MAX_TABLE_BYTES}",
                path.display()
            )));
        }
        Self::parse(&std::fs::read_to_string(path).map_err(err)?)
    }

    /// A table from its JSON, every value checked: figures positive and finite, efficiencies
    /// in (0, 1], each device's backend calibrated and its compute precision listed.
    pub fn parse(json: &str) -> Result<Self, PlanError> {
        let t: Self = serde_json::from_str(json).map_err(|e| PlanError::Table(e.to_string()))?;
        for (name, c) in &t.calibrations {
            let what = |f: &str| format!("calibration {name}: {f}");
            for (ty, &e) in &c.weight_bandwidth_efficiency {
                share(&what(&format!("weight_bandwidth_efficiency.{ty}")), e)?;
            }
            if !c.weight_bandwidth_efficiency.contains_key("default") {
                return Err(PlanError::Table(what(
                    "weight_bandwidth_efficiency has no default",
                )));
            }
            share(&what("kv_bandwidth_efficiency"), c.kv_bandwidth_efficiency)?;
            share(
                &what("decode_compute_efficiency"),
                c.decode_compute_efficiency,
            )?;
            share(
                &what("prefill_compute_efficiency"),
                c.prefill_compute_efficiency,
            )?;
            match (c.batched_above_tokens, c.batched_compute_efficiency) {
                (None, None) => {}
                (Some(_), Some(e)) => share(&what("batched_compute_efficiency"), e)?,
                _ => {
                    return Err(PlanError::Table(what(
                        "batched_above_tokens and batched_compute_efficiency go together",
                    )));
                }
            }
            non_negative(&what("step_overhead_ms"), c.step_overhead_ms)?;
            non_negative(&what("ttft_overhead_ms"), c.ttft_overhead_ms)?;
            non_negative(&what("memory_reserve_gib"), c.memory_reserve_gib)?;
        }
        let mut ids = std::collections::BTreeSet::new();
        for d in &t.devices {
            let what = |f: &str| format!("device {}: {f}", d.id);
            if !ids.insert(d.id.to_ascii_lowercase()) {
                return Err(PlanError::Table(what("listed twice")));
            }
            positive(&what("bandwidth_gb_s"), d.bandwidth_gb_s.value)?;
            positive(&what("memory_gib"), d.memory_gib.value)?;
            non_negative(&what("usd_per_hour"), d.usd_per_hour.value)?;
            if let Some(h2d) = &d.host_to_device_gb_s {
                positive(&what("host_to_device_gb_s"), h2d.value)?;
            }
            for (p, f) in &d.tflops {
                positive(&what(&format!("tflops.{p}")), f.value)?;
            }
            check_link_and_published(d, &t.calibrations)?;
            let cal = t
                .calibrations
                .get(&d.backend)
                .ok_or_else(|| PlanError::NoCalibration {
                    device: d.id.clone(),
                    backend: d.backend.clone(),
                })?;
            if !d.tflops.contains_key(&cal.compute_precision) {
                return Err(PlanError::Table(what(&format!(
                    "no tflops.{} (what backend {} computes at)",
                    cal.compute_precision, d.backend
                ))));
            }
            for r in &d.measured {
                for (f, v) in [
                    ("aggregate_tps", r.aggregate_tps),
                    ("per_request_tps", r.per_request_tps),
                    ("ttft_ms", r.ttft_ms),
                ] {
                    positive(&what(&format!("measured {f}")), v)?;
                }
            }
        }
        Ok(t)
    }

    /// The device `id` (case-insensitive), or an error listing the known ones.
    pub fn device(&self, id: &str) -> Result<&DeviceSpec, PlanError> {
        let wanted = id.trim().to_ascii_lowercase();
        (self.devices.iter())
            .find(|d| d.id.to_ascii_lowercase() == wanted)
            .ok_or_else(|| PlanError::UnknownDevice {
                name: id.to_string(),
                known: self.ids().join(", "),
            })
    }

    /// The devices' ids in table order.
    pub fn ids(&self) -> Vec<&str> {
        self.devices.iter().map(|d| d.id.as_str()).collect()
    }

    /// The calibration of `d`'s backend (present: [`Self::parse`] checked it).
    pub fn calibration(&self, d: &DeviceSpec) -> Result<&Calibration, PlanError> {
        self.calibrations
            .get(&d.backend)
            .ok_or_else(|| PlanError::NoCalibration {
                device: d.id.clone(),
                backend: d.backend.clone(),
            })
    }

    /// The devices whose backend is `backend` that have measured rows (where a calibration's
    /// error is known).
    pub fn measured_on(&self, backend: &str) -> Vec<&DeviceSpec> {
        (self.devices.iter())
            .filter(|d| d.backend == backend && !d.measured.is_empty())
            .collect()
    }
}

/// A device's link and published rows: link figures positive and not absurd; each published
/// row's engine calibrated, computing at a precision the device lists, its figures positive
/// and its split 1 to 64 GPUs a dimension, with a link when it spans several.
fn check_link_and_published(
    d: &DeviceSpec,
    calibrations: &BTreeMap<String, Calibration>,
) -> Result<(), PlanError> {
    let what = |f: &str| format!("device {}: {f}", d.id);
    if let Some(l) = &d.link {
        at_most(
            &what("link.bandwidth_gb_s"),
            l.bandwidth_gb_s.value,
            MAX_LINK_GB_S,
        )?;
        at_most(
            &what("link.latency_us"),
            l.latency_us.value,
            MAX_LINK_LATENCY_US,
        )?;
    }
    for r in &d.published {
        let row = |f: &str| what(&format!("published {} {}: {f}", r.engine, r.model));
        let cal = (calibrations.get(&r.engine))
            .ok_or_else(|| PlanError::Table(row("engine has no calibration")))?;
        if !d.tflops.contains_key(&cal.compute_precision) {
            return Err(PlanError::Table(row(&format!(
                "no tflops.{} (what {} computes at)",
                cal.compute_precision, r.engine
            ))));
        }
        positive(&row("output_tps"), r.output_tps)?;
        for (f, v) in [("tp", r.tp), ("pp", r.pp), ("ep", r.ep)] {
            if v == 0 || v > 64 {
                return Err(PlanError::Table(row(&format!("{f} {v} is not 1 to 64"))));
            }
        }
        if r.tp * r.pp > 1 && d.link.is_none() {
            return Err(PlanError::Table(row(
                "several GPUs, but the device has no link",
            )));
        }
    }
    Ok(())
}

impl Calibration {
    /// The weight-read efficiency of type `ty` (its name), else the default.
    pub fn weight_efficiency(&self, ty: &str) -> f64 {
        let by = &self.weight_bandwidth_efficiency;
        by.get(ty)
            .or_else(|| by.get("default"))
            .copied()
            .unwrap_or(1.0)
    }
}
