//! The CUDA kernels run on the CPU through `kernels/cuda/sim` (sim.h, driver.cpp): each
//! `kernels/cuda/*.cu` is compiled by the host C++ compiler (`$CXX`, else `c++`) with
//! AddressSanitizer and UBSan, beside a registry of its kernels (the `.entry` names of its
//! committed PTX), and [`Job`]s of launches run in the driver. Build once per source state, under
//! the target's tmp folder.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

fn cuda_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda")
}

fn sources() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    for dir in [cuda_dir(), cuda_dir().join("sim")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension()
                .is_some_and(|x| x == "cu" || x == "cuh" || x == "h" || x == "cpp")
            {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

/// The driver, built once per process (and reused across runs while the sources stay the same).
pub fn driver() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(build)
}

fn build() -> PathBuf {
    let cu: Vec<PathBuf> = sources()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    let mut h = DefaultHasher::new();
    for p in sources() {
        std::fs::read(&p).unwrap().hash(&mut h);
    }
    for p in &cu {
        std::fs::read(ptx_of(p)).unwrap().hash(&mut h);
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cuda-sim-{:016x}", h.finish()));
    let exe = dir.join("driver");
    if exe.exists() {
        return exe;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let flags = [
        "-std=c++20",
        "-O1",
        "-g",
        "-DTPSLAB_SIM",
        "-fno-strict-aliasing",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-Wno-unknown-pragmas",
    ];
    let sim = cuda_dir().join("sim");
    let mut units = vec![(sim.join("driver.cpp"), dir.join("driver.o"))];
    for p in &cu {
        let name = p.file_stem().unwrap().to_str().unwrap();
        let unit = dir.join(format!("{name}.cpp"));
        let mut text = format!("#include \"{}\"\n#include \"registry.h\"\n", p.display());
        for entry in entries(&ptx_of(p)) {
            text.push_str(&format!("TPSLAB_SIM_KERNEL({entry})\n"));
        }
        std::fs::write(&unit, text).unwrap();
        units.push((unit, dir.join(format!("{name}.o"))));
    }
    let children: Vec<_> = units
        .iter()
        .map(|(src, obj)| {
            Command::new(&cxx)
                .args(flags)
                .arg("-I")
                .arg(&sim)
                .arg("-c")
                .arg(src)
                .arg("-o")
                .arg(obj)
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect();
    for (c, (src, _)) in children.into_iter().zip(&units) {
        let child = c.unwrap_or_else(|e| panic!("cannot run the C++ compiler {cxx}: {e}"));
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{cxx} failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tmp = dir.join("driver.tmp");
    let out = Command::new(&cxx)
        .args(flags)
        .args(units.iter().map(|(_, o)| o))
        .arg("-o")
        .arg(&tmp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "link: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &exe).unwrap();
    exe
}

fn ptx_of(cu: &Path) -> PathBuf {
    let name = cu.file_stem().unwrap().to_str().unwrap();
    cuda_dir().join("../ptx").join(format!("{name}.ptx"))
}

/// The kernel names of a PTX file (`.visible .entry NAME(`).
fn entries(ptx: &Path) -> Vec<String> {
    std::fs::read_to_string(ptx)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix(".visible .entry "))
        .map(|l| l.trim_end_matches('(').to_string())
        .collect()
}

/// A buffer of a [`Job`] (its index).
#[derive(Clone, Copy, Debug)]
pub struct Buf(usize);

/// A kernel argument, as `Gpu::run` pushes them.
#[derive(Clone, Copy, Debug)]
pub enum A {
    /// A pointer `offset` bytes into a buffer.
    P(Buf, usize),
    /// A null pointer (an optional input left out).
    Null,
    I(i32),
    L(i64),
    F(f32),
}

/// Buffers and launches, run in one driver process.
pub struct Job {
    dir: PathBuf,
    lines: Vec<String>,
    sizes: Vec<usize>,
}

impl Default for Job {
    fn default() -> Self {
        Self::new()
    }
}

impl Job {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "cuda-sim-job-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Job {
            dir,
            lines: Vec::new(),
            sizes: Vec::new(),
        }
    }

    /// A buffer holding `data`.
    pub fn buf(&mut self, data: &[u8]) -> Buf {
        let id = self.sizes.len();
        let path = self.dir.join(format!("in{id}"));
        std::fs::write(&path, data).unwrap();
        self.lines
            .push(format!("buf {id} {} {}", data.len(), path.display()));
        self.sizes.push(data.len());
        Buf(id)
    }

    pub fn floats(&mut self, data: &[f32]) -> Buf {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.buf(&bytes)
    }

    pub fn ints(&mut self, data: &[i32]) -> Buf {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.buf(&bytes)
    }

    /// `bytes` bytes, each 0xff (f32 NaN), so an element a kernel leaves unwritten shows.
    pub fn out(&mut self, bytes: usize) -> Buf {
        let id = self.sizes.len();
        self.lines.push(format!("buf {id} {bytes} -"));
        self.lines.push(format!("fill {id} 255"));
        self.sizes.push(bytes);
        Buf(id)
    }

    pub fn launch(&mut self, name: &str, grid: (u32, u32), block: u32, args: &[A]) {
        let mut l = format!("launch {name} {} {} {block}", grid.0.max(1), grid.1.max(1));
        for a in args {
            l.push(' ');
            l.push_str(&match a {
                A::P(b, off) => format!("p{}+{off}", b.0),
                A::Null => "n".to_string(),
                A::I(v) => format!("i{v}"),
                A::L(v) => format!("l{v}"),
                A::F(v) => format!("f{:08x}", v.to_bits()),
            });
        }
        self.lines.push(l);
    }

    /// Runs the job; every buffer's final bytes, by index.
    pub fn run(mut self) -> Outputs {
        for id in 0..self.sizes.len() {
            let p = self.dir.join(format!("out{id}"));
            self.lines.push(format!("dump {id} {}", p.display()));
        }
        let job = self.dir.join("job");
        std::fs::write(&job, self.lines.join("\n") + "\n").unwrap();
        let out = Command::new(driver()).arg(&job).output().unwrap();
        assert!(
            out.status.success(),
            "the kernel failed in the CPU simulator:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bufs = (0..self.sizes.len())
            .map(|id| std::fs::read(self.dir.join(format!("out{id}"))).unwrap())
            .collect();
        let _ = std::fs::remove_dir_all(&self.dir);
        Outputs(bufs)
    }
}

/// The buffers after a [`Job`].
pub struct Outputs(Vec<Vec<u8>>);

impl Outputs {
    pub fn bytes(&self, b: Buf) -> &[u8] {
        &self.0[b.0]
    }

    pub fn floats(&self, b: Buf) -> Vec<f32> {
        self.0[b.0]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}
