//! Small per-row operations of the forward pass: RMSNorm, rotary embeddings (with ggml's
//! scaling: linear, YaRN, frequency factors), SwiGLU, GeGLU and OpenAI's clamped SwiGLU,
//! soft-capping, residual add; and the host's FFN buffers' rule ([`FFN_ROWS`], [`sized`]).
//! Each row is computed on its own, so results never depend on what else is in the batch.

use half::f16;
use tpslab_kernels::ThreadPool;
use tpslab_kernels::glu;

use crate::model::config::RopeStyle;
use crate::model::ops::{Activation, Rope};

/// `out = x / rms(x) * w` for each row of `x`, as ggml computes it (sum of squares in f64).
/// Most tokens whose FFN intermediates (a dense FFN's, or a group of experts') the host holds at
/// once.
pub const FFN_ROWS: usize = 128;

/// `v`'s first `n` floats, grown to hold them.
pub fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * g;
        }
    }
}

/// `x / rms(x) * w` in place, row by row.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for xr in x.chunks_exact_mut(n) {
        let sum: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = (*v * scale) * g;
        }
    }
}

/// Cos and sin of each rotary pair for one position, computed the way ggml's `rope_cache_init`
/// and `rope_yarn` do (theta kept in f32 and multiplied by the scale step by step, divided by
/// the pair's frequency factor, scaled, ramped for YaRN), so positions rotate exactly as in
/// llama.cpp.
pub fn rope_cache(
    pos: usize,
    rope: &Rope,
    factors: Option<&[f32]>,
    cos: &mut [f32],
    sin: &mut [f32],
) {
    let theta_scale = rope.theta.powf(-2.0 / rope.dim as f32);
    let mut theta = pos as f32;
    for i in 0..rope.dim / 2 {
        let ff = factors.map_or(1.0, |f| f[i]);
        let extrap = theta / ff;
        let mut t = rope.freq_scale * extrap;
        if let Some([low, high]) = rope.yarn {
            let y = (i as f32 - low) / (high - low).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            t = t * (1.0 - ramp) + extrap * ramp;
        }
        cos[i] = t.cos() * rope.mscale;
        sin[i] = t.sin() * rope.mscale;
        theta *= theta_scale;
    }
}

/// Rotates every head of one token's vector `v` (`n_heads * head_dim`) in place.
pub fn rope(v: &mut [f32], head_dim: usize, style: RopeStyle, cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for head in v.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = match style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

/// `out[t] = act(gate[t]) * up[t]` for rows of `gate_up` holding `ffn` gate floats then `ffn`
/// up floats, split over `pool` (`tpslab_kernels::glu`; every output depends on its own two
/// inputs only).
pub fn gated(pool: &ThreadPool, act: Activation, gate_up: &[f32], ffn: usize, out: &mut [f32]) {
    match act {
        Activation::Silu => glu::gated_rows(pool, gate_up, ffn, out, &swiglu),
        Activation::GeluTanh => glu::gated_rows(pool, gate_up, ffn, out, &geglu),
        Activation::SwigluOai => glu::gated_rows(pool, gate_up, ffn, out, &swiglu_oai),
    }
}

/// `o = silu(g) * u`, `silu(x) = x / (1 + exp(-x))`.
fn swiglu(g: &[f32], u: &[f32], o: &mut [f32]) {
    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// `o = swiglu_oai(g, u)` as ggml's CPU `swiglu_oai` computes it with gpt-oss's constants: the
/// gate clamped from above, the up from both sides, `g / (1 + exp(-alpha g)) * (u + 1)`.
fn swiglu_oai(g: &[f32], u: &[f32], o: &mut [f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
        let x = g.min(LIMIT);
        let y = u.clamp(-LIMIT, LIMIT);
        *o = x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0);
    }
}

/// `o = gelu_tanh(g) * u` as ggml's CPU `geglu` computes it: GELU of the gate rounded to f16,
/// looked up as an f16 (its table), 0 below -10 and the identity above 10.
fn geglu(g: &[f32], u: &[f32], o: &mut [f32]) {
    const A: f32 = 0.044_715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let gelu = |x: f32| 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + A * x * x)).tanh());
    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
        let a = if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g
        } else {
            f16::from_f32(gelu(f16::from_f32(g).to_f32())).to_f32()
        };
        *o = a * u;
    }
}

