//! Paged attention on SmolLM2-135M's shapes (9 query heads, 3 kv heads, head dim 64, KV blocks
//! of 16): one sequence's prefill of 128 and 512 tokens, and decode of 64 sequences at context
//! 256. Each iteration runs all 30 layers (distinct caches, so the KV footprint is the real
//! model's; `TPSLAB_BENCH_LAYERS` changes the count); divide by it for the time per layer. `old` is the engine's previous implementation
//! (per query head, per position: convert the K/V row, scalar exp), copied here for comparison.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use half::f16;
use half::slice::HalfFloatSliceExt;
use tpslab_kernels::attn::{self, AttnInput, AttnShape, KvRows};
use tpslab_kernels::{SendPtr, ThreadPool};

/// Layers per iteration (`TPSLAB_BENCH_LAYERS`, default 30).
fn layers() -> usize {
    std::env::var("TPSLAB_BENCH_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}
const SHAPE: AttnShape = AttnShape {
    n_heads: 9,
    n_kv_heads: 3,
    head_dim: 64,
    block_size: 16,
};

/// Threads: `TPSLAB_BENCH_THREADS` (default 2, the target machine's cores).
fn threads() -> usize {
    std::env::var("TPSLAB_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

struct Case {
    positions: Vec<usize>,
    seq_of: Vec<usize>,
    tables: Vec<Vec<u32>>,
    q: Vec<f32>,
    q_stride: usize,
    /// Per layer.
    kv: Vec<(Vec<f16>, Vec<f16>)>,
}

/// Hash-random values in [-1, 1) (a regular pattern would make the scores climb steadily and
/// trigger a rescale at most positions, which real attention rarely does).
fn pseudo(i: usize) -> f32 {
    let mut x = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((x >> 40) as f32 / (1u64 << 23) as f32) - 1.0
}

/// `seqs` = (context, query tokens at its end); blocks interleaved across sequences.
fn case(seqs: &[(usize, usize)]) -> Case {
    let bs = SHAPE.block_size;
    let kv_dim = SHAPE.n_kv_heads * SHAPE.head_dim;
    let n_seqs = seqs.len();
    let (mut positions, mut seq_of, mut tables) = (vec![], vec![], vec![]);
    for (s, &(len, nq)) in seqs.iter().enumerate() {
        tables.push(
            (0..len.div_ceil(bs))
                .map(|b| (b * n_seqs + s) as u32)
                .collect::<Vec<_>>(),
        );
        for p in len - nq..len {
            positions.push(p);
            seq_of.push(s);
        }
    }
    let n_blocks = seqs.iter().map(|s| s.0.div_ceil(bs)).max().unwrap_or(0) * n_seqs;
    let q_stride = SHAPE.n_heads * SHAPE.head_dim + 2 * kv_dim;
    let q = (0..positions.len() * q_stride).map(pseudo).collect();
    let kv = (0..layers())
        .map(|l| {
            let n = n_blocks * bs * kv_dim;
            let k = (0..n).map(|i| f16::from_f32(pseudo(i + l))).collect();
            let v = (0..n).map(|i| f16::from_f32(pseudo(3 * i + l))).collect();
            (k, v)
        })
        .collect();
    Case {
        positions,
        seq_of,
        tables,
        q,
        q_stride,
        kv,
    }
}

fn new_layers(pool: &ThreadPool, c: &Case, out: &mut [f32]) {
    for (k, v) in &c.kv {
        let input = AttnInput {
            shape: SHAPE,
            positions: &c.positions,
            seq_of: &c.seq_of,
            tables: &c.tables,
            q: &c.q,
            q_stride: c.q_stride,
            k_cache: KvRows::F16(k),
            v_cache: KvRows::F16(v),
            scale: 1.0 / (SHAPE.head_dim as f32).sqrt(),
            softcap: None,
            window: None,
            sinks: None,
        };
        attn::paged_attention(pool, &input, out);
    }
}

fn old_layers(pool: &ThreadPool, c: &Case, out: &mut [f32]) {
    for (k, v) in &c.kv {
        old_paged_attention(pool, c, k, v, out);
    }
}

/// The engine's implementation before `kernels::attn` (same arithmetic order, same API shape).
fn old_paged_attention(
    pool: &ThreadPool,
    c: &Case,
    k_cache: &[f16],
    v_cache: &[f16],
    out: &mut [f32],
) {
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        block_size,
    } = SHAPE;
    let group = n_heads / n_kv_heads;
    let kv_dim = n_kv_heads * hd;
    let hidden = n_heads * hd;
    let n_items = c.positions.len() * n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let outp = SendPtr(out.as_mut_ptr());
    pool.run(&|tid, nth| {
        let per = n_items.div_ceil(nth);
        let (lo, hi) = (tid * per, ((tid + 1) * per).min(n_items));
        for item in lo..hi {
            let (t, g) = (item / n_kv_heads, item % n_kv_heads);
            let table = &c.tables[c.seq_of[t]];
            let slots = (0..=c.positions[t]).map(|p| {
                (table[p / block_size] as usize * block_size + p % block_size) * kv_dim + g * hd
            });
            for h in g * group..(g + 1) * group {
                let qh = &c.q[t * c.q_stride + h * hd..][..hd];
                // SAFETY: each (t, h) output row is written by exactly one work item.
                let oh = unsafe {
                    std::slice::from_raw_parts_mut(outp.get().add(t * hidden + h * hd), hd)
                };
                old_attend(qh, scale, slots.clone(), k_cache, v_cache, oh);
            }
        }
    });
}

fn old_attend(
    q: &[f32],
    scale: f32,
    offsets: impl Iterator<Item = usize>,
    k_cache: &[f16],
    v_cache: &[f16],
    out: &mut [f32],
) {
    let hd = q.len();
    let (mut q16, mut row, mut acc) = ([0f32; 256], [0f32; 256], [0f32; 256]);
    let (q16, row, acc) = (&mut q16[..hd], &mut row[..hd], &mut acc[..hd]);
    for (d, &x) in q16.iter_mut().zip(q) {
        *d = f16::from_f32(x).to_f32();
    }
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    for off in offsets {
        k_cache[off..off + hd].convert_to_f32_slice(row);
        let s = old_dot(q16, row) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > max {
            ms = (max - s).exp();
            max = s;
            acc.iter_mut().for_each(|a| *a *= ms);
        } else {
            vs = (s - max).exp();
        }
        v_cache[off..off + hd].convert_to_f32_slice(row);
        for (a, &v) in acc.iter_mut().zip(row.iter()) {
            *a += v * vs;
        }
        sum = sum * ms + vs;
    }
    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    for (o, &a) in out.iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}

fn old_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

fn bench(c: &mut Criterion) {
    let pool = ThreadPool::new(threads());
    let mut g = c.benchmark_group(format!("attn_{}t_{}layers", threads(), layers()));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    let decode: Vec<(usize, usize)> = vec![(256, 1); 64];
    for (name, seqs) in [
        ("prefill128", vec![(128, 128)]),
        ("prefill512", vec![(512, 512)]),
        ("decode64x256", decode),
    ] {
        let cs = case(&seqs);
        let mut out = vec![0f32; cs.positions.len() * SHAPE.n_heads * SHAPE.head_dim];
        g.bench_function(format!("{name}/new"), |b| {
            b.iter(|| new_layers(&pool, black_box(&cs), &mut out));
        });
        g.bench_function(format!("{name}/old"), |b| {
            b.iter(|| old_layers(&pool, black_box(&cs), &mut out));
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
