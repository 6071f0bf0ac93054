//! Nothing is lost on a crash: `tpslab models import`, `tpslab quantize` and `tpslab pull` are
//! each killed with SIGKILL at 20 points spread over their run (the real binary, the real
//! default model, a Hub on 127.0.0.1), and after every kill the library holds only models that
//! load, its index lists exactly those, and no half-written file loads; the operation then runs
//! to its end (a pull resumes from what it had). The window's conversation store is saved by a
//! child process killed at 20 points of a run of saves, and always loads as one whole save.

use crate::hub_fixtures;
use crate::hub_server;

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

/// Set (to the state file's path) in the child of
/// [`window_state_killed_mid_save_loads_as_one_whole_save`] that saves until it is killed.
const STATE_WRITER: &str = "TPSLAB_CRASH_STATE_WRITER";

/// The window's state with one conversation of `n` messages of 256 KiB each (so a save takes
/// long enough to be killed in the middle).
fn state_with(n: usize) -> tpslab::ui::AppState {
    use tpslab::ui::panels::chat::{Message, Role};
    let mut s = tpslab::ui::AppState::default();
    s.chat.conversations[0].messages = (0..n)
        .map(|i| Message {
            role: if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            },
            text: format!("message {i} of {n}: {}", "x".repeat(256 << 10)),
            ..Message::default()
        })
        .collect();
    s
}

#[test]
fn window_state_killed_mid_save_loads_as_one_whole_save() {
    use tpslab::ui::state_file;
    if let Some(path) = std::env::var_os(STATE_WRITER) {
        // The child: the window's save, over and over, of conversations of 1..=32 messages.
        for n in (1..=32).cycle() {
            state_file::save(Path::new(&path), &state_with(n)).expect("save");
        }
    }
    let home = TempDir::new("crash-state");
    let path = home.0.join("window-state.json");
    state_file::save(&path, &state_with(1)).expect("first save");
    let mut seen = BTreeSet::new();
    // The harness names a test by its path inside the binary (`crash::...`): this module's path
    // less the crate's name.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let this_test = format!("{module}::window_state_killed_mid_save_loads_as_one_whole_save");
    for k in 0..KILLS {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", &this_test, "--nocapture"])
            .env(STATE_WRITER, &path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the writer");
        std::thread::sleep(Duration::from_millis(100 + 50 * u64::from(k)));
        let _ = child.kill();
        let _ = child.wait();
        let state: tpslab::ui::AppState =
            state_file::load(&path).expect("a killed save leaves a state that loads");
        let n = state.chat.conversations[0].messages.len();
        assert!((1..=32).contains(&n), "{n} messages");
        assert!(
            state == state_with(n),
            "kill {k}: not the whole save of {n} messages"
        );
        seen.insert(n);
    }
    // The writer was saving when it was killed (it wrote other states), and load swept away
    // the temporary files the killed saves left.
    assert!(seen.len() > 1, "only {seen:?} seen: the writer never saved");
    let temps: Vec<_> = std::fs::read_dir(&home.0)
        .expect("home")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(temps.is_empty(), "left behind: {temps:?}");
}