/// `x = tanh(x / cap) * cap`, as ggml writes it (scale, tanh, scale).
pub fn softcap(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    x.iter_mut().for_each(|v| *v = (*v * inv).tanh() * cap);
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_row_is_weight() {
        let x = [2.0f32; 8];
        let w = [0.5f32; 8];
        let mut out = [0f32; 8];
        rms_norm(&x, &w, 0.0, &mut out);
        assert!(out.iter().all(|&v| (v - 0.5).abs() < 1e-6), "{out:?}");
    }

    fn plain(dim: usize) -> Rope {
        Rope {
            dim,
            theta: 10000.0,
            style: RopeStyle::Interleaved,
            freq_scale: 1.0,
            yarn: None,
            mscale: 1.0,
        }
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let (mut c, mut s) = (vec![0f32; 4], vec![0f32; 4]);
        rope_cache(0, &plain(8), None, &mut c, &mut s);
        let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut v = orig.clone();
        rope(&mut v, 8, RopeStyle::Interleaved, &c, &s);
        assert_eq!(v, orig);
        rope_cache(37, &plain(8), None, &mut c, &mut s);
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let mut v = orig.clone();
            rope(&mut v, 8, style, &c, &s);
            let n0: f32 = orig.iter().map(|x| x * x).sum();
            let n1: f32 = v.iter().map(|x| x * x).sum();
            assert!((n0 - n1).abs() < 1e-3, "{n0} vs {n1}");
            assert_ne!(v, orig);
        }
    }

    /// Linear scaling by 4 is position / 4; frequency factors divide each pair's frequency; a
    /// YaRN ramp keeps the fast pairs unscaled and interpolates the slow ones.
    #[test]
    fn scaled_rope_matches_its_definition() {
        let (mut c, mut s) = (vec![0f32; 4], vec![0f32; 4]);
        let (mut c0, mut s0) = (vec![0f32; 4], vec![0f32; 4]);
        let linear = Rope {
            freq_scale: 0.25,
            ..plain(8)
        };
        rope_cache(40, &linear, None, &mut c, &mut s);
        rope_cache(10, &plain(8), None, &mut c0, &mut s0);
        for i in 0..4 {
            assert!((c[i] - c0[i]).abs() < 1e-5 && (s[i] - s0[i]).abs() < 1e-5);
        }
        rope_cache(40, &plain(8), Some(&[4.0; 4]), &mut c, &mut s);
        for i in 0..4 {
            assert!((c[i] - c0[i]).abs() < 1e-5 && (s[i] - s0[i]).abs() < 1e-5);
        }
        let yarn = Rope {
            freq_scale: 0.25,
            yarn: Some([1.0, 2.0]),
            ..plain(8)
        };
        rope_cache(40, &yarn, None, &mut c, &mut s);
        rope_cache(40, &plain(8), None, &mut c0, &mut s0);
        // Pairs 0 and 1 are at or below `low`: extrapolated (unscaled).
        assert!((c[0] - c0[0]).abs() < 1e-5 && (c[1] - c0[1]).abs() < 1e-5);
        // Pair 3 is past `high`: interpolated (position / 4).
        let (mut c10, mut s10) = (vec![0f32; 4], vec![0f32; 4]);
        rope_cache(10, &plain(8), None, &mut c10, &mut s10);
        assert!((c[3] - c10[3]).abs() < 1e-5);
    }

    /// The gate is clamped at 7 from above only, the up at +-7, and the output is
    /// `g * sigmoid(1.702 g) * (u + 1)`.
    #[test]
    fn swiglu_oai_clamps_as_gpt_oss() {
        let gu = [9.0f32, -9.0, 0.5, 0.0, 20.0, -20.0, 2.0, 3.0];
        let mut out = [0f32; 4];
        swiglu_oai(&gu[..4], &gu[4..], &mut out);
        let f = |g: f32, u: f32| g / (1.0 + (-1.702 * g).exp()) * (u + 1.0);
        assert_eq!(out[0], f(7.0, 7.0));
        assert_eq!(out[1], f(-9.0, -7.0));
        assert_eq!(out[2], f(0.5, 2.0));
        assert_eq!(out[3], 0.0);
        // -9 is not clamped: sigmoid(-15.3) is tiny but not 0, and (u + 1) = -6 flips its sign.
        assert!(out[1] > 0.0 && out[1] < 1e-4, "{}", out[1]);
    }

    #[test]
    fn geglu_and_softcap_follow_ggml() {
        let gu = [-11.0f32, 0.5, 12.0, 2.0, 3.0, 5.0];
        let mut out = [0f32; 3];
        geglu(&gu[..3], &gu[3..], &mut out);
        assert_eq!(out[0], 0.0);
        assert_eq!(out[2], 12.0 * 5.0);
        // gelu(0.5) = 0.345714..., through f16.
        assert!((out[1] / 3.0 - 0.345_714).abs() < 1e-3, "{}", out[1]);
        let mut x = [0.0f32, 30.0, -1e6];
        softcap(&mut x, 30.0);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 30.0 * 1f32.tanh()).abs() < 1e-4);
        assert!((x[2] + 30.0).abs() < 1e-4);
    }
}
