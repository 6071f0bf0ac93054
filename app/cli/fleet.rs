//! `tpslab fleet`: the fleet simulator on the command line. A workload (a tuner preset at a
//! rate, shaped by a burst or a daily curve, or a recorded trace scaled to a rate) is replayed
//! against each configuration (device x precision x minimum replicas); one row per
//! configuration with P50/P99 TTFT, ITL and E2E latency, requests shed, replicas, GPU-hours and
//! $ per million output tokens, and the cheapest configuration that meets the SLO. `--json`
//! writes the whole comparison (windows and replica timelines too), `--csv` one row per
//! configuration and window.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use tpslab_engine::plan::fleet::{
    Arrival, Autoscale, ColdStart, Comparison, FleetConfig, FleetReport, Generated, Latency,
    Limits, RateShape, ReplicaSpec, ScaleMetric, Slo, compare, from_trace, generate,
    to_trace_lines,
};
use tpslab_engine::plan::{DeviceTable, Sourced};
use tpslab_engine::quant::preset::weight_type;
use tpslab_engine::tune::Trace;
use tpslab_engine::tune::workload::{MAX_TRACE_LEN, preset};
use tpslab_kernels::WType;

#[derive(Args, Debug)]
pub struct FleetArgs {
    /// A GGUF file or `default` (its header is read; no weights are loaded).
    #[arg(long, conflicts_with = "synthetic")]
    pub model: Option<String>,
    /// Instead of a file: a known architecture's shape (llama-3-8b, llama-3.2-1b, ...).
    #[arg(long, value_name = "ARCH")]
    pub synthetic: Option<String>,
    /// Devices of the table, one configuration each (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "h100")]
    pub device: Vec<String>,
    /// Weight precisions, one configuration each (default: the file's own, or f16).
    #[arg(long, value_delimiter = ',', value_parser = weight_type)]
    pub precision: Vec<WType>,
    /// Minimum replicas, one configuration each (comma separated): the fleet starts with them.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub min_replicas: Vec<usize>,
    #[arg(long, default_value_t = 8)]
    pub max_replicas: usize,
    /// Sequences a replica runs at once.
    #[arg(long, default_value_t = 64)]
    pub max_seqs: usize,
    /// Tokens a replica's step takes at most.
    #[arg(long, default_value_t = 8192)]
    pub token_budget: usize,
    /// What the autoscaler steers by: `queue` (requests waiting per ready replica) or `kv`
    /// (share of KV in use).
    #[arg(long, default_value = "queue", value_parser = ["queue", "kv"])]
    pub scale_on: String,
    /// The autoscaler's target of --scale-on (requests, or a share of 1).
    #[arg(long, default_value_t = 4.0)]
    pub target: f64,
    /// How often the autoscaler looks, s.
    #[arg(long, default_value_t = 10.0)]
    pub interval_s: f64,
    /// From the decision to the new replica's machine being there, s.
    #[arg(long, default_value_t = 60.0)]
    pub scale_up_delay_s: f64,
    /// How long the fleet must want fewer replicas before one is drained, s.
    #[arg(long, default_value_t = 300.0)]
    pub scale_down_after_s: f64,
    /// A replica whose queue holds this many requests sheds new ones.
    #[arg(long, default_value_t = 256)]
    pub queue_limit: usize,
    /// A measured cold start, s (else --disk-gb-s prices it from the weights).
    #[arg(
        long,
        conflicts_with = "disk_gb_s",
        required_unless_present = "disk_gb_s"
    )]
    pub cold_start_s: Option<f64>,
    /// Read bandwidth of the disk the weights load from, GB/s: a new replica loads its weights
    /// at the slower of it and the device table's host-to-device bandwidth.
    #[arg(long)]
    pub disk_gb_s: Option<f64>,
    /// Your price of one device-hour, $ (default: the device table's, with its source).
    #[arg(long)]
    pub usd_per_hour: Option<f64>,
    /// A workload preset (chat, summarize, code-completion, long-context): lengths drawn from
    /// its ranges, arrivals Poisson at --rate.
    #[arg(long, default_value = "chat", conflicts_with = "trace")]
    pub workload: String,
    /// A recorded trace (`tpslab serve --record-trace FILE`): its requests at their own times,
    /// rescaled so its mean rate is --rate when given.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Requests per second: the base rate of a generated workload, or a trace's mean rate.
    #[arg(long, required_unless_present = "trace")]
    pub rate: Option<f64>,
    /// Seconds of generated arrivals.
    #[arg(long, default_value_t = 600.0, conflicts_with = "trace")]
    pub duration_s: f64,
    /// A burst: AT_S:FOR_S:FACTOR, the rate times FACTOR from AT_S for FOR_S seconds.
    #[arg(long, value_name = "AT:FOR:FACTOR", value_parser = parse_burst, conflicts_with_all = ["daily", "trace"])]
    pub burst: Option<RateShape>,
    /// A daily curve: PERIOD_S:SWING, the rate times 1 - SWING cos(2 pi t / PERIOD_S).
    #[arg(long, value_name = "PERIOD:SWING", value_parser = parse_daily, conflicts_with = "trace")]
    pub daily: Option<RateShape>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Objectives over the replay: ttft_p99_ms, itl_p99_ms, e2e_p99_ms (ms) and max_shed (share
    /// of requests shed, refused or unfinished), as KEY=VALUE,...
    #[arg(long, value_parser = parse_slo, default_value = "max_shed=0")]
    pub slo: Slo,
    /// Length of a time window of the per-window figures, s.
    #[arg(long, default_value_t = 60.0)]
    pub window_s: f64,
    /// The replay goes on at most this long after the last arrival, s.
    #[arg(long, default_value_t = 3600.0)]
    pub drain_s: f64,
    /// Also print each configuration's windows.
    #[arg(long)]
    pub windows: bool,
    /// A device table to use instead of the bundled `assets/devices.json`.
    #[arg(long, value_name = "FILE")]
    pub devices: Option<PathBuf>,
    /// Write the whole comparison as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one row per configuration and window as CSV here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write the replayed arrivals as a trace file here (to replay or edit later).
    #[arg(long, value_name = "FILE")]
    pub write_trace: Option<PathBuf>,
}

