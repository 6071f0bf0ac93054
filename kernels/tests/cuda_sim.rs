//! The CUDA kernels, run on the CPU by the simulator in `kernels/cuda/sim` (each thread an OS
//! thread, warp shuffles and tensor-core fragments emulated lane by lane, built with
//! AddressSanitizer and UBSan), against the same f64 references as `tests/cuda.rs` uses on a GPU.
//! This catches wrong indexing, unpacking and reductions, and out-of-bounds or misaligned loads,
//! on every machine; speed, and anything the hardware does differently, wait for
//! `tests/gpu/gpu-check.sh`. Launch shapes are those of `tpslab_kernels::cuda`.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)]

mod common;

use common::sim::{A, Buf, Job};
use common::{dequantized, random_vec, random_weights, rng};
use half::f16;
use tpslab_kernels::cuda::wtype_id;
use tpslab_kernels::{QMatrix, WType};

fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        let g = *g as f64;
        num += if g.is_finite() {
            (g - w) * (g - w)
        } else {
            f64::INFINITY
        };
        den += w * w;
    }
    (num / den.max(1e-30)).sqrt()
}

/// `y[r][c] = x[r] . W[c]` in f64 over `x` given element by element.
fn reference(x: &dyn Fn(usize) -> f64, wf: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k).map(|e| x(r * k + e) * wf[c * k + e] as f64).sum()
        })
        .collect()
}

/// The activations as `quantize_q8` (mmvq.cu) leaves them, back as q * d: per 32 values
/// d = amax / 127 and q = round-half-even(x * (127 / amax)) in f32.
fn q8_round(x: &[f32]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|b| {
            let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            let d = amax / 127.0;
            b.iter()
                .map(move |v| (v * inv).round_ties_even() as f64 * d as f64)
        })
        .collect()
}

/// `quantize_q8` (mmvq.cu) of the activations `x` in `job`: the int8 values' buffer and the
/// scales' (one f32 per 32).
fn quantize_q8(job: &mut Job, x: &[f32]) -> (Buf, Buf) {
    let blocks = x.len() / 32;
    let xb = job.floats(x);
    let (qb, db) = (job.out(x.len()), job.out(blocks * 4));
    let args = [A::P(xb, 0), A::P(qb, 0), A::P(db, 0), A::L(blocks as i64)];
    job.launch("quantize_q8", (blocks.div_ceil(8) as u32, 1), 256, &args);
    (qb, db)
}

/// The kernel of a family for `rows` activation rows (1, 2, 4, 8), as `Gpu::by_rows` picks it.
fn by_rows(family: &str, ty: WType, rows: usize) -> String {
    let m = match rows {
        1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    };
    format!("{family}_{}_{m}", ty.name().to_ascii_lowercase())
}

const MMV_TYPES: [WType; 8] = [
    WType::F32,
    WType::F16,
    WType::BF16,
    WType::Q4_0,
    WType::Q4_1,
    WType::Q8_0,
    WType::Q4K,
    WType::Q6K,
];

/// matvec.cu: f32 activations, up to 8 rows a launch, one warp per weight row.
#[test]
fn matvec_kernels_every_type_and_row_count() {
    let mut r = rng(0x5eed_0c0d);
    let (n, k) = (37, 512);
    for ty in MMV_TYPES {
        let w = random_weights(&mut r, ty, n, k);
        let wf = dequantized(&QMatrix::rows(ty, n, k, &w));
        for m in [1, 3, 8] {
            let x = random_vec(&mut r, m * k, 0.5);
            let mut job = Job::new();
            let (wb, xb, yb) = (job.buf(&w), job.floats(&x), job.out(m * n * 4));
            let args = [
                A::P(wb, 0),
                A::L(ty.row_bytes(k) as i64),
                A::P(xb, 0),
                A::P(yb, 0),
                A::I(n as i32),
                A::I(k as i32),
                A::I(m as i32),
                A::I(n as i32),
            ];
            job.launch(
                &by_rows("mmv", ty, m),
                (n.div_ceil(4) as u32, 1),
                128,
                &args,
            );
            let got = job.run().floats(yb);
            let err = rel_err(&got, &reference(&|i| x[i] as f64, &wf, m, n, k));
            assert!(err < 1e-5, "{ty:?} m={m}: rel err {err:e}");
        }
    }
}

