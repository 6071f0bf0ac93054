//! Mixture-of-experts on the CPU: the router (softmax, top-k, renormalization, as llama.cpp's
//! `build_moe_ffn` does each) and the grouped expert FFN, which gathers the step's tokens by the
//! expert they chose so each expert's weights are read once per step however many tokens chose
//! it, then sums each token's experts in its own routing order.
//!
//! Batch invariance: a token's routes depend on its own router logits only, every expert's
//! product rows are bit-identical whatever the rows beside them (the matmul's promise), and each
//! token's weighted sum runs in its own rank order, so a token's output never depends on its
//! batch mates.

/// How router logits become expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over every expert, then the top-k probabilities (Mixtral, Qwen3-MoE).
    Softmax,
    /// The top-k logits, then a softmax over those k (gpt-oss).
    SoftmaxWeight,
}

/// A family's routing rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Router {
    /// Experts per token (top-k).
    pub n_used: usize,
    pub gating: Gating,
    /// Divide the chosen weights by their sum (llama.cpp's `norm_w`).
    pub norm: bool,
    /// A factor on the weights (`expert_weights_scale`; 0 or 1 is none).
    pub scale: f32,
}

/// One expert chosen for one token, with its weight.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Route {
    pub expert: u32,
    pub weight: f32,
}

/// ggml's `soft_max` of one row in place: the exponentials summed in f64, scaled by its inverse.
fn softmax(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut sum = 0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// The routes of one token from its router logits (`n_expert` floats): `out` holds
/// `r.n_used` routes, best first. Ties go to the lower expert index. `probs` is scratch.
///
/// # Panics
/// If `out` is not `r.n_used` long or `r.n_used` is past the number of experts (the model's
/// configuration checks both when it loads).
pub fn route(logits: &[f32], r: &Router, probs: &mut Vec<f32>, out: &mut [Route]) {
    assert!(r.n_used <= logits.len() && out.len() == r.n_used);
    probs.clear();
    probs.extend_from_slice(logits);
    if r.gating == Gating::Softmax {
        softmax(probs);
    }
    // Top-k by a partial selection: k is small (2..8), n_expert up to a few hundred.
    for slot in 0..out.len() {
        let mut best: Option<usize> = None;
        for (e, &p) in probs.iter().enumerate() {
            if p.is_nan() || out[..slot].iter().any(|c| c.expert as usize == e) {
                continue;
            }
            if best.is_none_or(|b| p > probs[b]) {
                best = Some(e);
            }
        }
        // Only NaN left (a broken model): the lowest expert not chosen yet.
        let e = best.unwrap_or_else(|| {
            (0..probs.len())
                .find(|&e| out[..slot].iter().all(|c| c.expert as usize != e))
                .unwrap_or(0)
        });
        out[slot] = Route {
            expert: e as u32,
            weight: probs[e],
        };
    }
    if r.gating == Gating::SoftmaxWeight {
        let mut w: Vec<f32> = out.iter().map(|o| o.weight).collect();
        softmax(&mut w);
        out.iter_mut().zip(w).for_each(|(o, w)| o.weight = w);
    }
    if r.norm {
        let sum = out.iter().map(|o| f64::from(o.weight)).sum::<f64>() as f32;
        let sum = sum.max(6.103_515_6e-5);
        out.iter_mut().for_each(|o| o.weight /= sum);
    }
    if r.scale != 0.0 && r.scale != 1.0 {
        out.iter_mut().for_each(|o| o.weight *= r.scale);
    }
}

/// Reusable buffers of [`moe_ffn`].
#[derive(Default)]
pub struct MoeScratch {
    /// Every (token, rank) slot, grouped by expert (each expert's in token order).
    slots: Vec<usize>,
    xs: Vec<f32>,
    ys: Vec<f32>,
    /// Every (token, rank) expert output, `width` floats each.
    outs: Vec<f32>,
}

impl MoeScratch {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<usize>()
            + (self.xs.capacity() + self.ys.capacity() + self.outs.capacity()) * 4
    }
}

fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// The grouped expert FFN of `m` tokens: `x` holds `m` rows of `k` floats, `routes` the
/// `m * n_used` routes (token-major, best first), `out` receives `m` rows of `width` floats,
/// each the weighted sum of its experts' outputs in rank order. `expert(e, xs, rows, ys)` runs
/// expert `e` on `rows` gathered rows `xs` into `ys` (`rows * width` floats); it is called once
/// per expert that any token chose, in expert order. Returns the experts run.
///
/// # Panics
/// If the slices do not match the sizes given, or a route names an expert past `n_expert`.
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn(
    x: &[f32],
    k: usize,
    routes: &[Route],
    n_used: usize,
    n_expert: usize,
    width: usize,
    out: &mut [f32],
    s: &mut MoeScratch,
    mut expert: impl FnMut(usize, &[f32], usize, &mut [f32]),
) -> Vec<u32> {
    let m = x.len() / k.max(1);
    assert!(x.len() == m * k && routes.len() == m * n_used && out.len() == m * width);
    assert!(routes.iter().all(|r| (r.expert as usize) < n_expert));
    // Slots by expert: one pass counts each expert's slots, a second places them (in token
    // order within an expert), so grouping costs one pass over the routes, not one per expert.
    let mut starts = vec![0usize; n_expert + 1];
    routes
        .iter()
        .for_each(|r| starts[r.expert as usize + 1] += 1);
    for e in 0..n_expert {
        starts[e + 1] += starts[e];
    }
    let mut fill = starts.clone();
    s.slots.clear();
    s.slots.resize(routes.len(), 0);
    for (i, r) in routes.iter().enumerate() {
        let e = r.expert as usize;
        s.slots[fill[e]] = i;
        fill[e] += 1;
    }
    let outs = sized(&mut s.outs, routes.len() * width);
    let mut used = Vec::new();
    for e in (0..n_expert).filter(|&e| starts[e + 1] > starts[e]) {
        used.push(e as u32);
        let slots = &s.slots[starts[e]..starts[e + 1]];
        let rows = slots.len();
        let xs = sized(&mut s.xs, rows * k);
        for (j, &slot) in slots.iter().enumerate() {
            let t = slot / n_used;
            xs[j * k..(j + 1) * k].copy_from_slice(&x[t * k..(t + 1) * k]);
        }
        let ys = sized(&mut s.ys, rows * width);
        expert(e, xs, rows, ys);
        for (j, &slot) in slots.iter().enumerate() {
            outs[slot * width..(slot + 1) * width].copy_from_slice(&ys[j * width..(j + 1) * width]);
        }
    }
    combine(outs, routes, n_used, width, out);
    used
}

/// `out[t] = sum_r weight[t][r] * outs[t][r]`, the products rounded and added in rank order as
/// ggml does (`mul` by the weights, then `add` of the rank views one after another).
fn combine(outs: &[f32], routes: &[Route], n_used: usize, width: usize, out: &mut [f32]) {
    for (t, o) in out.chunks_exact_mut(width).enumerate() {
        for r in 0..n_used {
            let slot = t * n_used + r;
            let (w, y) = (routes[slot].weight, &outs[slot * width..(slot + 1) * width]);
            if r == 0 {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o = y * w);
            } else {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o += y * w);
            }
        }
    }
}