fn parts<const N: usize>(s: &str, what: &str) -> Result<[f64; N], String> {
    let v: Vec<f64> = (s.split(':'))
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .map_err(|e| format!("{what}: '{p}': {e}"))
        })
        .collect::<Result<_, _>>()?;
    v.try_into()
        .map_err(|_| format!("{what}: give {N} numbers separated by ':'"))
}

fn parse_burst(s: &str) -> Result<RateShape, String> {
    let [at_s, for_s, factor] = parts(s, "--burst AT:FOR:FACTOR")?;
    Ok(RateShape::Burst {
        at_s,
        for_s,
        factor,
    })
}

fn parse_daily(s: &str) -> Result<RateShape, String> {
    let [period_s, swing] = parts(s, "--daily PERIOD:SWING")?;
    Ok(RateShape::Daily { period_s, swing })
}

fn parse_slo(s: &str) -> Result<Slo, String> {
    let mut slo = Slo::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}' is not KEY=VALUE"))?;
        let v: f64 = v.trim().parse().map_err(|e| format!("{k}: {e}"))?;
        match k.trim() {
            "ttft_p99_ms" => slo.ttft_p99_ms = Some(v),
            "itl_p99_ms" => slo.itl_p99_ms = Some(v),
            "e2e_p99_ms" => slo.e2e_p99_ms = Some(v),
            "max_shed" => slo.max_shed_share = v,
            k => {
                return Err(format!(
                    "unknown objective '{k}' (ttft_p99_ms, itl_p99_ms, e2e_p99_ms, max_shed)"
                ));
            }
        }
    }
    Ok(slo)
}

