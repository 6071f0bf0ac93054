//! `matmul`: backend choice (AVX-512 VNNI, AVX-VNNI, AVX2 or portable, detected once), activation quantization once
//! per call, the split of weight rows over the pool threads, and reused scratch memory.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::quant::{self, ActType, QActs};
use crate::{QMatrix, SendPtr, ThreadPool, WType, dequantize_row};

/// Runs of weight-row groups per thread in the batched matmuls: enough that a thread slowed by
/// the machine hands its share to the others, few enough that claiming a run costs nothing.
const RUNS_PER_THREAD: usize = 8;

/// Which implementation runs the kernels. All give bit-identical results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Plain Rust, any CPU.
    Portable,
    /// `std::arch` AVX2 + FMA + F16C (x86_64 only): integer dots by `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// AVX2 plus AVX-VNNI: integer dots by the 256-bit VEX `vpdpbusd` / `vpdpwssd`.
    AvxVnni,
    /// AVX2 plus AVX-512 F/BW/VL/VNNI: integer dots by the EVEX `vpdpbusd` / `vpdpwssd`, with
    /// 32 vector registers for the tiles.
    Avx512Vnni,
    /// [`Backend::Avx512Vnni`] with 512-bit tiles where a kernel has them (batches of packed
    /// Q4_K): chosen where a zmm `vpdpbusd` runs at a ymm one's rate (Intel Xeons), not where it
    /// is split in two (Zen 4). The same bits as every other backend.
    Avx512Zmm,
}

impl Backend {
    /// Every backend, slowest first.
    pub const ALL: [Backend; 5] = [
        Backend::Portable,
        Backend::Avx2,
        Backend::AvxVnni,
        Backend::Avx512Vnni,
        Backend::Avx512Zmm,
    ];

    /// The backend [`matmul`] uses: the fastest one this CPU supports, or the one named by
    /// `TPSLAB_CPU_KERNELS` (`portable`, `avx2`, `avx-vnni`, `avx512-vnni`, `avx512-zmm`) when
    /// this CPU has it (to compare paths in one binary). Checked once per process; the 512-bit
    /// tiles only where they run faster (`x86::wide::zmm_pays`, a millisecond's probe).
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        let zmm_pays = crate::x86::wide::zmm_pays;
        #[cfg(not(target_arch = "x86_64"))]
        let zmm_pays = || false;
        static BEST: OnceLock<Backend> = OnceLock::new();
        *BEST.get_or_init(|| {
            let forced = std::env::var("TPSLAB_CPU_KERNELS").ok();
            let forced = forced.as_deref().and_then(Self::from_name);
            match forced {
                Some(b) if b.is_available() => b,
                _ => Self::ALL
                    .into_iter()
                    .rev()
                    .find(|b| b.is_available() && (*b != Self::Avx512Zmm || zmm_pays()))
                    .unwrap_or(Self::Portable),
            }
        })
    }

    /// The name `TPSLAB_CPU_KERNELS` takes (and benchmarks print).
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::AvxVnni => "avx-vnni",
            Self::Avx512Vnni => "avx512-vnni",
            Self::Avx512Zmm => "avx512-zmm",
        }
    }

    /// The backend called `name` ([`Backend::name`], any case), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Whether this CPU can run `self`.
    pub fn is_available(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(target_arch = "x86_64")]
            _ => self.x86().is_some_and(crate::x86::isa::X86::available),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The x86 integer-dot path of `self` (`None` for portable).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn x86(self) -> Option<crate::x86::isa::X86> {
        use crate::x86::isa::X86;
        match self {
            Self::Portable => None,
            Self::Avx2 => Some(X86::Avx2),
            Self::AvxVnni => Some(X86::AvxVnni),
            Self::Avx512Vnni | Self::Avx512Zmm => Some(X86::Avx512Vnni),
        }
    }

    /// The backend of the code without integer dots (activation quantization, float matmuls,
    /// attention): every x86 path shares the AVX2 one.
    pub fn float_path(self) -> Self {
        match self {
            Self::Portable => Self::Portable,
            _ => Self::Avx2,
        }
    }
}