/// matvec.cu's wide-load F16/BF16 kernels for one activation row, at a length that takes both
/// their four-load loop and its remainder.
#[test]
fn wide_load_dense_kernels_for_one_row() {
    let mut r = rng(0x5eed_0f16);
    let (n, k) = (21, 1544);
    for ty in [WType::F16, WType::BF16] {
        let w = random_weights(&mut r, ty, n, k);
        let wf = dequantized(&QMatrix::rows(ty, n, k, &w));
        let x = random_vec(&mut r, k, 0.5);
        let mut job = Job::new();
        let (wb, xb, yb) = (job.buf(&w), job.floats(&x), job.out(n * 4));
        let name = format!("mmv_{}_wide", ty.name().to_ascii_lowercase());
        let args = [
            A::P(wb, 0),
            A::L(ty.row_bytes(k) as i64),
            A::P(xb, 0),
            A::P(yb, 0),
            A::I(n as i32),
            A::I(k as i32),
        ];
        job.launch(&name, (n.div_ceil(4) as u32, 1), 128, &args);
        let got = job.run().floats(yb);
        let err = rel_err(&got, &reference(&|i| x[i] as f64, &wf, 1, n, k));
        assert!(err < 1e-5, "{ty:?}: rel err {err:e}");
    }
}

/// Every quantized type: mmvq.cu has a kernel for each.
fn quant_types() -> impl Iterator<Item = WType> {
    WType::ALL
        .into_iter()
        .filter(|t| !matches!(t, WType::F32 | WType::F16 | WType::BF16))
}

/// A row length for `ty`: 512, and for the 32-element block types also one that is not a
/// multiple of 256 (SmolLM2's 576 is one).
fn lengths(ty: WType) -> Vec<usize> {
    if ty.block_size() == 32 {
        vec![512, 96]
    } else {
        vec![512]
    }
}

/// mmvq.cu: `quantize_q8` of the activations, then the integer-dot kernels, against a reference
/// fed the same 8-bit activations.
#[test]
fn mmvq_kernels_every_type_over_8bit_activations() {
    let mut r = rng(0x5eed_0008);
    let n = 37;
    for (ty, k) in quant_types().flat_map(|t| lengths(t).into_iter().map(move |k| (t, k))) {
        let w = random_weights(&mut r, ty, n, k);
        let wf = dequantized(&QMatrix::rows(ty, n, k, &w));
        for m in [1, 2, 5, 8] {
            let x = random_vec(&mut r, m * k, 0.5);
            let mut job = Job::new();
            let (wb, yb) = (job.buf(&w), job.out(m * n * 4));
            let (qb, db) = quantize_q8(&mut job, &x);
            let args = [
                A::P(wb, 0),
                A::L(ty.row_bytes(k) as i64),
                A::P(qb, 0),
                A::P(db, 0),
                A::P(yb, 0),
                A::I(n as i32),
                A::I(k as i32),
                A::I(m as i32),
                A::I(n as i32),
            ];
            job.launch(
                &by_rows("mmvq", ty, m),
                (n.div_ceil(4) as u32, 1),
                128,
                &args,
            );
            let got = job.run().floats(yb);
            let xq = q8_round(&x);
            let err = rel_err(&got, &reference(&|i| xq[i], &wf, m, n, k));
            assert!(err < 1e-5, "{ty:?} m={m}: rel err {err:e}");
        }
    }
}

