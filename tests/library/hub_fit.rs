//! The fit verdict before a download: a repo of several GGUF files on the local Hub test server
//! (tests/support/hub_server.rs) read from their headers alone (HTTP range requests), through
//! the API (`tpslab::hub::read_ggufs`) and in the Models panel (egui_kittest). The files: the
//! default model (Q4_1), its Q8_0 re-quantization by this engine, a file of an architecture the
//! engine does not run (mamba), a llama header whose KV at 4096 tokens is ~137 GB (does not fit),
//! a hostile header (an array of 2^50 strings in 64 bytes) and one whose header would go on past
//! the 32 MiB cap.

use crate::gui_wait;
use crate::hub_server;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use gui_wait::wait_until;
use hub_server::{File, HubServer, RepoData};
use tpslab::hub::{self, GgufFit, HubConfig, Machine};
use tpslab::ui::files::{DialogAnswer, FixedDialog};
use tpslab::ui::{AppOptions, AppState, Tab, TpsApp};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::formats::gguf::{GgufFile, Value};
use tpslab_engine::formats::gguf_write::{TensorDesc, write_gguf};
use tpslab_engine::kv::KvTypes;
use tpslab_engine::library::fit::{KV_BLOCK, Verdict};
use tpslab_engine::model::config::ModelConfig;
use tpslab_engine::quant::quantize::{QuantizeOptions, plan, quantize_file};
use tpslab_kernels::WType;

const REPO: &str = "test/fit-many";
const Q4_1: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const Q8_0: &str = "SmolLM2-135M-Instruct.Q8_0.gguf";
const MAMBA: &str = "mamba-tiny.F32.gguf";
const HUGE: &str = "huge-kv.F16.gguf";
const HOSTILE: &str = "hostile.gguf";
const ENDLESS: &str = "endless-header.gguf";
const GIB: u64 = 1 << 30;

fn default_model() -> PathBuf {
    tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("default model")
}

fn s(v: &str) -> Value {
    Value::String(v.into())
}

/// A GGUF in memory with this metadata and one small F32/F16 tensor.
fn gguf(md: &[(&str, Value)], ty: WType) -> Vec<u8> {
    let md: Vec<(String, Value)> = md.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let desc = TensorDesc::new("token_embd.weight", vec![64, 4], ty);
    let bytes = vec![0u8; desc.size() as usize];
    write_gguf(Vec::new(), &md, &[(desc, bytes)]).expect("write gguf")
}

/// GGUF v3 preamble: magic, version, tensor count 0, one metadata entry.
fn preamble() -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b
}

fn files() -> &'static [File] {
    static F: OnceLock<Vec<File>> = OnceLock::new();
    F.get_or_init(|| {
        let base = default_model();
        let q8 = std::env::temp_dir().join(format!("tpslab-hub-fit-{}.gguf", std::process::id()));
        let f = GgufFile::open(&base).expect("open");
        let p = plan(&f, WType::Q8_0).expect("plan");
        let opts = QuantizeOptions {
            threads: 2,
            cancel: None,
        };
        quantize_file(&f, &p, &q8, opts, &mut |_| {}).expect("quantize");
        let q8_bytes = std::fs::read(&q8).expect("read q8");
        let _ = std::fs::remove_file(&q8);
        let mamba = gguf(
            &[
                ("general.architecture", s("mamba")),
                ("mamba.context_length", Value::U32(2048)),
                ("mamba.block_count", Value::U32(2)),
            ],
            WType::F32,
        );
        let huge = gguf(
            &[
                ("general.architecture", s("llama")),
                ("llama.block_count", Value::U32(512)),
                ("llama.embedding_length", Value::U32(16384)),
                ("llama.feed_forward_length", Value::U32(65536)),
                ("llama.attention.head_count", Value::U32(64)),
                ("llama.attention.head_count_kv", Value::U32(64)),
                ("llama.context_length", Value::U32(131072)),
                ("llama.vocab_size", Value::U32(64)),
            ],
            WType::F16,
        );
        // An array of 2^50 strings declared in a 64-byte file.
        let mut hostile = preamble();
        hostile.extend_from_slice(&9u32.to_le_bytes());
        hostile.extend_from_slice(&8u32.to_le_bytes());
        hostile.extend_from_slice(&(1u64 << 50).to_le_bytes());
        hostile.resize(64, 0);
        // A 39 MiB string in a 40 MiB file: a header past the cap.
        let mut endless = preamble();
        endless.extend_from_slice(&8u32.to_le_bytes());
        endless.extend_from_slice(&(39u64 << 20).to_le_bytes());
        endless.resize(40 << 20, 0);
        let base_bytes = Arc::new(std::fs::read(&base).expect("read default model"));
        vec![
            File::new(Q4_1, base_bytes, true),
            File::new(Q8_0, Arc::new(q8_bytes), true),
            File::new(MAMBA, Arc::new(mamba), true),
            File::new(HUGE, Arc::new(huge), true),
            File::new(HOSTILE, Arc::new(hostile), true),
            File::new(ENDLESS, Arc::new(endless), true),
            File::new("README.md", Arc::new(b"# fit test\n".to_vec()), false),
        ]
    })
}