/// The plain reference of [`moe_ffn`]: every token alone, each of its experts run on its one
/// row, in rank order. What the grouped kernel is tested against.
pub fn reference_moe_ffn(
    x: &[f32],
    k: usize,
    routes: &[Route],
    n_used: usize,
    width: usize,
    out: &mut [f32],
    mut expert: impl FnMut(usize, &[f32], usize, &mut [f32]),
) {
    let mut outs = vec![0f32; routes.len() * width];
    for (slot, r) in routes.iter().enumerate() {
        let t = slot / n_used;
        expert(
            r.expert as usize,
            &x[t * k..(t + 1) * k],
            1,
            &mut outs[slot * width..(slot + 1) * width],
        );
    }
    combine(&outs, routes, n_used, width, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{QMatrix, ThreadPool, WType, matmul, quantize::quantize};

    fn floats(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8) as f32 / (1 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Experts of one type as (gate rows, down rows) byte matrices: k -> f -> width.
    fn experts(ty: WType, n: usize, k: usize, f: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..n)
            .map(|e| {
                let g = quantize(ty, &floats(f * k, 10 + e as u32));
                let d = quantize(ty, &floats(k * f, 100 + e as u32));
                (g, d)
            })
            .collect()
    }

    /// The grouped kernel against the per-token reference, with the real matmul (F32 and Q8_0
    /// weights): bit-identical, since every expert's product row depends on its own row only
    /// and each token sums its experts in rank order in both. And every token's output is the
    /// same bits alone as in the batch (batch invariance).
    #[test]
    fn grouped_experts_match_the_per_token_reference_bit_for_bit() {
        let pool = ThreadPool::new(2);
        let (k, f, ne, used, m) = (64, 32, 6, 2, 9);
        for ty in [WType::F32, WType::Q8_0] {
            let ex = experts(ty, ne, k, f);
            let run = |e: usize, xs: &[f32], rows: usize, ys: &mut [f32]| {
                let g = QMatrix {
                    ty,
                    n: f,
                    k,
                    data: &ex[e].0,
                    layout: crate::Layout::Ggml,
                };
                let d = QMatrix {
                    ty,
                    n: k,
                    k: f,
                    data: &ex[e].1,
                    layout: crate::Layout::Ggml,
                };
                let mut h = vec![0f32; rows * f];
                matmul(&pool, &g, xs, rows, &mut h);
                h.iter_mut().for_each(|v| *v = v.max(0.0));
                matmul(&pool, &d, &h, rows, ys);
            };
            let x = floats(m * k, 7);
            let rule = Router {
                n_used: used,
                gating: Gating::Softmax,
                norm: true,
                scale: 0.0,
            };
            let logits = floats(m * ne, 3);
            let mut routes = vec![Route::default(); m * used];
            for (l, r) in logits.chunks(ne).zip(routes.chunks_mut(used)) {
                route(l, &rule, &mut Vec::new(), r);
            }
            let (mut got, mut want) = (vec![0f32; m * k], vec![0f32; m * k]);
            let mut s = MoeScratch::default();
            let ran = moe_ffn(&x, k, &routes, used, ne, k, &mut got, &mut s, run);
            assert!(ran.windows(2).all(|w| w[0] < w[1]) && ran.len() <= ne);
            reference_moe_ffn(&x, k, &routes, used, k, &mut want, run);
            assert_eq!(got, want, "{ty}");
            for t in 0..m {
                let mut alone = vec![0f32; k];
                let r = &routes[t * used..(t + 1) * used];
                moe_ffn(
                    &x[t * k..(t + 1) * k],
                    k,
                    r,
                    used,
                    ne,
                    k,
                    &mut alone,
                    &mut s,
                    run,
                );
                assert_eq!(alone, got[t * k..(t + 1) * k], "{ty} token {t}");
            }
        }
    }

    #[test]
    fn softmax_routing_picks_the_largest_and_renormalizes() {
        let r = Router {
            n_used: 2,
            gating: Gating::Softmax,
            norm: true,
            scale: 0.0,
        };
        let mut out = [Route::default(); 2];
        route(&[0.1, 2.0, -1.0, 1.0], &r, &mut Vec::new(), &mut out);
        assert_eq!((out[0].expert, out[1].expert), (1, 3));
        let want = 1.0 / (1.0 + (-1.0f32).exp());
        assert!((out[0].weight - want).abs() < 1e-6, "{out:?}");
        assert!((out[0].weight + out[1].weight - 1.0).abs() < 1e-6);
    }

    #[test]
    fn softmax_weight_routing_softmaxes_the_chosen_logits() {
        let r = Router {
            n_used: 2,
            gating: Gating::SoftmaxWeight,
            norm: false,
            scale: 0.0,
        };
        let mut out = [Route::default(); 2];
        route(&[3.0, 0.0, 3.0, 1.0], &r, &mut Vec::new(), &mut out);
        // A tie goes to the lower index; two equal logits share the weight.
        assert_eq!((out[0].expert, out[1].expert), (0, 2));
        assert_eq!((out[0].weight, out[1].weight), (0.5, 0.5));
    }

    #[test]
    fn nan_logits_still_route_to_distinct_experts() {
        let r = Router {
            n_used: 3,
            gating: Gating::Softmax,
            norm: true,
            scale: 0.0,
        };
        let mut out = [Route::default(); 3];
        route(&[f32::NAN; 4], &r, &mut Vec::new(), &mut out);
        let mut e: Vec<u32> = out.iter().map(|o| o.expert).collect();
        e.sort_unstable();
        e.dedup();
        assert_eq!(e.len(), 3);
    }
}
