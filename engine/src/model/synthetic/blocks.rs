//! The random bytes of a synthetic model: every weight type's blocks filled in place, chunk by
//! chunk and in parallel, from a generator seeded per chunk (so the bytes depend on the seed
//! only), with scales chosen so every type decodes to noise of the same spread.

use std::sync::OnceLock;

use tpslab_kernels::WType;

/// Spread of the random weights: uniform on [-A, A] has a standard deviation of 0.02, the usual
/// initializer scale, so activations stay finite through every layer.
const A: f32 = 0.02 * 1.732_050_8;

/// Bytes of blocks per generator chunk (rounded down to whole blocks): the unit of parallel work.
const CHUNK_BYTES: usize = 256 << 10;

/// splitmix64's finalizer: a strong 64-bit mix, used to derive seeds.
pub(super) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `n` floats uniform on [-A, A] as F32 bytes, fixed by `seed` (the router of a synthetic
/// mixture of experts: small, so kept in F32 as in real files).
pub(super) fn f32_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..n).flat_map(|_| rng.uniform().to_le_bytes()).collect()
}

/// splitmix64: one add and a mix per 64 random bits; plenty for noise weights.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0, 0)
    }

    /// Uniform on [-A, A].
    pub(super) fn uniform(&mut self) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * A
    }

    /// Fills `out` with random bytes, eight per draw.
    fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let n = rest.len();
            rest.copy_from_slice(&self.next().to_le_bytes()[..n]);
        }
    }
}

/// Fills `data` (whole blocks of `ty`) chunk by chunk on `threads` threads.
pub(super) fn fill_blocks(ty: WType, data: &mut [u8], seed: u64, threads: usize) {
    let ts = ty.type_size();
    let chunk = (CHUNK_BYTES / ts).max(1) * ts;
    let mut chunks: Vec<(usize, &mut [u8])> = data.chunks_mut(chunk).enumerate().collect();
    let per = chunks.len().div_ceil(threads.max(1)).max(1);
    let work = |part: &mut [(usize, &mut [u8])]| {
        for (i, c) in part.iter_mut() {
            fill_chunk(ty, c, &mut Rng::new(mix(seed, *i as u64)));
        }
    };
    if chunks.len() <= per {
        work(&mut chunks);
        return;
    }
    std::thread::scope(|s| {
        for part in chunks.chunks_mut(per) {
            s.spawn(move || work(part));
        }
    });
}

fn f16_bits(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// 16 block scales from `base` to 15% below it, picked by 4 random bits: blocks differ a little,
/// as real ones do.
fn scale_table(base: f32) -> [[u8; 2]; 16] {
    std::array::from_fn(|j| f16_bits(base * (1.0 - 0.15 * j as f32 / 15.0)))
}

/// Every 16-bit pattern's value on a uniform grid over [-A, A], as F16 and as BF16 bits: one
/// table lookup per element.
fn half_table(ty: WType) -> &'static [u16] {
    static F16: OnceLock<Vec<u16>> = OnceLock::new();
    static BF16: OnceLock<Vec<u16>> = OnceLock::new();
    let grid = |i: usize| -A + (i as f32 + 0.5) * (2.0 * A / 65536.0);
    match ty {
        WType::BF16 => BF16.get_or_init(|| {
            (0..1 << 16)
                .map(|i| half::bf16::from_f32(grid(i)).to_bits())
                .collect()
        }),
        _ => F16.get_or_init(|| {
            (0..1 << 16)
                .map(|i| half::f16::from_f32(grid(i)).to_bits())
                .collect()
        }),
    }
}