fn server() -> HubServer {
    let s = HubServer::start();
    s.add(
        REPO,
        RepoData {
            files: files().to_vec(),
            ..Default::default()
        },
    );
    s
}

fn cfg(s: &HubServer) -> HubConfig {
    HubConfig {
        endpoint: s.url.clone(),
        token: None,
        ..HubConfig::default()
    }
}

fn row<'a>(fits: &'a [GgufFit], name: &str) -> &'a GgufFit {
    fits.iter()
        .find(|f| f.file == name)
        .unwrap_or_else(|| panic!("no row for {name}"))
}

#[test]
fn the_api_describes_each_gguf_from_its_header_and_gives_the_fit() {
    let s = server();
    let listing = hub::list_files(&cfg(&s), REPO, "main").expect("listing");
    let fits = hub::read_ggufs(&cfg(&s), &listing).expect("headers");
    let names: Vec<&str> = fits.iter().map(|f| f.file.as_str()).collect();
    assert_eq!(names, [Q4_1, Q8_0, MAMBA, HUGE, HOSTILE, ENDLESS]);
    // Headers only: a few MiB in all of ~290 MiB of files, no range past the cap.
    let sent = s.body_bytes.load(Ordering::Relaxed);
    assert!(sent < 16 << 20, "{sent} bytes sent for the headers");
    for seen in s.seen() {
        if let Some((a, b)) = seen.range {
            assert!(
                b.unwrap_or(u64::MAX) < 32 << 20,
                "asked {a}-{b:?} of {}",
                seen.path
            );
        }
    }
    let (ctx, batch) = (4096, 1);
    let q4 = row(&fits, Q4_1);
    let n = q4.needs.as_ref().expect("Q4_1 header");
    assert_eq!((n.arch.as_str(), n.quant.as_str()), ("llama", "Q4_1"));
    assert!(n.runs());
    assert_eq!(q4.size, files()[0].bytes.len() as u64);
    // The engine's own facts: the weights it will map and the KV pool it will allocate.
    let local = GgufFile::open(default_model()).expect("open");
    assert_eq!(n.weights, local.tensors.iter().map(|t| t.size).sum::<u64>());
    let cfg = ModelConfig::from_gguf(&local).expect("config");
    let kv = KvTypes::F16.budget_for_tokens(&cfg, KV_BLOCK, ctx) as u64;
    assert_eq!(n.kv_bytes(ctx, batch), Some(kv));
    assert_eq!(n.kv_bytes(ctx, 4), Some(4 * kv));
    assert_eq!(q4.need(ctx, batch), Some(n.weights + kv));
    let q8 = row(&fits, Q8_0);
    let n8 = q8.needs.as_ref().expect("Q8_0 header");
    assert_eq!(n8.quant, "Q8_0");
    assert!(q8.size > q4.size && n8.weights > n.weights);
    assert_eq!(n8.kv_bytes(ctx, batch), Some(kv), "same geometry, same KV");
    let mamba = row(&fits, MAMBA).needs.as_ref().expect("mamba header");
    assert_eq!(mamba.arch, "mamba");
    assert!(!mamba.runs());
    assert!(
        mamba
            .unsupported
            .as_deref()
            .is_some_and(|e| e.contains("mamba")),
        "{:?}",
        mamba.unsupported
    );
    let huge = row(&fits, HUGE);
    let kv_huge = huge
        .needs
        .as_ref()
        .expect("huge header")
        .kv_bytes(ctx, batch);
    assert_eq!(kv_huge, Some(2 * 512 * 16384 * 2 * ctx as u64));
    // Verdicts against a machine of 24 GiB RAM and a 16 GiB GPU.
    let m = Machine {
        ram: Some(24 * GIB),
        vram: Some(16 * GIB),
    };
    assert_eq!(q4.verdict(&m, ctx, batch), (Verdict::Fits, Verdict::Fits));
    assert_eq!(
        huge.verdict(&m, ctx, batch),
        (Verdict::DoesNotFit, Verdict::DoesNotFit)
    );
    assert_eq!(
        row(&fits, MAMBA).verdict(&m, ctx, batch),
        (Verdict::Unknown, Verdict::Unknown)
    );
    // The default model at 512 sequences of 8192 tokens does not fit either (~94 GiB of KV).
    assert_eq!(q4.verdict(&m, 8192, 512).0, Verdict::DoesNotFit);
    let no_gpu = Machine {
        ram: Some(24 * GIB),
        vram: None,
    };
    assert_eq!(q4.verdict(&no_gpu, ctx, batch).1, Verdict::Unknown);
    let hostile = row(&fits, HOSTILE)
        .needs
        .as_ref()
        .expect_err("hostile header");
    assert!(hostile.contains("truncated or corrupt"), "{hostile}");
    let endless = row(&fits, ENDLESS)
        .needs
        .as_ref()
        .expect_err("endless header");
    assert!(endless.contains("32 MiB"), "{endless}");
}

