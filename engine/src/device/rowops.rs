//! Small per-row operations of the forward pass: RMSNorm, rotary embeddings, SwiGLU, residual add.
//! Each row is computed on its own, so results never depend on what else is in the batch.

use crate::model::config::RopeStyle;

/// `out = x / rms(x) * w` for each row of `x`, as ggml computes it (sum of squares in f64).
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

/// Cos and sin of each rotary pair for one position, computed the way ggml does (theta kept in
/// f32 and multiplied by the scale step by step), so positions rotate exactly as in llama.cpp.
pub fn rope_cache(pos: usize, rope_dim: usize, theta_base: f32, cos: &mut [f32], sin: &mut [f32]) {
    let theta_scale = theta_base.powf(-2.0 / rope_dim as f32);
    let mut theta = pos as f32;
    for i in 0..rope_dim / 2 {
        cos[i] = theta.cos();
        sin[i] = theta.sin();
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

/// `out = silu(gate) * up`, where each row of `gu` is `[gate (ffn) | up (ffn)]`.
pub fn swiglu(gu: &[f32], ffn: usize, out: &mut [f32]) {
    for (row, o) in gu.chunks_exact(2 * ffn).zip(out.chunks_exact_mut(ffn)) {
        let (g, u) = row.split_at(ffn);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
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

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let (mut c, mut s) = (vec![0f32; 4], vec![0f32; 4]);
        rope_cache(0, 8, 10000.0, &mut c, &mut s);
        let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut v = orig.clone();
        rope(&mut v, 8, RopeStyle::Interleaved, &c, &s);
        assert_eq!(v, orig);
        rope_cache(37, 8, 10000.0, &mut c, &mut s);
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let mut v = orig.clone();
            rope(&mut v, 8, style, &c, &s);
            let n0: f32 = orig.iter().map(|x| x * x).sum();
            let n1: f32 = v.iter().map(|x| x * x).sum();
            assert!((n0 - n1).abs() < 1e-3, "{n0} vs {n1}");
            assert_ne!(v, orig);
        }
    }
}