/// mmvq.cu's fused SwiGLU gate-up kernels: silu(gate) * up from one [gate | up] matrix, against
/// the reference fed the same 8-bit activations.
#[test]
fn mmvq_swiglu_kernels_every_type() {
    let mut r = rng(0x5eed_0511);
    let (ffn, k) = (19, 256);
    for ty in quant_types() {
        let w = random_weights(&mut r, ty, 2 * ffn, k);
        let wf = dequantized(&QMatrix {
            ty,
            n: 2 * ffn,
            k,
            data: &w,
            layout: tpslab_kernels::Layout::Ggml,
        });
        for m in [1, 5] {
            let x = random_vec(&mut r, m * k, 0.5);
            let mut job = Job::new();
            let (wb, yb) = (job.buf(&w), job.out(m * ffn * 4));
            let (qb, db) = quantize_q8(&mut job, &x);
            let args = [
                A::P(wb, 0),
                A::L(ty.row_bytes(k) as i64),
                A::P(qb, 0),
                A::P(db, 0),
                A::P(yb, 0),
                A::I(ffn as i32),
                A::I(k as i32),
                A::I(m as i32),
            ];
            job.launch(
                &by_rows("mmvq_swiglu", ty, m),
                (ffn.div_ceil(4) as u32, 1),
                128,
                &args,
            );
            let got = job.run().floats(yb);
            let xq = q8_round(&x);
            let gu = reference(&|i| xq[i], &wf, m, 2 * ffn, k);
            let want: Vec<f64> = (0..m * ffn)
                .map(|i| {
                    let (row, c) = (i / ffn, i % ffn);
                    let (g, u) = (gu[row * 2 * ffn + c], gu[row * 2 * ffn + ffn + c]);
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            let err = rel_err(&got, &want);
            assert!(err < 1e-5, "{ty:?} m={m}: rel err {err:e}");
        }
    }
}

/// elementwise.cu's `embed_rows` (any type, element by element) and `dequant_f16` (a 32-element
/// group a thread, for cuBLAS) against `dequantize_row`.
#[test]
fn embedding_rows_and_f16_dequantization_of_every_type() {
    let mut r = rng(0x5eed_00e6);
    for ty in WType::ALL {
        let (n, k) = (9, lengths(ty)[lengths(ty).len() - 1]);
        let w = random_weights(&mut r, ty, n, k);
        let wf = dequantized(&QMatrix::rows(ty, n, k, &w));
        let tokens = [3, 0, 8, 3];
        let groups = n * k / 32;
        let mut job = Job::new();
        let (wb, tb) = (job.buf(&w), job.ints(&tokens));
        let (eb, hb) = (job.out(tokens.len() * k * 4), job.out(n * k * 2));
        let rb = ty.row_bytes(k) as i64;
        let id = wtype_id(ty);
        job.launch(
            "embed_rows",
            (tokens.len() as u32, 1),
            256,
            &[
                A::P(wb, 0),
                A::I(id),
                A::I(k as i32),
                A::L(rb),
                A::P(tb, 0),
                A::P(eb, 0),
            ],
        );
        if ty.block_size() > 1 {
            job.launch(
                "dequant_f16",
                (groups.div_ceil(256) as u32, 1),
                256,
                &[
                    A::P(wb, 0),
                    A::I(id),
                    A::I(k as i32),
                    A::L(rb),
                    A::L(groups as i64),
                    A::P(hb, 0),
                ],
            );
        }
        let out = job.run();
        let rows: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| wf[t as usize * k..(t as usize + 1) * k].to_vec())
            .collect();
        assert_eq!(out.floats(eb), rows, "{ty:?}: embedding rows");
        if ty.block_size() > 1 {
            let got: Vec<f32> = out
                .bytes(hb)
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect();
            let want: Vec<f32> = wf.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
            assert_eq!(got, want, "{ty:?}: f16 dequantization");
        }
    }
}

/// mmq.cu: weights decoded to f16 tiles in shared memory times f16 activations on the
/// (emulated) tensor cores, against f16-rounded weights and activations summed in f64, for
/// both tile heights, row counts that leave partial tiles, and a weight row count that is not a
/// multiple of 64.
#[test]
fn mmq_tensor_core_kernels_every_type() {
    let mut r = rng(0x5eed_0a11);
    let n = 70;
    let h = |v: f32| half::f16::from_f32(v).to_f32() as f64;
    for ty in quant_types() {
        let k = lengths(ty)[lengths(ty).len() - 1].min(256);
        let k = if ty.block_size() == 256 { 256 } else { k };
        let w = random_weights(&mut r, ty, n, k);
        let wf: Vec<f32> = dequantized(&QMatrix::rows(ty, n, k, &w))
            .iter()
            .map(|&v| h(v) as f32)
            .collect();
        for (m, bm) in [(9, 32), (40, 32), (71, 64)] {
            let x = random_vec(&mut r, m * k, 0.5);
            let mut job = Job::new();
            let (wb, xb, yb) = (job.buf(&w), job.floats(&x), job.out(m * n * 4));
            let args = [
                A::P(wb, 0),
                A::L(ty.row_bytes(k) as i64),
                A::P(xb, 0),
                A::P(yb, 0),
                A::I(n as i32),
                A::I(k as i32),
                A::I(m as i32),
                A::I(n as i32),
            ];
            let name = format!("mmq_{}_{bm}", ty.name().to_ascii_lowercase());
            job.launch(
                &name,
                (n.div_ceil(64) as u32, m.div_ceil(bm) as u32),
                128,
                &args,
            );
            let got = job.run().floats(yb);
            let err = rel_err(&got, &reference(&|i| h(x[i]), &wf, m, n, k));
            assert!(err < 1e-5, "{ty:?} m={m} tile {bm}: rel err {err:e}");
        }
    }
}

/// Attention shape and strides of the attention tests, and the scores' window (0: none) and
/// soft-cap (0: none).
#[derive(Clone, Copy)]
struct Geom {
    n_heads: usize,
    n_kv: usize,
    hd: usize,
    bs: usize,
    kv_dim: usize,
    stride: usize,
    window: usize,
    softcap: f32,
}

/// Causal softmax attention in f64 of every token over the paged f16 cache.
#[allow(clippy::too_many_arguments)]
fn attention_reference(
    g: &Geom,
    qkv: &[f32],
    kc: &[f16],
    vc: &[f16],
    pos: &[i32],
    bt_off: &[i32],
    bt: &[i32],
    scale: f32,
    sinks: Option<&[f32]>,
) -> Vec<f64> {
    let Geom {
        n_heads,
        n_kv,
        hd,
        bs,
        kv_dim,
        stride,
        window,
        softcap,
    } = *g;
    let n = pos.len();
    let mut want = vec![0f64; n * n_heads * hd];
    for i in 0..n {
        let table = &bt[bt_off[i] as usize..];
        for h in 0..n_heads {
            let kvh = h / (n_heads / n_kv);
            let q = &qkv[i * stride + h * hd..i * stride + (h + 1) * hd];
            let slot = |j: usize| table[j / bs] as usize * bs + j % bs;
            let at = |c: &[f16], j: usize, e: usize| c[slot(j) * kv_dim + kvh * hd + e].to_f64();
            let p = pos[i] as usize;
            let first = if window > 0 {
                (p + 1).saturating_sub(window)
            } else {
                0
            };
            let cap = |x: f64| {
                if softcap > 0.0 {
                    (x / softcap as f64).tanh() * softcap as f64
                } else {
                    x
                }
            };
            // Keys before the window weigh nothing (-inf).
            let scores: Vec<f64> = (0..=p)
                .map(|j| {
                    let s = (0..hd).map(|e| q[e] as f64 * at(kc, j, e)).sum::<f64>() * scale as f64;
                    if j < first { f64::NEG_INFINITY } else { cap(s) }
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            // A head's sink joins the sum (gpt-oss).
            let sink = sinks.map_or(0.0, |sk| (sk[h] as f64 - m).exp());
            let l: f64 = p.iter().sum::<f64>() + sink;
            for e in 0..hd {
                want[(i * n_heads + h) * hd + e] = p
                    .iter()
                    .enumerate()
                    .map(|(j, pj)| pj * at(vc, j, e))
                    .sum::<f64>()
                    / l;
            }
        }
    }
    want
}

/// flash.cu: prefill tiles over a paged KV cache (two sequences, one chunk starting mid-way
/// through its sequence, block tables out of order, a tile of 64 and partial tiles), against
/// causal softmax attention in f64 over the same f16 keys and values; and attention.cu's
/// per-token kernels (both variants) on the same inputs over a list of tokens (`which`).
#[test]
fn flash_prefill_tiles_and_per_token_kernels_over_the_paged_cache() {
    let mut r = rng(0x5eed_0fa2);
    let (n_heads, n_kv, bs, nblocks) = (4usize, 2usize, 16usize, 12usize);
    // (first position, tokens, block table) of each sequence's chunk.
    let seqs: [(usize, usize, Vec<i32>); 2] =
        [(20, 37, vec![3, 7, 1, 9]), (0, 70, vec![0, 2, 4, 5, 6])];
    // (head dim / 32, window, soft-cap, sinks): the plain kernels at three head sizes (64- and
    // 32-key flash tiles), then sliding windows (keys skipped a tile at a time), soft-capping and
    // attention sinks.
    let sinks: Vec<f32> = vec![0.3, -1.0, 2.5, 0.0];
    for (hdl, window, softcap, with_sinks) in [
        (2usize, 0usize, 0f32, false),
        (4, 0, 0.0, false),
        (8, 0, 0.0, false),
        (2, 24, 30.0, false),
        (8, 24, 0.0, false),
        (4, 0, 0.0, true),
    ] {
        let hd = 32 * hdl;
        let (kv_dim, stride) = (n_kv * hd, (n_heads + 2 * n_kv) * hd);
        let (pos, bt_off, bt, tiles) = chunk_layout(&seqs);
        let n = pos.len();
        let qkv = random_vec(&mut r, n * stride, 0.5);
        let (kc, vc) = (
            random_f16(&mut r, nblocks * bs * kv_dim),
            random_f16(&mut r, nblocks * bs * kv_dim),
        );
        let scale = 1.0 / (hd as f32).sqrt();
        let mut job = Job::new();
        let h16 = |v: &[f16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (qb, kb, vb) = (job.floats(&qkv), job.buf(&h16(&kc)), job.buf(&h16(&vc)));
        let (pb, ob, tb) = (job.ints(&pos), job.ints(&bt_off), job.ints(&bt));
        let (tl, out) = (job.ints(&tiles), job.out(n * n_heads * hd * 4));
        let sb = job.floats(&sinks);
        let args = [
            A::P(qb, 0),
            A::I(stride as i32),
            A::P(kb, 0),
            A::P(vb, 0),
            A::P(pb, 0),
            A::P(ob, 0),
            A::P(tb, 0),
            A::P(out, 0),
            A::I(n_heads as i32),
            A::I(n_kv as i32),
            A::I(bs as i32),
            A::F(scale),
            A::P(tl, 0),
            A::I(window as i32),
            A::F(softcap),
            if with_sinks { A::P(sb, 0) } else { A::Null },
        ];
        let grid = ((tiles.len() / 2) as u32, n_heads as u32);
        job.launch(&format!("flash_prefill_{hdl}"), grid, 128, &args);
        let which: Vec<i32> = (0..n as i32).rev().step_by(3).collect();
        let wb = job.ints(&which);
        let per_token: Vec<_> = ["paged_attention", "paged_attention_wide"]
            .iter()
            .map(|name| {
                let o = job.out(n * n_heads * hd * 4);
                let mut a = args.to_vec();
                a[7] = A::P(o, 0);
                a[12] = A::P(wb, 0);
                let y = (n_kv * (n_heads / n_kv).div_ceil(8)) as u32;
                job.launch(&format!("{name}_{hdl}"), (which.len() as u32, y), 128, &a);
                (name, o)
            })
            .collect();
        let done = job.run();
        let got = done.floats(out);
        let geom = Geom {
            n_heads,
            n_kv,
            hd,
            bs,
            kv_dim,
            stride,
            window,
            softcap,
        };
        let sink = with_sinks.then_some(sinks.as_slice());
        let want = attention_reference(&geom, &qkv, &kc, &vc, &pos, &bt_off, &bt, scale, sink);
        let err = rel_err(&got, &want);
        let case =
            format!("head dim {hd}, window {window}, soft-cap {softcap}, sinks {with_sinks}");
        assert!(err < 1e-3, "{case}: rel err {err:e}");
        println!("{case}: rel err {err:e}");
        let row = n_heads * hd;
        for (name, o) in per_token {
            listed_rows_match(
                &done.floats(o),
                &want,
                &which,
                row,
                &format!("{name}, {case}"),
            );
        }
    }
}

/// Chunks of sequences (first position, tokens, block table) as one batch: each token's
/// position and block-table offset, the block tables, and flash's tiles of up to 64 tokens.
#[allow(clippy::type_complexity)]
fn chunk_layout(seqs: &[(usize, usize, Vec<i32>)]) -> (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>) {
    let (mut pos, mut bt_off, mut bt, mut tiles) = (vec![], vec![], vec![], vec![]);
    for (p0, len, table) in seqs {
        let first = pos.len() as i32;
        let off = bt.len() as i32;
        bt.extend(table);
        for t in 0..*len {
            pos.push((p0 + t) as i32);
            bt_off.push(off);
        }
        for c in (0..*len).step_by(64) {
            tiles.extend([first + c as i32, (*len - c).min(64) as i32]);
        }
    }
    (pos, bt_off, bt, tiles)
}

/// `n` random f16 values (a KV cache's).
fn random_f16(r: &mut rand::rngs::StdRng, n: usize) -> Vec<f16> {
    random_vec(r, n, 0.5)
        .into_iter()
        .map(f16::from_f32)
        .collect()
}

/// The rows of `which` in `all` match `want`'s, and a row not listed was left alone (NaN).
fn listed_rows_match(all: &[f32], want: &[f64], which: &[i32], row: usize, what: &str) {
    let (mut g, mut w) = (Vec::new(), Vec::new());
    for &i in which {
        let i = i as usize;
        g.extend_from_slice(&all[i * row..(i + 1) * row]);
        w.extend_from_slice(&want[i * row..(i + 1) * row]);
    }
    let err = rel_err(&g, &w);
    assert!(err < 1e-5, "{what}: rel err {err:e}");
    let skipped = (0..all.len() / row)
        .find(|&i| !which.contains(&(i as i32)))
        .unwrap();
    assert!(
        all[skipped * row..(skipped + 1) * row]
            .iter()
            .all(|v| v.is_nan())
    );
}

/// One layer's RoPE settings for the `rope_store` test: (neox, freq_scale, yarn, mscale, with
/// per-pair factors).
type RopeCase = (i32, f32, Option<[f32; 2]>, f32, bool);

/// elementwise.cu's `rope_store`: RoPE (both pair layouts, plain and with frequency factors,
/// linear scaling, YaRN's ramp and magnitude) on Q and K in place, as the engine's
/// `rowops::rope_cache` computes the angles, and K, V stored as f16 in their slots; a token whose
/// slot is -1 (a padding token of a captured step) stores nothing.
#[test]
fn rope_store_rotates_and_stores_and_skips_padding() {
    let mut r = rng(0x5eed_0e0e);
    let (n_heads, n_kv, hd) = (2usize, 1usize, 64usize);
    let (stride, kv_dim, slots_n) = ((n_heads + 2 * n_kv) * hd, n_kv * hd, 8usize);
    let pos = [5i32, 0, 131];
    let slots = [6i32, -1, 2];
    let theta_scale = 10_000f32.powf(-2.0 / hd as f32);
    let factors: Vec<f32> = (0..hd / 2).map(|j| 1.0 + j as f32 * 0.25).collect();
    let cases: [RopeCase; 3] = [
        (0, 1.0, None, 1.0, false),
        (1, 1.0, None, 1.0, false),
        (1, 0.25, Some([3.0, 20.0]), 1.1, true),
    ];
    for (neox, freq_scale, yarn, mscale, with_factors) in cases {
        let qkv = random_vec(&mut r, pos.len() * stride, 0.5);
        let mut job = Job::new();
        let (qb, pb, sb) = (job.floats(&qkv), job.ints(&pos), job.ints(&slots));
        let (kb, vb) = (job.out(slots_n * kv_dim * 2), job.out(slots_n * kv_dim * 2));
        let fb = job.floats(&factors);
        let [low, high] = yarn.unwrap_or([0.0, 0.0]);
        let args = [
            A::P(qb, 0),
            A::I(stride as i32),
            A::P(pb, 0),
            A::P(sb, 0),
            A::P(kb, 0),
            A::P(vb, 0),
            A::I(n_heads as i32),
            A::I(n_kv as i32),
            A::I(hd as i32),
            A::I(hd as i32),
            A::F(theta_scale),
            A::I(neox),
            A::F(freq_scale),
            A::I(i32::from(yarn.is_some())),
            A::F(low),
            A::F(high),
            A::F(mscale),
            if with_factors { A::P(fb, 0) } else { A::Null },
        ];
        job.launch("rope_store", (pos.len() as u32, 1), 256, &args);
        let out = job.run();
        let (got, kc, vc) = (
            out.floats(qb),
            out.bytes(kb).to_vec(),
            out.bytes(vb).to_vec(),
        );
        let mut want: Vec<f64> = qkv.iter().map(|&v| v as f64).collect();
        for (i, &p) in pos.iter().enumerate() {
            // rowops::rope_cache, in f32 as there.
            let mut theta = p as f32;
            let mut cs = vec![(0f64, 0f64); hd / 2];
            for (j, c) in cs.iter_mut().enumerate() {
                let extrap = theta / if with_factors { factors[j] } else { 1.0 };
                let mut t = freq_scale * extrap;
                if let Some([lo, hi]) = yarn {
                    let y = (j as f32 - lo) / (hi - lo).max(0.001);
                    let ramp = 1.0 - y.clamp(0.0, 1.0);
                    t = t * (1.0 - ramp) + extrap * ramp;
                }
                *c = ((t.cos() * mscale) as f64, (t.sin() * mscale) as f64);
                theta *= theta_scale;
            }
            for head in 0..n_heads + n_kv {
                for (j, &(cos, sin)) in cs.iter().enumerate() {
                    let (a, b) = if neox == 1 {
                        (j, j + hd / 2)
                    } else {
                        (2 * j, 2 * j + 1)
                    };
                    let base = i * stride + head * hd;
                    let (x0, x1) = (qkv[base + a] as f64, qkv[base + b] as f64);
                    want[base + a] = x0 * cos - x1 * sin;
                    want[base + b] = x0 * sin + x1 * cos;
                }
            }
        }
        let err = rel_err(&got, &want);
        assert!(
            err < 1e-5,
            "case neox {neox} scale {freq_scale}: rel err {err:e}"
        );
        let f16_at = |c: &[u8], e: usize| f16::from_le_bytes([c[2 * e], c[2 * e + 1]]);
        for (i, &s) in slots.iter().enumerate() {
            if s < 0 {
                continue;
            }
            for e in 0..kv_dim {
                let k = got[i * stride + n_heads * hd + e];
                let v = got[i * stride + n_heads * hd + kv_dim + e];
                assert_eq!(f16_at(&kc, s as usize * kv_dim + e), f16::from_f32(k));
                assert_eq!(f16_at(&vc, s as usize * kv_dim + e), f16::from_f32(v));
            }
        }
        // Only the two real tokens' slots were written.
        let written = (0..slots_n)
            .filter(|&s| (0..kv_dim).any(|e| f16_at(&kc, s * kv_dim + e).to_bits() != 0xffff))
            .count();
        assert_eq!(written, 2, "neox {neox}");
    }
}

/// elementwise.cu's small row kernels against the engine's CPU formulas (`rowops`): QK-norm on
/// the Q and K heads only (a head size that is not a multiple of 32), the embedding scale,
/// soft-capping, GELU gating through f16 (exact past +-10) and gpt-oss's clamped SwiGLU.
#[test]
fn qk_norm_scale_softcap_and_gated_activations() {
    let mut r = rng(0x5eed_0a0a);
    let (n, n_heads, n_kv, hd) = (3usize, 2usize, 1usize, 48usize);
    let stride = (n_heads + 2 * n_kv) * hd;
    let qkv = random_vec(&mut r, n * stride, 1.0);
    let (qw, kw) = (random_vec(&mut r, hd, 1.0), random_vec(&mut r, hd, 1.0));
    let x = random_vec(&mut r, 1000, 20.0);
    let (ffn, rows) = (37usize, 3usize);
    let mut gu = random_vec(&mut r, rows * 2 * ffn, 6.0);
    gu[0] = -11.0;
    gu[1] = 12.5;
    let mut job = Job::new();
    let (qb, qwb, kwb) = (job.floats(&qkv), job.floats(&qw), job.floats(&kw));
    let (sb, cb, gb) = (job.floats(&x), job.floats(&x), job.floats(&gu));
    let (gelu, oai) = (job.out(rows * ffn * 4), job.out(rows * ffn * 4));
    let eps = 1e-6f32;
    let qk = [
        A::P(qb, 0),
        A::I(stride as i32),
        A::I(n_heads as i32),
        A::I(hd as i32),
    ];
    let qk = [&qk[..], &[A::P(qwb, 0), A::P(kwb, 0), A::F(eps)]].concat();
    job.launch("qk_norm", (n as u32, (n_heads + n_kv) as u32), 32, &qk);
    let count = A::L(x.len() as i64);
    job.launch(
        "scale_inplace",
        (4, 1),
        256,
        &[A::P(sb, 0), A::F(0.125), count],
    );
    job.launch(
        "softcap_inplace",
        (4, 1),
        256,
        &[A::P(cb, 0), A::F(30.0), count],
    );
    for (act, o) in [(1, gelu), (2, oai)] {
        let total = A::L((rows * ffn) as i64);
        let args = [A::P(gb, 0), A::P(o, 0), A::I(ffn as i32), total, A::I(act)];
        job.launch("gated_act", (1, 1), 256, &args);
    }
    let out = job.run();
    // QK-norm: Q and K heads normed, V untouched.
    let mut want: Vec<f64> = qkv.iter().map(|&v| v as f64).collect();
    for t in 0..n {
        for h in 0..n_heads + n_kv {
            let w = if h < n_heads { &qw } else { &kw };
            let head = &qkv[t * stride + h * hd..][..hd];
            let ms = head.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / hd as f64;
            let scale = 1.0 / (ms + eps as f64).sqrt();
            for e in 0..hd {
                want[t * stride + h * hd + e] = head[e] as f64 * scale * w[e] as f64;
            }
        }
    }
    assert!(rel_err(&out.floats(qb), &want) < 1e-5, "QK-norm");
    let scaled: Vec<f64> = x.iter().map(|&v| v as f64 * 0.125).collect();
    assert!(rel_err(&out.floats(sb), &scaled) < 1e-7, "scale");
    let capped: Vec<f64> = x.iter().map(|&v| (v as f64 / 30.0).tanh() * 30.0).collect();
    assert!(rel_err(&out.floats(cb), &capped) < 1e-6, "soft-cap");
    let gated = |f: &dyn Fn(f32, f32) -> f32| -> Vec<f64> {
        (0..rows * ffn)
            .map(|i| {
                let (row, c) = (i / ffn, i % ffn);
                f(gu[row * 2 * ffn + c], gu[row * 2 * ffn + ffn + c]) as f64
            })
            .collect()
    };
    let gelu_ref = gated(&|g, u| {
        let a = if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g
        } else {
            let x = f16::from_f32(g).to_f32();
            let y = 0.5 * x * (1.0 + (0.797_884_6 * x * (1.0 + 0.044_715 * x * x)).tanh());
            f16::from_f32(y).to_f32()
        };
        a * u
    });
    assert!(rel_err(&out.floats(gelu), &gelu_ref) < 1e-5, "GELU gating");
    let oai_ref = gated(&|g, u| {
        let (x, y) = (g.min(7.0), u.clamp(-7.0, 7.0));
        x / (1.0 + (1.702 * -x).exp()) * (y + 1.0)
    });
    assert!(rel_err(&out.floats(oai), &oai_ref) < 1e-5, "clamped SwiGLU");
}

/// elementwise.cu's `gather_rows` and `scatter_add_rows`: one expert's tokens gathered, and its
/// outputs added back to their tokens with their weights (other tokens untouched).
#[test]
fn gather_and_weighted_scatter_of_expert_rows() {
    let mut r = rng(0x5eed_0e1e);
    let (n, k, width) = (6usize, 40usize, 24usize);
    let x = random_vec(&mut r, n * k, 1.0);
    let base = random_vec(&mut r, n * width, 1.0);
    let idx = [4i32, 0, 5];
    let w = [0.5f32, -1.25, 2.0];
    let y = random_vec(&mut r, idx.len() * width, 1.0);
    let mut job = Job::new();
    let (xb, ib, wb, yb) = (
        job.floats(&x),
        job.ints(&idx),
        job.floats(&w),
        job.floats(&y),
    );
    let (gb, ob) = (job.out(idx.len() * k * 4), job.floats(&base));
    let (kk, wd, c) = (A::I(k as i32), A::I(width as i32), A::I(idx.len() as i32));
    job.launch(
        "gather_rows",
        (2, 1),
        256,
        &[A::P(xb, 0), A::P(ib, 0), A::P(gb, 0), kk, c],
    );
    let args = [A::P(ob, 0), A::P(ib, 0), A::P(wb, 0), A::P(yb, 0), wd, c];
    job.launch("scatter_add_rows", (2, 1), 256, &args);
    let out = job.run();
    let want_g: Vec<f32> = idx
        .iter()
        .flat_map(|&t| x[t as usize * k..(t as usize + 1) * k].to_vec())
        .collect();
    assert_eq!(out.floats(gb), want_g);
    let mut want = base.clone();
    for (i, &t) in idx.iter().enumerate() {
        for e in 0..width {
            want[t as usize * width + e] += w[i] * y[i * width + e];
        }
    }
    assert_eq!(out.floats(ob), want);
}
