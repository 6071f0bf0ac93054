//! `attn::paged_attention` against a plain f64 reference (random inputs, scattered block tables,
//! GQA ratios 1/3/4, head dims 16/64/128, block sizes 1/16/32, contexts up to 300), the backends
//! against each other, batch invariance (a query's output bits do not depend on the batch, its
//! tile or the thread count) and the accuracy of the kernel's exp.

use std::sync::OnceLock;

use half::f16;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tpslab_kernels::attn::{self, AttnInput, AttnShape, KvRows};
use tpslab_kernels::{Backend, ThreadPool};

fn pools() -> &'static [ThreadPool; 3] {
    static P: OnceLock<[ThreadPool; 3]> = OnceLock::new();
    P.get_or_init(|| [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)])
}

fn backends() -> Vec<Backend> {
    [Backend::Portable, Backend::Avx2, Backend::Avx512Zmm]
        .into_iter()
        .filter(|b| b.is_available())
        .collect()
}

/// A batch: sequences with their own contexts, each contributing a run of query tokens ending
/// at its last position (a prefill chunk, or one token for decode).
struct Case {
    shape: AttnShape,
    positions: Vec<usize>,
    seq_of: Vec<usize>,
    tables: Vec<Vec<u32>>,
    q: Vec<f32>,
    q_stride: usize,
    k: Vec<f16>,
    v: Vec<f16>,
    softcap: Option<f32>,
    window: Option<usize>,
    sinks: Option<Vec<f32>>,
}

impl Case {
    /// `seqs` = (context length, query tokens at its end) per sequence. Blocks are handed out in
    /// a shuffled order so tables are not contiguous; `q_gain` scales the queries (large values
    /// give peaky softmaxes, exercising the rescaling).
    fn random(shape: AttnShape, seqs: &[(usize, usize)], q_gain: f32, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let bs = shape.block_size;
        let kv_dim = shape.n_kv_heads * shape.head_dim;
        let n_blocks = seqs.iter().map(|s| s.0.div_ceil(bs)).sum::<usize>() + 2;
        let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.random_range(0..=i));
        }
        let (mut positions, mut seq_of, mut tables) = (vec![], vec![], vec![]);
        let mut next = 0;
        for (s, &(len, nq)) in seqs.iter().enumerate() {
            let nb = len.div_ceil(bs);
            tables.push(ids[next..next + nb].to_vec());
            next += nb;
            for p in len - nq..len {
                positions.push(p);
                seq_of.push(s);
            }
        }
        let hidden = shape.n_heads * shape.head_dim;
        // Rows padded like the fused QKV output the engine passes.
        let q_stride = hidden + 2 * kv_dim;
        let q = (0..positions.len() * q_stride)
            .map(|_| rng.random_range(-2.0f32..2.0) * q_gain)
            .collect();
        let mut cache = || -> Vec<f16> {
            (0..n_blocks * bs * kv_dim)
                .map(|_| f16::from_f32(rng.random_range(-2.0f32..2.0)))
                .collect()
        };
        let (k, v) = (cache(), cache());
        Self {
            shape,
            positions,
            seq_of,
            tables,
            q,
            q_stride,
            k,
            v,
            softcap: None,
            window: None,
            sinks: None,
        }
    }

    fn input(&self) -> AttnInput<'_, Vec<u32>> {
        AttnInput {
            shape: self.shape,
            positions: &self.positions,
            seq_of: &self.seq_of,
            tables: &self.tables,
            q: &self.q,
            q_stride: self.q_stride,
            k_cache: KvRows::F16(&self.k),
            v_cache: KvRows::F16(&self.v),
            scale: 1.0 / (self.shape.head_dim as f32).sqrt(),
            softcap: self.softcap,
            window: self.window,
            sinks: self.sinks.as_deref(),
        }
    }

    fn run(&self, backend: Backend, pool: &ThreadPool) -> Vec<f32> {
        let hidden = self.shape.n_heads * self.shape.head_dim;
        let mut out = vec![f32::NAN; self.positions.len() * hidden];
        attn::paged_attention_with(backend, pool, &self.input(), &mut out);
        out
    }

    /// Token `t` alone in a batch of one (its sequence's table only).
    fn alone(&self, t: usize) -> Self {
        let hidden = self.shape.n_heads * self.shape.head_dim;
        Self {
            shape: self.shape,
            positions: vec![self.positions[t]],
            seq_of: vec![0],
            tables: vec![self.tables[self.seq_of[t]].clone()],
            q: self.q[t * self.q_stride..][..hidden].to_vec(),
            q_stride: hidden,
            k: self.k.clone(),
            v: self.v.clone(),
            softcap: self.softcap,
            window: self.window,
            sinks: self.sinks.clone(),
        }
    }

    /// Plain f64 attention with q rounded to f16 like the kernel (K/V are f16 already), so the
    /// only differences left are the kernel's f32 roundings.
    fn reference(&self) -> Vec<f64> {
        let AttnShape {
            n_heads,
            n_kv_heads,
            head_dim: hd,
            block_size: bs,
        } = self.shape;
        let kv_dim = n_kv_heads * hd;
        let mut out = vec![];
        for (t, &pos) in self.positions.iter().enumerate() {
            let table = &self.tables[self.seq_of[t]];
            let off = |p: usize| (table[p / bs] as usize * bs + p % bs) * kv_dim;
            for h in 0..n_heads {
                let g = h / (n_heads / n_kv_heads);
                let q: Vec<f64> = self.q[t * self.q_stride + h * hd..][..hd]
                    .iter()
                    .map(|&x| f64::from(f16::from_f32(x)))
                    .collect();
                let first = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let s: Vec<f64> = (first..=pos)
                    .map(|p| {
                        let k = &self.k[off(p) + g * hd..][..hd];
                        let s = q.iter().zip(k).map(|(a, b)| a * f64::from(*b)).sum::<f64>()
                            / (hd as f64).sqrt();
                        self.softcap
                            .map_or(s, |c| (s / f64::from(c)).tanh() * f64::from(c))
                    })
                    .collect();
                let sink = self.sinks.as_ref().map(|sk| f64::from(sk[h]));
                let max = s
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = w.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
                for d in 0..hd {
                    let acc: f64 = (first..=pos)
                        .zip(&w)
                        .map(|(p, w)| w * f64::from(self.v[off(p) + g * hd + d]))
                        .sum();
                    out.push(acc / sum);
                }
            }
        }
        out
    }
}