thread_local! {
    // Quantized activations of the calling thread, reused across calls.
    static ACTS: RefCell<QActs> = RefCell::new(QActs::default());
    // Per-thread tile scratch (pool workers are persistent, so this lives as long as the pool).
    #[cfg(target_arch = "x86_64")]
    static SCRATCH: RefCell<crate::x86::Scratch> = RefCell::new(crate::x86::Scratch::default());
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y[i][j] = sum_l x[i][l] * w[j][l]` for `m` rows of activations `x` (`m * w.k` floats);
/// `y` holds `m * w.n` floats. Quantized weights are dotted with activations quantized as
/// llama.cpp does (Q8_0, Q8_1 or Q8_K). Row `i` of `y` is bit-identical whatever `m` and the
/// thread count are (batch invariance).
pub fn matmul(pool: &ThreadPool, w: &QMatrix<'_>, x: &[f32], m: usize, y: &mut [f32]) {
    matmul_with(Backend::detect(), pool, w, x, m, y);
}

/// [`matmul`] on a chosen backend (panics if this CPU lacks it).
pub fn matmul_with(
    backend: Backend,
    pool: &ThreadPool,
    w: &QMatrix<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) {
    assert!(
        backend.is_available(),
        "{backend:?} is not supported by this CPU"
    );
    assert_eq!(x.len(), m * w.k, "x is not m x k");
    assert_eq!(y.len(), m * w.n, "y is not m x n");
    assert_eq!(
        w.data.len(),
        crate::packed::len(w.ty, w.layout, w.n, w.k),
        "weight bytes do not match n x k"
    );
    assert!(
        w.layout == crate::Layout::Ggml || crate::packed::fields(w.ty).is_some(),
        "{} has no packed layout",
        w.ty
    );
    let at = ActType::for_weight(w.ty);
    assert_eq!(
        w.k % at.block_size().max(w.ty.block_size()),
        0,
        "k is not a multiple of the block size"
    );
    if m == 0 || w.n == 0 {
        return;
    }
    if at == ActType::F32 {
        float_matmul(backend, pool, w, x, m, y);
        return;
    }
    ACTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut acts) => quantized_matmul(backend, pool, w, x, m, y, &mut acts),
        // Re-entered from inside a job on this thread: use a fresh buffer.
        Err(_) => quantized_matmul(backend, pool, w, x, m, y, &mut QActs::default()),
    });
}

/// Quantizes `m` rows of `x` (each `k` long) for weights of type `ty` into `out`.
pub fn quantize_activations(
    backend: Backend,
    ty: ActType,
    x: &[f32],
    m: usize,
    k: usize,
    out: &mut QActs,
) {
    assert!(
        backend.is_available(),
        "{backend:?} is not supported by this CPU"
    );
    assert_eq!(x.len(), m * k);
    out.reset(ty, m, k);
    quantize_rows(backend, x, &mut out.rows_mut(0, m));
}

fn quantize_rows(backend: Backend, x: &[f32], rows: &mut quant::QActsRows<'_>) {
    match backend.float_path() {
        Backend::Portable => quant::quantize_rows_portable(x, rows),
        // SAFETY: the backend was checked available (AVX2, FMA, F16C detected).
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => unsafe { crate::x86::act::quantize_rows(x, rows) },
        _ => quant::quantize_rows_portable(x, rows),
    }
}

fn quantized_matmul(
    backend: Backend,
    pool: &ThreadPool,
    w: &QMatrix<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    acts: &mut QActs,
) {
    let (k, n) = (w.k, w.n);
    acts.reset(ActType::for_weight(w.ty), m, k);
    // Quantize once per call; split over threads only when it is worth a dispatch.
    if m * k >= 1 << 16 && pool.n_threads() > 1 {
        let parts: Vec<std::sync::Mutex<quant::QActsRows<'_>>> = {
            let nth = pool.n_threads();
            let per = m.div_ceil(nth);
            let mut v = Vec::with_capacity(nth);
            let mut rest = acts.rows_mut(0, m);
            let mut lo = 0;
            while lo < m {
                let hi = (lo + per).min(m);
                let (a, b) = split_rows(rest, hi - lo);
                v.push(std::sync::Mutex::new(a));
                rest = b;
                lo = hi;
            }
            v
        };
        let per = m.div_ceil(pool.n_threads());
        pool.run(&|tid, _| {
            if let Some(p) = parts.get(tid) {
                let mut rows = p.lock().unwrap_or_else(|e| e.into_inner());
                let lo = tid * per;
                let hi = (lo + per).min(m);
                quantize_rows(backend, &x[lo * k..hi * k], &mut rows);
            }
        });
    } else {
        quantize_rows(backend, x, &mut acts.rows_mut(0, m));
    }
    let acts = &*acts;
    let yp = SendPtr(y.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    let path = backend.x86();
    #[cfg(not(target_arch = "x86_64"))]
    let path: Option<()> = None;
    match path {
        #[cfg(target_arch = "x86_64")]
        Some(path)
            if crate::x86::dots32::block32(w.ty).is_some()
                || w.layout == crate::Layout::Rows8
                || (crate::x86::panel_k::has_panels(w.ty) && m > crate::IN_PLACE_MAX_ROWS) =>
        {
            let job = crate::x86::job::GroupJob {
                ty: w.ty,
                data: w.data,
                layout: w.layout,
                n,
                k,
                m,
                acts,
                wide: backend == Backend::Avx512Zmm,
                y: yp,
            };
            // Runs of groups handed out as threads ask: a thread slowed by the machine takes
            // fewer, so the other does not wait for it at the end (the result does not depend
            // on who runs what). In-place tiles (decode) keep one run per thread: each streams
            // its weight rows with prefetches ahead, which runs cut short.
            let rows = if w.layout == crate::Layout::Rows8 {
                crate::x86::panel32::ROWS
            } else {
                crate::x86::group_rows(m)
            };
            let groups = n.div_ceil(rows);
            let per_thread = if rows == crate::x86::dots32::R {
                1
            } else {
                RUNS_PER_THREAD
            };
            let run = groups.div_ceil(pool.n_threads() * per_thread).max(1);
            let next = AtomicUsize::new(0);
            pool.run(&|_, _| {
                SCRATCH.with(|s| {
                    let mut fresh = crate::x86::Scratch::default();
                    let mut guard = s.try_borrow_mut();
                    let s = match guard.as_deref_mut() {
                        Ok(s) => s,
                        Err(_) => &mut fresh,
                    };
                    loop {
                        let lo = next.fetch_add(run, Ordering::Relaxed);
                        if lo >= groups {
                            break;
                        }
                        let hi = (lo + run).min(groups);
                        // SAFETY: the backend was checked available (its features detected).
                        unsafe { crate::x86::run_groups(path, &job, lo, hi, s) };
                    }
                });
            });
        }
        _ => row_dots(backend, pool, w, acts, m, yp),
    }
}

/// The matmul of the types without tiled kernels, one weight row at a time: each thread takes
/// its share of weight rows, and each row is dotted with every activation row, four at a time
/// where the type has a kernel that unpacks each weight block once for them (the same bits as
/// one at a time).
fn row_dots(
    backend: Backend,
    pool: &ThreadPool,
    w: &QMatrix<'_>,
    acts: &QActs,
    m: usize,
    yp: SendPtr<f32>,
) {
    let n = w.n;
    let rb = w.ty.row_bytes(w.k);
    pool.run(&|tid, nth| {
        let (lo, hi) = split(n, tid, nth);
        // A packed matrix's rows are put back together one at a time.
        let mut own = vec![
            0u8;
            if w.layout == crate::Layout::Ggml {
                0
            } else {
                rb
            }
        ];
        for j in lo..hi {
            let wr = if w.layout == crate::Layout::Ggml {
                #[cfg(target_arch = "x86_64")]
                if m == 1 {
                    // Decode streams the rows: ask for the bytes ahead (as the tiles do).
                    crate::x86::job::prefetch_ahead(w.data[j * rb..].as_ptr(), rb);
                }
                &w.data[j * rb..(j + 1) * rb]
            } else {
                crate::packed::row_bytes_into(w.ty, w.layout, w.k, w.data, j, &mut own);
                &own[..]
            };
            let mut i = 0;
            while i + 4 <= m {
                let xs = [0, 1, 2, 3].map(|r| acts.row(i + r));
                let Some(v) = dot_rows4(backend, w.ty, wr, xs) else {
                    break;
                };
                for (r, v) in v.into_iter().enumerate() {
                    // SAFETY: each (i, j) is written by exactly one thread (j is split).
                    unsafe { *yp.get().add((i + r) * n + j) = v };
                }
                i += 4;
            }
            for i in i..m {
                let v = dot_row(backend, w.ty, wr, acts.row(i));
                // SAFETY: each (i, j) is written by exactly one thread (j is split).
                unsafe { *yp.get().add(i * n + j) = v };
            }
        }
    });
}

fn split_rows(
    r: quant::QActsRows<'_>,
    rows: usize,
) -> (quant::QActsRows<'_>, quant::QActsRows<'_>) {
    let k = r.k;
    let nb = k / r.ty.block_size();
    let (qa, qb) = r.qs.split_at_mut(rows * k);
    let (da, db) = r.d.split_at_mut(rows * nb);
    let (sa, sb) = r.s.split_at_mut(if r.s.is_empty() { 0 } else { rows * nb });
    let (ba, bb) = r.bsums.split_at_mut(if r.bsums.is_empty() {
        0
    } else {
        rows * nb * 16
    });
    let (ua, ub) = r
        .sums
        .split_at_mut(if r.sums.is_empty() { 0 } else { rows * nb });
    (
        quant::QActsRows {
            ty: r.ty,
            k,
            qs: qa,
            d: da,
            s: sa,
            bsums: ba,
            sums: ua,
        },
        quant::QActsRows {
            ty: r.ty,
            k,
            qs: qb,
            d: db,
            s: sb,
            bsums: bb,
            sums: ub,
        },
    )
}

/// Thread `tid`'s share `lo..hi` of `total` items.
fn split(total: usize, tid: usize, nth: usize) -> (usize, usize) {
    let per = total.div_ceil(nth);
    ((tid * per).min(total), ((tid + 1) * per).min(total))
}

fn dot_row(backend: Backend, ty: WType, w: &[u8], x: quant::ActRow<'_>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(path) = backend.x86() {
        // SAFETY: the backend was checked available.
        return unsafe { crate::x86::dot_row(path, ty, w, x) };
    }
    crate::dots::dot_row(ty, w, x)
}

/// [`dot_row`] of 4 activation rows, where the backend has a kernel for `ty` that shares the
/// weight row's unpacking among them.
fn dot_rows4(
    backend: Backend,
    ty: WType,
    w: &[u8],
    xs: [quant::ActRow<'_>; 4],
) -> Option<[f32; 4]> {
    #[cfg(target_arch = "x86_64")]
    if let Some(path) = backend.x86() {
        // SAFETY: the backend was checked available.
        return unsafe { crate::x86::dot_rows4(path, ty, w, xs) };
    }
    let _ = (backend, ty, w, xs);
    None
}

/// Weight rows widened to f32 together in [`float_matmul`].
const FLOAT_ROWS: usize = 4;

/// F32/F16/BF16 weights: each thread widens its weight rows to f32 four at a time, then dots
/// them with the activation rows, two rows by four weights at a time on AVX2 (eight FMA chains
/// side by side), each dot the same bits as [`quant::dot_f32`] alone.
fn float_matmul(
    backend: Backend,
    pool: &ThreadPool,
    w: &QMatrix<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) {
    let (k, n) = (w.k, w.n);
    let rb = w.ty.row_bytes(k);
    let yp = SendPtr(y.as_mut_ptr());
    let backend = backend.float_path();
    // SAFETY (of every store below): each (i, j) is written by exactly one thread (j is split).
    let put = |i: usize, j: usize, v: f32| unsafe { *yp.get().add(i * n + j) = v };
    pool.run(&|tid, nth| {
        let (lo, hi) = split(n, tid, nth);
        ROW.with(|row| {
            let mut fresh = Vec::new();
            let mut guard = row.try_borrow_mut();
            let rows = match guard.as_deref_mut() {
                Ok(r) => r,
                Err(_) => &mut fresh,
            };
            rows.resize(FLOAT_ROWS * k, 0.0);
            for j0 in (lo..hi).step_by(FLOAT_ROWS) {
                let rw = (hi - j0).min(FLOAT_ROWS);
                #[cfg(target_arch = "x86_64")]
                if m == 1
                    && rw == FLOAT_ROWS
                    && backend == Backend::Avx2
                    && matches!(w.ty, WType::F16 | WType::BF16)
                {
                    // Decode reads the halves in place (the same bits as widened).
                    let ws: [&[u8]; FLOAT_ROWS] =
                        std::array::from_fn(|r| &w.data[(j0 + r) * rb..(j0 + r + 1) * rb]);
                    for bytes in ws {
                        crate::x86::job::prefetch_ahead(bytes.as_ptr(), rb);
                    }
                    // SAFETY: the backend was checked available.
                    let v = unsafe { crate::x86::floats::dot_half_rows4(w.ty, &x[..k], ws) };
                    for (r, v) in v.into_iter().enumerate() {
                        put(0, j0 + r, v);
                    }
                    continue;
                }
                for (r, out) in rows.chunks_exact_mut(k).take(rw).enumerate() {
                    let bytes = &w.data[(j0 + r) * rb..(j0 + r + 1) * rb];
                    #[cfg(target_arch = "x86_64")]
                    if m == 1 {
                        // Decode streams the rows: ask for the bytes ahead.
                        crate::x86::job::prefetch_ahead(bytes.as_ptr(), rb);
                    }
                    match backend {
                        // SAFETY: the backend was checked available.
                        #[cfg(target_arch = "x86_64")]
                        Backend::Avx2 => unsafe { crate::x86::floats::widen_row(w.ty, bytes, out) },
                        _ => dequantize_row(w.ty, bytes, out),
                    }
                }
                let xi = |i: usize| &x[i * k..(i + 1) * k];
                let mut i = 0;
                #[cfg(target_arch = "x86_64")]
                if backend == Backend::Avx2 && rw == FLOAT_ROWS {
                    let ws: [&[f32]; FLOAT_ROWS] =
                        std::array::from_fn(|r| &rows[r * k..(r + 1) * k]);
                    while i < m {
                        // SAFETY: the backend was checked available.
                        let (v, rows_done) = if i + 2 <= m {
                            let v =
                                unsafe { crate::x86::floats::dot_f32_tile([xi(i), xi(i + 1)], ws) };
                            (v, 2)
                        } else {
                            let [v] = unsafe { crate::x86::floats::dot_f32_tile([xi(i)], ws) };
                            ([v, v], 1)
                        };
                        for (a, va) in v.iter().take(rows_done).enumerate() {
                            for (r, &v) in va.iter().enumerate() {
                                put(i + a, j0 + r, v);
                            }
                        }
                        i += rows_done;
                    }
                }
                for i in i..m {
                    for (r, wr) in rows.chunks_exact(k).take(rw).enumerate() {
                        let v = match backend {
                            // SAFETY: the backend was checked available.
                            #[cfg(target_arch = "x86_64")]
                            Backend::Avx2 => unsafe { crate::x86::floats::dot_f32(xi(i), wr) },
                            _ => quant::dot_f32(xi(i), wr),
                        };
                        put(i, j0 + r, v);
                    }
                }
            }
        });
    });
}

/// The naive reference: dequantize each weight row to f32 and dot it with unquantized `x`
/// (what this crate started with; kept for tests and benchmark comparisons).
pub fn reference_matmul(pool: &ThreadPool, w: &QMatrix<'_>, x: &[f32], m: usize, y: &mut [f32]) {
    assert_eq!(x.len(), m * w.k);
    assert_eq!(y.len(), m * w.n);
    let rb = w.ty.row_bytes(w.k);
    let yp = SendPtr(y.as_mut_ptr());
    pool.run(&|tid, nth| {
        let (lo, hi) = split(w.n, tid, nth);
        let mut row = vec![0f32; w.k];
        for j in lo..hi {
            dequantize_row(w.ty, &w.data[j * rb..(j + 1) * rb], &mut row);
            for i in 0..m {
                let xi = &x[i * w.k..(i + 1) * w.k];
                let s: f32 = xi.iter().zip(&row).map(|(a, b)| a * b).sum();
                // SAFETY: each (i, j) is written by exactly one thread (j is split by thread).
                unsafe { *yp.get().add(i * w.n + j) = s };
            }
        }
    });
}