#[test]
fn a_server_that_ignores_range_still_costs_only_the_header() {
    let s = HubServer::start();
    let mut data = RepoData {
        files: vec![files()[0].clone()],
        ..Default::default()
    };
    data.hostile.ignore_range = true;
    s.add(REPO, data);
    let listing = hub::list_files(&cfg(&s), REPO, "main").expect("listing");
    let fits = hub::read_ggufs(&cfg(&s), &listing).expect("headers");
    let n = fits[0].needs.as_ref().expect("header read from a 200");
    assert_eq!(n.quant, "Q4_1");
}

fn harness(lib: PathBuf) -> Harness<'static, TpsApp> {
    let state = AppState {
        tab: Tab::Models,
        ..AppState::default()
    };
    let mut app = TpsApp::new(
        state,
        AppOptions {
            model: "/nonexistent/tpslab-hub-fit.gguf".into(),
            threads: 1,
            device: Some(DeviceChoice::Cpu),
        },
    );
    app.set_library_dir(lib);
    app.set_file_dialog(Arc::new(FixedDialog(DialogAnswer::Cancelled)));
    Harness::builder()
        .with_size([1500.0, 1100.0])
        .allow_missing_glyphs()
        .build_ui_state(|ui, app: &mut TpsApp| app.app_ui(ui), app)
}