/// The arrivals of the workload the flags describe.
fn arrivals(a: &FleetArgs) -> Result<(Vec<Arrival>, String)> {
    if let Some(path) = &a.trace {
        let entries = Trace::read_entries(path, MAX_TRACE_LEN)?;
        let out = from_trace(&entries, a.rate)?;
        let label = format!(
            "trace {} ({} requests{})",
            path.display(),
            out.len(),
            a.rate
                .map_or(String::new(), |r| format!(", scaled to {r} req/s"))
        );
        return Ok((out, label));
    }
    let (prompt_len, output_len) = preset(&a.workload)?;
    let shape = a.burst.or(a.daily).unwrap_or(RateShape::Steady);
    let rate = a.rate.unwrap_or(0.0);
    let label = format!(
        "{} (prompt {prompt_len}, output {output_len}) at {rate} req/s for {} s, {}",
        a.workload,
        a.duration_s,
        match shape {
            RateShape::Steady => "steady".to_string(),
            RateShape::Burst {
                at_s,
                for_s,
                factor,
            } => {
                format!("x{factor} from {at_s} s for {for_s} s")
            }
            RateShape::Daily { period_s, swing } => {
                format!("daily curve, period {period_s} s, swing {swing}")
            }
        }
    );
    let g = Generated {
        prompt_len,
        output_len,
        rate,
        duration_s: a.duration_s,
        shape,
        seed: a.seed,
    };
    Ok((generate(&g)?, label))
}