/// Every backend against the f64 reference over the grid of shapes. Tolerance: 2e-5 absolute
/// (|V| <= 2, so about 1e-5 of the largest |V|): the kernel's own error is f32 rounding of the
/// dot (a few ulp of |s| <= ~30), the exp (2 ulp) and the sum over up to 300 weighted rows; the
/// f16 rounding of q/k/v is in the reference too (against unrounded inputs it would be ~2e-3).
#[test]
fn matches_f64_reference() {
    let mut worst = 0f64;
    let mut seed = 0;
    for &(n_heads, n_kv) in &[(4, 4), (9, 3), (8, 2)] {
        for &hd in &[16, 64, 128] {
            for &bs in &[1, 16, 32] {
                for &gain in &[1.0, 6.0] {
                    seed += 1;
                    let shape = AttnShape {
                        n_heads,
                        n_kv_heads: n_kv,
                        head_dim: hd,
                        block_size: bs,
                    };
                    // Decode tokens, a whole prompt, and chunks crossing block boundaries.
                    let seqs = [(1, 1), (300, 1), (70, 70), (129, 13), (33, 2)];
                    let case = Case::random(shape, &seqs, gain, seed);
                    let want = case.reference();
                    for b in backends() {
                        let got = case.run(b, &pools()[1]);
                        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                            let err = (f64::from(g) - w).abs();
                            worst = worst.max(err);
                            assert!(
                                err <= 2e-5,
                                "{b:?} {n_heads}/{n_kv}/{hd}/bs{bs} gain {gain} elem {i}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
    eprintln!("worst |error| vs f64 reference: {worst:e}");
}

/// Sliding windows (narrower and wider than a softmax block, of one position, past the context)
/// and soft-capped scores, on every backend, against the f64 reference; and a token's output
/// with a window still does not depend on its batch.
#[test]
fn windows_and_softcap_match_reference() {
    let shape = AttnShape {
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        block_size: 16,
    };
    let seqs = [(1, 1), (300, 1), (70, 70), (129, 13), (33, 2)];
    for (i, &(window, softcap)) in [
        (Some(1), None),
        (Some(7), None),
        (Some(32), None),
        (Some(45), Some(50.0)),
        (Some(1000), None),
        (None, Some(5.0)),
    ]
    .iter()
    .enumerate()
    {
        let mut case = Case::random(shape, &seqs, 6.0, 500 + i as u64);
        case.window = window;
        case.softcap = softcap;
        check_reference_and_alone(&case, &format!("window {window:?} softcap {softcap:?}"));
    }
}

/// On every backend: `case` within 2e-5 of the f64 reference, and a few of its tokens run alone
/// give the bits they give in the batch.
fn check_reference_and_alone(case: &Case, what: &str) {
    let want = case.reference();
    let hidden = case.shape.n_heads * case.shape.head_dim;
    for b in backends() {
        let got = case.run(b, &pools()[1]);
        for (e, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= 2e-5,
                "{b:?} {what} elem {e}: {g} vs {w}"
            );
        }
        for t in [0, 5, 40, case.positions.len() - 1] {
            let alone = case.alone(t).run(b, &pools()[0]);
            let batched = &got[t * hidden..(t + 1) * hidden];
            assert!(
                alone
                    .iter()
                    .zip(batched)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{b:?} {what}: token {t} differs alone"
            );
        }
    }
}

/// Sinks (one logit per query head, in each softmax's denominator; gpt-oss): below, among and
/// far above the scores, with and without a window, on every backend against the f64
/// reference; a token's output with sinks does not depend on its batch; a sink of -inf is no
/// sink at all.
#[test]
fn sinks_match_reference() {
    let shape = AttnShape {
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        block_size: 16,
    };
    let seqs = [(1, 1), (300, 1), (70, 70), (129, 13), (33, 2)];
    for (i, &(lo, hi, window)) in [
        (-20.0f32, -10.0, None),
        (-3.0, 3.0, None),
        (-3.0, 3.0, Some(16)),
        (40.0, 60.0, Some(5)),
    ]
    .iter()
    .enumerate()
    {
        let mut case = Case::random(shape, &seqs, 3.0, 700 + i as u64);
        let mut rng = StdRng::seed_from_u64(i as u64);
        case.sinks = Some((0..8).map(|_| rng.random_range(lo..hi)).collect());
        case.window = window;
        check_reference_and_alone(&case, &format!("sinks {lo}..{hi} window {window:?}"));
    }
    let mut case = Case::random(shape, &seqs, 3.0, 800);
    let plain = case.run(Backend::Portable, &pools()[1]);
    case.sinks = Some(vec![f32::NEG_INFINITY; 8]);
    assert_eq!(case.run(Backend::Portable, &pools()[1]), plain);
}

/// Head dims that are not a multiple of 8 run on the portable path whatever the backend asked.
#[test]
fn odd_head_dim_falls_back_to_portable() {
    let shape = AttnShape {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 12,
        block_size: 16,
    };
    let case = Case::random(shape, &[(40, 40), (77, 1)], 3.0, 99);
    let want = case.reference();
    for b in backends() {
        let got = case.run(b, &pools()[2]);
        for (&g, &w) in got.iter().zip(&want) {
            assert!((f64::from(g) - w).abs() <= 2e-5, "{b:?}: {g} vs {w}");
        }
    }
}

#[test]
fn avx2_matches_portable() {
    if !Backend::Avx2.is_available() {
        return;
    }
    let shape = AttnShape {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        block_size: 16,
    };
    let case = Case::random(shape, &[(300, 120), (257, 1), (5, 5)], 4.0, 5);
    let a = case.run(Backend::Avx2, &pools()[1]);
    let p = case.run(Backend::Portable, &pools()[1]);
    for (i, (x, y)) in a.iter().zip(&p).enumerate() {
        assert!((x - y).abs() <= 2e-5, "elem {i}: avx2 {x} vs portable {y}");
    }
}

/// The 512-bit dots and V sums give the AVX2 path's bits: head sizes with and without a
/// 16-float remainder, with windows, soft-capping and sinks, prefill and decode queries.
#[test]
fn zmm_matches_avx2_bit_for_bit() {
    if !Backend::Avx512Zmm.is_available() {
        eprintln!("no AVX-512 here: the 512-bit attention path is not reached on this CPU");
        return;
    }
    for (i, hd) in [8usize, 16, 24, 64, 72, 128, 256].into_iter().enumerate() {
        let shape = AttnShape {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: hd,
            block_size: 16,
        };
        let mut case = Case::random(shape, &[(300, 70), (97, 1), (5, 5)], 4.0, 11 + i as u64);
        match i % 3 {
            1 => case.window = Some(40),
            2 => case.softcap = Some(20.0),
            _ => case.sinks = Some((0..8).map(|h| h as f32 * 0.3 - 1.0).collect()),
        }
        let a = case.run(Backend::Avx2, &pools()[1]);
        let z = case.run(Backend::Avx512Zmm, &pools()[2]);
        for (j, (x, y)) in a.iter().zip(&z).enumerate() {
            assert_eq!(
                x.to_bits(),
                y.to_bits(),
                "hd {hd} elem {j}: avx2 {x} vs zmm {y}"
            );
        }
    }
}

/// The kernel's AVX2 exp against the correctly rounded exp (f64, rounded once) over every 61st
/// f32 in [-105, 0] (softmax only feeds it non-positive numbers) plus a sample of (0, 88.7]:
/// within 2 ulp, subnormal results included; below about -103.97 the result is 0.
#[test]
fn exp_within_2_ulp() {
    for b in backends() {
        let lo = (-105f32).to_bits();
        let mut xs: Vec<f32> = ((-0f32).to_bits()..=lo)
            .step_by(61)
            .map(f32::from_bits)
            .collect();
        xs.extend((0..=88.7f32.to_bits()).step_by(1013).map(f32::from_bits));
        xs.extend([
            0.0,
            -0.0,
            f32::NEG_INFINITY,
            -1e30,
            -87.33655,
            -88.0,
            -103.0,
        ]);
        let mut got = xs.clone();
        attn::exp_in_place(b, &mut got);
        let mut worst = 0u32;
        for (&x, &y) in xs.iter().zip(&got) {
            let want = (f64::from(x)).exp() as f32;
            let ulp = want.to_bits().abs_diff(y.to_bits());
            worst = worst.max(ulp);
            assert!(
                ulp <= 2,
                "{b:?} exp({x:e}) = {y:e}, want {want:e} ({ulp} ulp)"
            );
        }
        eprintln!(
            "{b:?}: worst exp error {worst} ulp over {} inputs",
            xs.len()
        );
        let mut inf_nan = [f32::INFINITY, f32::NAN, 100.0];
        attn::exp_in_place(b, &mut inf_nan);
        assert!(inf_nan[0] == f32::INFINITY && inf_nan[1].is_nan() && inf_nan[2] == f32::INFINITY);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Each query computed in a random batch, with 1, 2 or 3 threads, equals (bit for bit) the
    /// same query computed alone: tiles, batch neighbours and threads never change arithmetic.
    #[test]
    fn batch_invariant(
        ratio in prop::sample::select(vec![1usize, 3, 4]),
        n_kv in 1usize..=3,
        hd in prop::sample::select(vec![8usize, 16, 64]),
        bs in prop::sample::select(vec![1usize, 7, 16, 32]),
        seqs in prop::collection::vec((1usize..=150, 1usize..=20), 1..=4),
        seed in any::<u64>(),
    ) {
        let shape = AttnShape { n_heads: ratio * n_kv, n_kv_heads: n_kv, head_dim: hd, block_size: bs };
        let seqs: Vec<(usize, usize)> = seqs.iter().map(|&(len, nq)| (len, nq.min(len))).collect();
        let case = Case::random(shape, &seqs, 3.0, seed);
        let hidden = shape.n_heads * hd;
        for b in backends() {
            let alone: Vec<f32> = (0..case.positions.len())
                .flat_map(|t| case.alone(t).run(b, &pools()[0]))
                .collect();
            for pool in pools() {
                let got = case.run(b, pool);
                for (i, (x, y)) in got.iter().zip(&alone).enumerate() {
                    prop_assert_eq!(
                        x.to_bits(), y.to_bits(),
                        "{:?} {} threads token {} elem {}: {} vs {}",
                        b, pool.n_threads(), i / hidden, i % hidden, x, y
                    );
                }
            }
        }
    }
}