fn has(h: &Harness<'static, TpsApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

fn type_into(h: &mut Harness<'static, TpsApp>, label: &str, text: &str) {
    h.get_by_label(label).focus();
    h.step();
    h.get_by_label(label).type_text(text);
    h.step();
}

#[test]
fn the_hub_panel_shows_each_gguf_with_its_fit_before_a_download() {
    let s = server();
    let home = std::env::temp_dir().join(format!("tpslab-hub-fit-gui-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(home.join("models")).expect("temp library");
    let mut h = harness(home.join("models"));
    wait_until(&mut h, "the empty library", 30, |h| {
        has(h, "No models in the library yet")
    });
    type_into(&mut h, "Endpoint", &s.url);
    type_into(&mut h, "Repo id", REPO);
    h.get_by_label("List files").click();
    wait_until(&mut h, "the fit table", 120, |h| {
        has(h, "Architecture") && has(h, "unreadable") && !has(h, "Reading the GGUF headers")
    });
    for text in [
        "llama (runs here)",
        "mamba (not run by this build)",
        "Q8_0",
        "RAM: fits",
        "RAM: does not fit",
        "no GPU",
        "This machine: RAM",
        "weights +",
        "truncated or corrupt",
        "32 MiB",
    ] {
        assert!(has(&h, text), "the panel does not show {text:?}");
    }
    // Nothing was downloaded: the library is still empty, and only headers were read.
    assert!(has(&h, "No models in the library yet"));
    assert!(s.body_bytes.load(Ordering::Relaxed) < 16 << 20);
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn every_prefix_of_a_header_is_incomplete_and_the_whole_header_parses() {
    let path = default_model();
    let bytes = std::fs::read(&path).expect("read");
    let whole = GgufFile::open(&path).expect("open");
    let len = bytes.len() as u64;
    let end = whole.data_offset as usize - 32;
    for cut in [
        0,
        1,
        3,
        4,
        11,
        24,
        100,
        4096,
        65_537,
        end / 3,
        end / 2,
        end - 1,
    ] {
        match GgufFile::from_prefix(&path, &bytes[..cut], len) {
            Err(tpslab_engine::formats::gguf::GgufError::Incomplete { upto, .. }) => {
                assert!(upto > cut as u64, "cut {cut}: upto {upto}")
            }
            other => panic!("cut {cut}: {other:?}"),
        }
    }
    let h = GgufFile::from_prefix(&path, &bytes[..whole.data_offset as usize], len)
        .expect("whole header");
    assert_eq!(h.metadata.len(), whole.metadata.len());
    let table = |f: &GgufFile| {
        (f.tensors.iter())
            .map(|t| (t.name.clone(), t.dims.clone(), t.ty, t.offset, t.size))
            .collect::<Vec<_>>()
    };
    assert_eq!(table(&h), table(&whole));
    assert_eq!(h.data_offset, whole.data_offset);
    // The same header said to belong to a shorter file: its tensors do not fit, refused.
    let short = GgufFile::from_prefix(&path, &bytes[..whole.data_offset as usize], 1 << 20);
    assert!(short.is_err());
}

#[test]
fn an_empty_gguf_is_that_file_s_error_and_the_others_are_still_read() {
    let s = HubServer::start();
    s.add(
        REPO,
        RepoData {
            files: vec![
                File::new("empty.gguf", Arc::new(Vec::new()), true),
                files()[2].clone(),
            ],
            ..Default::default()
        },
    );
    let listing = hub::list_files(&cfg(&s), REPO, "main").expect("listing");
    let fits = hub::read_ggufs(&cfg(&s), &listing).expect("headers");
    let e = row(&fits, "empty.gguf").needs.as_ref().expect_err("empty");
    assert!(e.contains("empty"), "{e}");
    assert!(row(&fits, MAMBA).needs.is_ok());
}

#[test]
fn pull_fit_prints_each_gguf_and_downloads_nothing() {
    let s = server();
    let home = std::env::temp_dir().join(format!("tpslab-hub-fit-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tpslab"))
        .args(["pull", REPO, "--fit", "--ctx", "4096", "--batch", "1"])
        .args(["--endpoint", &s.url])
        .env("TPSLAB_HOME", &home)
        .output()
        .expect("run tpslab");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |name: &str| {
        text.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{text}"))
            .to_string()
    };
    assert!(line(Q4_1).contains("Q4_1    llama (runs here)"), "{text}");
    assert!(line(Q8_0).contains("Q8_0"), "{text}");
    assert!(line(MAMBA).contains("not run by this build"), "{text}");
    assert!(line(HUGE).contains("RAM: does not fit"), "{text}");
    assert!(line(HOSTILE).contains("unreadable"), "{text}");
    assert!(!text.contains("README.md"), "only GGUF files: {text}");
    assert!(s.body_bytes.load(Ordering::Relaxed) < 16 << 20);
    assert!(
        !home.join("models").join(Q4_1).exists(),
        "nothing downloaded"
    );
    let _ = std::fs::remove_dir_all(&home);
}
