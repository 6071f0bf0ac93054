//! Nothing is lost on a crash: `tpslab models import`, `tpslab quantize` and `tpslab pull` are
//! each killed with SIGKILL at 20 points spread over their run (the real binary, the real
//! default model, a Hub on 127.0.0.1), and after every kill the library holds only models that
//! load, its index lists exactly those, and no half-written file loads; the operation then runs
//! to its end (a pull resumes from what it had).

#[allow(dead_code)]
#[path = "support/hub_fixtures.rs"]
mod hub_fixtures;
#[allow(dead_code)]
#[path = "support/hub_server.rs"]
mod hub_server;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hub_fixtures::{TempDir, default_model, gguf_file};
use hub_server::HubServer;
use tpslab_engine::library::index::Library;
use tpslab_engine::model::LoadedModel;

/// Kill points per operation.
const KILLS: u32 = 20;

fn tpslab(home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tpslab"));
    c.args(args)
        .env("TPSLAB_HOME", home)
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// Runs to the end; how long it took.
fn run_whole(mut c: Command) -> Duration {
    let t0 = Instant::now();
    let status = c.status().expect("run tpslab");
    assert!(status.success(), "{c:?} failed");
    t0.elapsed()
}

/// Starts `c`, kills it (SIGKILL) after `after`, and reaps it.
fn kill_after(mut c: Command, after: Duration) {
    let mut child: Child = c.spawn().expect("start tpslab");
    std::thread::sleep(after);
    let _ = child.kill();
    let _ = child.wait();
}

/// The `k`-th of [`KILLS`] points spread over a run of `whole`, from its very start to just
/// before its end.
fn point(k: u32, whole: Duration) -> Duration {
    whole.mul_f64(f64::from(k) / f64::from(KILLS))
}

/// The library after a crash: every model listed loads, nothing unreadable is listed, the
/// index holds a manifest for exactly the listed models, and no other file in the folder
/// loads as a model. Returns the listed names.
fn library_is_whole(home: &Path) -> BTreeSet<String> {
    let lib = Library::at(home.join("models"));
    let (models, bad) = lib.list_indexed().expect("list");
    assert!(bad.is_empty(), "unreadable entries: {bad:?}");
    let names: BTreeSet<String> = models.iter().map(|m| m.name.clone()).collect();
    for m in &models {
        LoadedModel::load(&m.path)
            .unwrap_or_else(|e| panic!("{} is listed but does not load: {e}", m.name));
    }
    let manifests: BTreeSet<String> = std::fs::read_dir(lib.root().join(".index"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".json")
                .map(String::from)
        })
        .collect();
    assert_eq!(manifests, names, "the index lists exactly the models");
    for e in std::fs::read_dir(lib.root())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        // Dot folders are the library's own (staging, cache, index); `OUT.tmp` is what
        // `quantize` writes before the rename, never listed, replaced by the next run.
        if name.starts_with('.') || names.contains(&name) || name.ends_with(".tmp") {
            continue;
        }
        assert!(
            LoadedModel::load(&e.path()).is_err(),
            "{name} is a model the index does not list"
        );
    }
    names
}

#[test]
fn import_killed_anywhere_leaves_the_library_whole() {
    let src = default_model();
    let arg = src.to_str().expect("utf8 path");
    let name = src
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let home = TempDir::new("crash-import");
    let whole = run_whole(tpslab(&home.0, &["models", "import", arg]));
    assert_eq!(library_is_whole(&home.0), BTreeSet::from([name.clone()]));
    let lib = Library::at(home.0.join("models"));
    let mut completed = 0;
    for k in 0..KILLS {
        lib.remove(&name).ok();
        kill_after(tpslab(&home.0, &["models", "import", arg]), point(k, whole));
        let names = library_is_whole(&home.0);
        completed += usize::from(names.contains(&name));
    }
    eprintln!("import: {whole:?} whole; {completed} of {KILLS} killed runs had finished");
    lib.remove(&name).ok();
    run_whole(tpslab(&home.0, &["models", "import", arg]));
    assert_eq!(library_is_whole(&home.0), BTreeSet::from([name]));
}

#[test]
fn quantize_killed_anywhere_leaves_no_half_model() {
    let src = default_model();
    let home = TempDir::new("crash-quantize");
    let models = home.0.join("models");
    std::fs::create_dir_all(&models).expect("mkdir");
    let out = models.join("smol-q8_0.gguf");
    let args = |out: &Path| -> Vec<String> {
        vec![
            "quantize".into(),
            src.display().to_string(),
            out.display().to_string(),
            "--type".into(),
            "q8_0".into(),
        ]
    };
    let argv = args(&out);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let whole = run_whole(tpslab(&home.0, &argv));
    assert!(library_is_whole(&home.0).contains("smol-q8_0.gguf"));
    let mut completed = 0;
    for k in 0..KILLS {
        Library::at(models.clone()).remove("smol-q8_0.gguf").ok();
        let _ = std::fs::remove_file(&out);
        kill_after(tpslab(&home.0, &argv), point(k, whole));
        // The output is there whole (it loads, and is listed) or not at all.
        let names = library_is_whole(&home.0);
        assert_eq!(names.contains("smol-q8_0.gguf"), out.exists());
        completed += usize::from(out.exists());
    }
    eprintln!("quantize: {whole:?} whole; {completed} of {KILLS} killed runs had finished");
    run_whole(tpslab(&home.0, &argv));
    assert!(library_is_whole(&home.0).contains("smol-q8_0.gguf"));
}

/// The test Hub, serving the default model's GGUF at about 100 MB/s so kill points land
/// mid-download.
fn slow_hub() -> HubServer {
    let s = hub_fixtures::server();
    s.faults.slow_us.store(600, Ordering::Relaxed);
    s
}

#[test]
fn pull_killed_anywhere_leaves_the_library_whole_and_resumes() {
    let hub = slow_hub();
    let name = gguf_file().name;
    let pull = |home: &Path| {
        tpslab(
            home,
            &["pull", "tpslab/smollm2-gguf", "--endpoint", &hub.url],
        )
    };
    let timing = TempDir::new("crash-pull-timing");
    let whole = run_whole(pull(&timing.0));
    assert_eq!(library_is_whole(&timing.0), BTreeSet::from([name.clone()]));
    let home = TempDir::new("crash-pull");
    let lib = Library::at(home.0.join("models"));
    let before = hub.seen().len();
    let mut completed = 0;
    for k in 0..KILLS {
        kill_after(pull(&home.0), point(k, whole));
        let names = library_is_whole(&home.0);
        if names.contains(&name) {
            completed += 1;
            lib.remove(&name).expect("remove");
        }
    }
    eprintln!("pull: {whole:?} whole; {completed} of {KILLS} killed runs had finished");
    run_whole(pull(&home.0));
    assert_eq!(library_is_whole(&home.0), BTreeSet::from([name.clone()]));
    // Runs after a kill picked up the partial download where it stopped.
    let resumed = hub.seen()[before..]
        .iter()
        .filter(|s| s.method == "GET" && s.path.ends_with(&name))
        .filter(|s| s.range.is_some_and(|(start, _)| start > 1))
        .count();
    assert!(resumed > 0, "no pull resumed a partial download");
}