fn configs(a: &FleetArgs, own: WType) -> Result<Vec<FleetConfig>> {
    if a.device.is_empty() || a.min_replicas.is_empty() {
        bail!("--device and --min-replicas need at least one value");
    }
    let precisions = if a.precision.is_empty() {
        vec![own]
    } else {
        a.precision.clone()
    };
    let metric = match a.scale_on.as_str() {
        "kv" => ScaleMetric::KvUse(a.target),
        _ => ScaleMetric::QueueDepth(a.target),
    };
    let cold_start = match (a.cold_start_s, a.disk_gb_s) {
        (Some(seconds), _) => ColdStart::Measured { seconds },
        (None, Some(disk_gb_s)) => ColdStart::Load { disk_gb_s },
        (None, None) => bail!("give --cold-start-s or --disk-gb-s"),
    };
    let usd_per_hour = a.usd_per_hour.map(|value| Sourced {
        value,
        source: "given: --usd-per-hour".into(),
    });
    let mut out = Vec::new();
    for d in &a.device {
        for &ty in &precisions {
            for &min in &a.min_replicas {
                out.push(FleetConfig {
                    name: format!("{d} {} min {min}", ty.name()),
                    replica: ReplicaSpec {
                        device: d.clone(),
                        precision: ty,
                        max_seqs: a.max_seqs,
                        token_budget: a.token_budget,
                        usd_per_hour: usd_per_hour.clone(),
                    },
                    autoscale: Autoscale {
                        min,
                        max: a.max_replicas.max(min),
                        metric,
                        interval_s: a.interval_s,
                        scale_up_delay_s: a.scale_up_delay_s,
                        scale_down_after_s: a.scale_down_after_s,
                    },
                    queue_limit: a.queue_limit,
                    cold_start,
                });
            }
        }
    }
    Ok(out)
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

/// The heads of [`latency_cells`]' columns.
const LATENCY_HEAD: &str = " ttft_p50  ttft_p99 itl_p50 itl_p99  e2e_p50  e2e_p99";

/// The six latency figures as the tables print them (the widths of their heads).
fn latency_cells(l: &Latency) -> String {
    let [a, b, c, d, e, f] = l.figures().map(ms);
    format!("{a:>9} {b:>9} {c:>7} {d:>7} {e:>8} {f:>8}")
}

fn print_windows(r: &FleetReport) {
    println!("\n{}: windows", r.config);
    println!(
        "{:>7} {:>7} {:>5} {} {:>8} {:>8}",
        "start_s", "arrived", "shed", LATENCY_HEAD, "replicas", "booting"
    );
    for w in &r.windows {
        println!(
            "{:>7.0} {:>7} {:>5} {} {:>8.1} {:>8.1}",
            w.start_s,
            w.arrivals,
            w.shed,
            latency_cells(&w.latency),
            w.replicas_mean,
            w.booting_mean
        );
    }
}

fn print(c: &Comparison) {
    println!(
        "{:<22} {} {:>6} {:>8} {:>9} {:>9} {:>8}  slo",
        "config", LATENCY_HEAD, "shed", "replicas", "gpu_hours", "usd", "$/M tok"
    );
    for r in &c.reports {
        let s = &r.summary;
        let misses = r.slo_misses.clone().unwrap_or_default();
        println!(
            "{:<22} {} {:>6} {:>8} {:>9.3} {:>9.2} {:>8}  {}",
            r.config,
            latency_cells(&s.latency),
            s.shed + s.too_long,
            format!("{}-{}", r.autoscale.min, s.max_replicas),
            s.gpu_hours,
            s.usd,
            s.usd_per_million_output_tokens
                .map_or("-".into(), |v| format!("{v:.3}")),
            if misses.is_empty() {
                "meets".to_string()
            } else {
                format!("misses: {}", misses.join("; "))
            }
        );
    }
    println!();
    for r in &c.reports {
        println!(
            "{}: KV {} tokens per replica, cold start {:.1} s ({}), ${}/device-hour ({}); {} finished, {} unfinished, {} preemptions",
            r.config,
            r.kv_capacity_tokens,
            r.cold_start_s,
            r.cold_start_source,
            r.usd_per_hour.value,
            r.usd_per_hour.source,
            r.summary.finished,
            r.summary.unfinished,
            r.summary.preemptions
        );
    }
    match &c.cheapest_meeting_slo {
        Some(name) => println!("cheapest configuration that meets the SLO: {name}"),
        None => println!("no configuration meets the SLO"),
    }
}

/// One CSV row per configuration and window.
fn csv(c: &Comparison) -> String {
    let mut s = format!(
        "config,start_s,end_s,arrivals,shed,finished,output_tokens,{},replicas_mean,replicas_max,booting_mean\n",
        Latency::NAMES.join(",")
    );
    let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    for r in &c.reports {
        for w in &r.windows {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{:.3},{},{:.3}",
                r.config,
                w.start_s,
                w.end_s,
                w.arrivals,
                w.shed,
                w.finished,
                w.output_tokens,
                w.latency.figures().map(o).join(","),
                w.replicas_mean,
                w.replicas_max,
                w.booting_mean
            );
        }
    }
    s
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

pub fn run(a: &FleetArgs) -> Result<()> {
    let table = match &a.devices {
        Some(p) => DeviceTable::load(p)?,
        None => DeviceTable::bundled()?,
    };
    let (shape, own) = super::plan::shape_of(a.model.as_deref(), a.synthetic.as_deref())?;
    let (arrivals, label) = arrivals(a)?;
    let configs = configs(a, own)?;
    let limits = Limits {
        window_s: a.window_s,
        drain_s: a.drain_s,
        ..Limits::default()
    };
    let c = compare(&table, &shape, &configs, &arrivals, &limits, a.slo)?;
    println!(
        "fleet: {} ({} layers, hidden {}); workload: {label}",
        shape.name, shape.n_layers, shape.hidden
    );
    if a.windows {
        c.reports.iter().for_each(print_windows);
        println!();
    }
    print(&c);
    if let Some(path) = &a.json {
        write(path, &serde_json::to_string_pretty(&c)?)?;
    }
    if let Some(path) = &a.csv {
        write(path, &csv(&c))?;
    }
    if let Some(path) = &a.write_trace {
        write(path, &to_trace_lines(&arrivals))?;
    }
    Ok(())
}