/// Fills `out` (whole blocks of `ty`) with random weights of spread about [-A, A].
fn fill_chunk(ty: WType, out: &mut [u8], rng: &mut Rng) {
    match ty {
        WType::F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.uniform().to_le_bytes());
            }
        }
        WType::F16 | WType::BF16 => {
            let table = half_table(ty);
            for c in out.chunks_mut(8) {
                let r = rng.next();
                for (j, e) in c.chunks_exact_mut(2).enumerate() {
                    let v = table[(r >> (16 * j)) as usize & 0xffff];
                    e.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        // d * q, q in [-127, 127].
        WType::Q8_0 => {
            let d = scale_table(A / 127.0);
            for b in out.chunks_exact_mut(34) {
                b[..2].copy_from_slice(&d[rng.next() as usize & 15]);
                rng.fill(&mut b[2..]);
                for q in &mut b[2..] {
                    // -128 has no positive twin; ggml's quantizer never writes it.
                    if *q == 0x80 {
                        *q = 0x81;
                    }
                }
            }
        }
        // d * (q - 8), q in 0..16; d of either sign (as ggml's quantizer writes it), so the
        // values are centred.
        WType::Q4_0 => {
            let d = scale_table(A / 8.0);
            for b in out.chunks_exact_mut(18) {
                let r = rng.next();
                b[..2].copy_from_slice(&d[r as usize & 15]);
                b[1] |= (r as u8) & 0x80;
                rng.fill(&mut b[2..]);
            }
        }
        // d * q + m, q in 0..16, centred: m = -7.5 d.
        WType::Q4_1 => {
            let base = 2.0 * A / 15.0;
            let d = scale_table(base);
            let m: [[u8; 2]; 16] =
                std::array::from_fn(|j| f16_bits(-7.5 * base * (1.0 - 0.15 * j as f32 / 15.0)));
            for b in out.chunks_exact_mut(20) {
                let j = rng.next() as usize & 15;
                b[..2].copy_from_slice(&d[j]);
                b[2..4].copy_from_slice(&m[j]);
                rng.fill(&mut b[4..]);
            }
        }
        WType::Q4K => fill_q45k(out, rng, 144, 15.0),
        WType::Q5K => fill_q45k(out, rng, 176, 31.0),
        WType::Q6K => fill_q6k(out, rng),
        WType::Q5_0 | WType::Q5_1 | WType::IQ4NL => fill_32(ty, out, rng),
        WType::Q2K | WType::Q3K | WType::IQ4XS => fill_lowbit_k(ty, out, rng),
        // x = 2^(e - 128) * grid[q]: random indices (the grid's spread is 5.85) at e = 119 or
        // 120 (2^-9 or 2^-8): a spread near 0.018, |x| up to 0.047.
        WType::MXFP4 => {
            for b in out.chunks_exact_mut(17) {
                rng.fill(b);
                b[0] = 119 + (b[0] & 1);
            }
        }
    }
}

/// ggml `block_q5_0` (x = d * (q - 16)), `block_q5_1` (x = d * q + m, m = -15.5 d) and
/// `block_iq4_nl` (x = d * grid[q]): random levels, d of either sign where the type allows,
/// putting x in about [-A, A].
fn fill_32(ty: WType, out: &mut [u8], rng: &mut Rng) {
    let ts = ty.type_size();
    let base = match ty {
        WType::Q5_0 => A / 16.0,
        WType::Q5_1 => 2.0 * A / 31.0,
        _ => A / 127.0,
    };
    let d = scale_table(base);
    let m: [[u8; 2]; 16] =
        std::array::from_fn(|j| f16_bits(-15.5 * base * (1.0 - 0.15 * j as f32 / 15.0)));
    for b in out.chunks_exact_mut(ts) {
        rng.fill(b);
        let r = rng.next();
        let j = r as usize & 15;
        b[..2].copy_from_slice(&d[j]);
        if ty == WType::Q5_1 {
            b[2..4].copy_from_slice(&m[j]);
        } else {
            b[1] |= (r >> 8) as u8 & 0x80;
        }
    }
}

/// A random scale magnitude in `lo..lo + 8` or `lo..lo + 16` with a random sign, as a 6-bit
/// field offset by 32.
fn signed6(r: u8, lo: u8, span: u8) -> u8 {
    let mag = lo + (r & (span - 1));
    if r & 0x80 != 0 {
        32 - mag
    } else {
        32 + mag.min(31)
    }
}

/// ggml `block_q2_K` (x = d * sc * q - dmin * m, with m = sc and dmin = 1.5 d so each
/// sub-block is centred), `block_q3_K` (x = d * s * q, q in -4..=3, |s| in 16..32 of either
/// sign) and `block_iq4_xs` (x = d * s * grid[q], |s| in 24..32 of either sign): random levels,
/// x in about [-A, A].
fn fill_lowbit_k(ty: WType, out: &mut [u8], rng: &mut Rng) {
    let ts = ty.type_size();
    for b in out.chunks_exact_mut(ts) {
        rng.fill(b);
        let mut raw = [0u8; 16];
        rng.fill(&mut raw);
        match ty {
            WType::Q2K => {
                for (s, r) in b[..16].iter_mut().zip(raw) {
                    let sc = 8 + (r & 7);
                    *s = sc | (sc << 4);
                }
                b[80..82].copy_from_slice(&f16_bits(A / 22.5));
                b[82..84].copy_from_slice(&f16_bits(1.5 * A / 22.5));
            }
            WType::Q3K => {
                let sc = &mut b[96..108];
                sc.fill(0);
                for (j, &r) in raw.iter().enumerate() {
                    let v = signed6(r, 16, 16);
                    if j < 8 {
                        sc[j] = v & 0xf;
                    } else {
                        sc[j - 8] |= (v & 0xf) << 4;
                    }
                    sc[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
                }
                b[108..110].copy_from_slice(&f16_bits(A / 124.0));
            }
            _ => {
                let mut sh = 0u16;
                for (ib, &r) in raw.iter().take(8).enumerate() {
                    let v = signed6(r, 24, 8);
                    if ib % 2 == 0 {
                        b[4 + ib / 2] = v & 0xf;
                    } else {
                        b[4 + ib / 2] |= (v & 0xf) << 4;
                    }
                    sh |= ((v >> 4) as u16) << (2 * ib);
                }
                b[2..4].copy_from_slice(&sh.to_le_bytes());
                b[..2].copy_from_slice(&f16_bits(A / (31.0 * 127.0)));
            }
        }
    }
}

/// ggml `block_q4_K` / `block_q5_K` (`ts` bytes, levels 0..=`qmax`): x = d * sc * q - dmin * m
/// per 32-element sub-block, with 6-bit sc and m in 40..56 packed as `get_scale_min_k4` reads
/// them; d and dmin put x in about [-A, A]; the level bits (Q5_K's qh too) are random.
fn fill_q45k(out: &mut [u8], rng: &mut Rng, ts: usize, qmax: f32) {
    let d = f16_bits(2.0 * A / (qmax * 48.0));
    let dmin = f16_bits(A / 48.0);
    for b in out.chunks_exact_mut(ts) {
        b[..2].copy_from_slice(&d);
        b[2..4].copy_from_slice(&dmin);
        let mut raw = [0u8; 16];
        rng.fill(&mut raw);
        let (sc, m): ([u8; 8], [u8; 8]) = (
            std::array::from_fn(|j| 40 + (raw[j] & 15)),
            std::array::from_fn(|j| 40 + (raw[8 + j] & 15)),
        );
        let q = &mut b[4..16];
        for j in 0..4 {
            q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            q[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
        }
        rng.fill(&mut b[16..]);
    }
}

/// ggml `block_q6_K`: x = d * sc * (q - 32), q 6 bits from 128 bytes of low nibbles and 64 of
/// high pairs, sc an i8 per 16 elements (96..128, either sign); d puts x in about [-A, A].
fn fill_q6k(out: &mut [u8], rng: &mut Rng) {
    let d = f16_bits(A / (32.0 * 112.0));
    for b in out.chunks_exact_mut(210) {
        rng.fill(&mut b[..208]);
        for s in &mut b[192..208] {
            let mag = 96 + (*s & 31) as i8;
            *s = if *s & 0x80 != 0 { -mag } else { mag } as u8;
        }
        b[208..].copy_from_slice(&d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every precision's bytes decode to finite values centred on 0 with a spread near 0.02.
    #[test]
    fn blocks_decode_to_small_centred_values() {
        for ty in WType::ALL {
            let k = 4096;
            let mut data = vec![0u8; 16 * ty.row_bytes(k)];
            fill_blocks(ty, &mut data, 7, 2);
            let mut row = vec![0f32; k];
            let (mut sum, mut sq, mut max) = (0f64, 0f64, 0f32);
            for r in data.chunks(ty.row_bytes(k)) {
                tpslab_kernels::dequantize_row(ty, r, &mut row);
                for &x in &row {
                    assert!(x.is_finite(), "{ty:?}");
                    sum += x as f64;
                    sq += (x * x) as f64;
                    max = max.max(x.abs());
                }
            }
            let n = (16 * k) as f64;
            let (mean, std) = (sum / n, (sq / n).sqrt());
            assert!(mean.abs() < 0.002, "{ty:?}: mean {mean}");
            assert!((0.012..0.028).contains(&std), "{ty:?}: std {std}");
            assert!(max < 0.06, "{ty:?}: max {max}");
        }
    }
}
