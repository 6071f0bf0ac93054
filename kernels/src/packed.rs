//! `packed`: weight matrices kept with their rows interleaved eight at a time ([`Layout::Rows8`]),
//! the layout the x86 kernels read without horizontal sums: a vector of 8 lanes holds the same
//! bytes of 8 rows, so one `vpdpbusd` with a broadcast activation word adds to each row's own
//! lane (decode reads each weight once, so the layout is made once, when a model loads, not per
//! call as the batched panels' repack is).
//!
//! A packed matrix is its rows padded with zero rows to a multiple of 8, as panels of 8 rows, one
//! after another; a panel is its blocks in order, and a panel's block is the 8 rows' blocks of
//! that index with each field ([`fields`]) interleaved by its unit: unit `u` of the field for
//! rows 0..8, then unit `u + 1`. The bytes are the ggml blocks' own, only moved, so
//! [`row_bytes_into`] gives back any row exactly and a packed matrix is the same size as its rows
//! (plus the padding).

use crate::WType;

/// Rows per panel.
pub const PANEL_ROWS: usize = 8;

/// How a matrix's blocks lie in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Row after row of ggml blocks, as a GGUF file holds them.
    #[default]
    Ggml,
    /// Panels of 8 interleaved rows (this module).
    Rows8,
}

/// A field of a block: its byte offset in the ggml block, its length and unit (the bytes of one
/// row kept together), and where the 8 rows' field starts in a packed block (`packed`: 8 times
/// the lengths of the fields listed before it).
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub at: usize,
    pub len: usize,
    pub unit: usize,
    pub packed: usize,
}

const fn f(at: usize, len: usize, unit: usize) -> Field {
    Field {
        at,
        len,
        unit,
        packed: 0,
    }
}

/// `fields` with each one's packed offset: the packed block holds them in the listed order.
const fn placed<const N: usize>(mut fields: [Field; N]) -> [Field; N] {
    let mut i = 0;
    let mut at = 0;
    while i < N {
        fields[i].packed = at;
        at += PANEL_ROWS * fields[i].len;
        i += 1;
    }
    fields
}

/// Q4_K: `d`, `dmin`, the 12 packed scale bytes one by one, the nibbles 4 bytes at a time (so a
/// 32-byte vector is bytes `4u..4u + 4` of the 8 rows).
pub(crate) const Q4K: [Field; 4] = placed([f(0, 2, 2), f(2, 2, 2), f(4, 12, 1), f(16, 128, 4)]);
/// Q5_K: Q4_K's fields, then its 32 fifth-bit bytes 4 at a time (byte `l`'s bit `s` is the
/// fifth bit of element `l` of sub-block `s`), then the nibbles as Q4_K's.
pub(crate) const Q5K: [Field; 5] = placed([
    f(0, 2, 2),
    f(2, 2, 2),
    f(4, 12, 1),
    f(16, 32, 4),
    f(48, 128, 4),
]);
/// Q6_K: per half of the block (elements 0..128, then 128..256), its 64 low-nibble bytes and
/// its 32 high-bit bytes, 4 at a time, so the kernel reads each half's levels in one stretch;
/// then the 16 signed scales one by one, `d`.
pub(crate) const Q6K: [Field; 6] = placed([
    f(0, 64, 4),
    f(128, 32, 4),
    f(64, 64, 4),
    f(160, 32, 4),
    f(192, 16, 1),
    f(208, 2, 2),
]);

/// Q2_K: the 64 level bytes 4 at a time (bits `2 j` of byte `32 n + l` are element
/// `128 n + 32 j + l`'s), the 16 scale bytes (scale and min nibbles) one by one, `d`, `dmin`.
pub(crate) const Q2K: [Field; 4] = placed([f(16, 64, 4), f(0, 16, 1), f(80, 2, 2), f(82, 2, 2)]);
/// Q3_K: the 32 high-bit bytes 4 at a time (byte `l`'s bit `c` is the high bit of element
/// `32 c + l`), the 64 low-bit bytes 4 at a time (bits `2 j` of byte `32 n + l` are element
/// `128 n + 32 j + l`'s), the 12 scale bytes one by one, `d`.
pub(crate) const Q3K: [Field; 4] = placed([f(0, 32, 4), f(32, 64, 4), f(96, 12, 1), f(108, 2, 2)]);
/// IQ4_XS: `d`, the high bits of the 8 scales (one word a row), their low nibbles one byte at a
/// time, the nibbles 4 bytes at a time (sub-block `s` is bytes `16s..16s + 16`: 4 vectors).
pub(crate) const IQ4XS: [Field; 4] = placed([f(0, 2, 2), f(2, 2, 2), f(4, 4, 1), f(8, 128, 4)]);
/// Q8_0: `d`, the 32 values 4 bytes at a time.
pub(crate) const Q8_0: [Field; 2] = placed([f(0, 2, 2), f(2, 32, 4)]);
/// Q4_0 and IQ4_NL: `d`, the 16 nibble bytes 4 at a time.
pub(crate) const Q4_0: [Field; 2] = placed([f(0, 2, 2), f(2, 16, 4)]);
/// Q5_0: `d`, the 32 fifth bits as one word, the 16 nibble bytes 4 at a time.
pub(crate) const Q5_0: [Field; 3] = placed([f(0, 2, 2), f(2, 4, 4), f(6, 16, 4)]);
/// Q4_1: `d`, `m`, the nibbles.
pub(crate) const Q4_1: [Field; 3] = placed([f(0, 2, 2), f(2, 2, 2), f(4, 16, 4)]);
/// Q5_1: `d`, `m`, the fifth bits, the nibbles.
pub(crate) const Q5_1: [Field; 4] = placed([f(0, 2, 2), f(2, 2, 2), f(4, 4, 4), f(8, 16, 4)]);

/// Where the 8 rows' field that starts at byte `at` of a ggml block starts in a packed block:
/// the kernels' offsets, taken from the layout at compile time.
pub(crate) const fn field_at(fields: &[Field], at: usize) -> usize {
    let mut i = 0;
    while i < fields.len() {
        if fields[i].at == at {
            return fields[i].packed;
        }
        i += 1;
    }
    panic!("no field starts there")
}

/// The fields of a type that has a packed layout, in block order.
pub fn fields(ty: WType) -> Option<&'static [Field]> {
    match ty {
        WType::Q4K => Some(&Q4K),
        WType::Q5K => Some(&Q5K),
        WType::Q6K => Some(&Q6K),
        WType::Q3K => Some(&Q3K),
        WType::Q2K => Some(&Q2K),
        WType::IQ4XS => Some(&IQ4XS),
        WType::Q8_0 => Some(&Q8_0),
        WType::Q4_0 | WType::IQ4NL => Some(&Q4_0),
        WType::Q5_0 => Some(&Q5_0),
        WType::Q4_1 => Some(&Q4_1),
        WType::Q5_1 => Some(&Q5_1),
        _ => None,
    }
}

/// The layout a model's loader should choose for a matrix of `ty` with `n` rows: packed where
/// the kernels this CPU runs (an x86 path) are faster on it (`type_rates`, BENCHMARKS.md
/// "Weights packed at load"): every type with a packed layout ([`fields`]). Q6_K joined them
/// once decode's tiles asked for their bytes ahead (`x86::job::prefetch_ahead`): packed, one
/// row streams at 99% of the read bandwidth against its rows' 82%, and 4, 8 and 512 rows run
/// faster too (`type_rates`, Intel Xeon, 2 threads).
/// `TPSLAB_WEIGHT_LAYOUT=rows` keeps every matrix in rows (to compare the two in one build).
pub fn preferred(ty: WType, n: usize) -> Layout {
    static ROWS_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let rows_only =
        *ROWS_ONLY.get_or_init(|| std::env::var("TPSLAB_WEIGHT_LAYOUT").is_ok_and(|v| v == "rows"));
    let fast = crate::Backend::detect() != crate::Backend::Portable;
    if fast && !rows_only && n >= PANEL_ROWS && fields(ty).is_some() {
        Layout::Rows8
    } else {
        Layout::Ggml
    }
}

/// Bytes of an `n x k` matrix of `ty` in `layout`.
pub fn len(ty: WType, layout: Layout, n: usize, k: usize) -> usize {
    match layout {
        Layout::Ggml => n * ty.row_bytes(k),
        Layout::Rows8 => n.next_multiple_of(PANEL_ROWS) * ty.row_bytes(k),
    }
}

/// Where unit `u` of field `fd` of block `b` of row `row` lies in a packed matrix (`rb` bytes a
/// row, `ts` a block).
fn packed_at(fd: &Field, ts: usize, rb: usize, row: usize, b: usize, u: usize) -> usize {
    let (panel, r) = (row / PANEL_ROWS, row % PANEL_ROWS);
    panel * PANEL_ROWS * rb
        + b * PANEL_ROWS * ts
        + fd.packed
        + u * PANEL_ROWS * fd.unit
        + r * fd.unit
}

/// Calls `each(ggml_offset, packed_offset, unit)` for every unit of bytes of `rows` of a matrix
/// of `ty` with rows `k` long: where it lies in ggml rows and where packed.
fn moves(
    ty: WType,
    k: usize,
    rows: std::ops::Range<usize>,
    mut each: impl FnMut(usize, usize, usize),
) {
    let fields = fields(ty).expect("a type with a packed layout");
    let (ts, rb) = (ty.type_size(), ty.row_bytes(k));
    for row in rows {
        for b in 0..k / ty.block_size() {
            for fd in fields {
                for u in 0..fd.len / fd.unit {
                    let g = row * rb + b * ts + fd.at + u * fd.unit;
                    each(g, packed_at(fd, ts, rb, row, b, u), fd.unit);
                }
            }
        }
    }
}

/// The `n x k` matrix of `ty` in ggml rows (`data`) as [`Layout::Rows8`]; the padding rows are
/// zeros.
pub fn pack(ty: WType, n: usize, k: usize, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; len(ty, Layout::Rows8, n, k)];
    pack_into(ty, n, k, data, &mut out);
    out
}

/// [`pack`] into `out` ([`len`] bytes, its padding rows already zeros). A model's loader packs
/// every matrix this way, so it runs panel by panel with a copy loop per unit size (a copy per
/// unit through `moves` took 4 s for a 1B model), split over the cores.
pub fn pack_into(ty: WType, n: usize, k: usize, data: &[u8], out: &mut [u8]) {
    assert_eq!(
        data.len(),
        n * ty.row_bytes(k),
        "not an n x k matrix of {ty}"
    );
    assert_eq!(out.len(), len(ty, Layout::Rows8, n, k));
    let fields = fields(ty).expect("a type with a packed layout");
    let rb = ty.row_bytes(k);
    let panel = PANEL_ROWS * rb;
    let panels = n.div_ceil(PANEL_ROWS);
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(panels.div_ceil(64))
        .max(1);
    let per = panels.div_ceil(threads);
    std::thread::scope(|scope| {
        for (t, chunk) in out.chunks_mut(per * panel).enumerate() {
            let first = t * per;
            scope.spawn(move || {
                for (i, dst) in chunk.chunks_exact_mut(panel).enumerate() {
                    let p = first + i;
                    let rows = (n - p * PANEL_ROWS).min(PANEL_ROWS);
                    pack_panel(ty, fields, k, &data[p * panel..p * panel + rows * rb], dst);
                }
            });
        }
    });
}

/// One panel: `src` its ggml rows (8, or fewer in the last panel), `dst` its packed bytes.
fn pack_panel(ty: WType, fields: &[Field], k: usize, src: &[u8], dst: &mut [u8]) {
    let (ts, rb) = (ty.type_size(), ty.row_bytes(k));
    let pb = PANEL_ROWS * ts;
    for b in 0..k / ty.block_size() {
        let d = &mut dst[b * pb..(b + 1) * pb];
        for (r, row) in src.chunks_exact(rb).enumerate() {
            let blk = &row[b * ts..(b + 1) * ts];
            for fd in fields {
                let s = &blk[fd.at..fd.at + fd.len];
                let d = &mut d[fd.packed..fd.packed + PANEL_ROWS * fd.len];
                match fd.unit {
                    1 => spread::<1>(s, d, r),
                    2 => spread::<2>(s, d, r),
                    _ => spread::<4>(s, d, r),
                }
            }
        }
    }
}

/// Row `r`'s field `s` into the 8 rows' field `d`, unit by unit (`U` bytes each).
#[inline(always)]
fn spread<const U: usize>(s: &[u8], d: &mut [u8], r: usize) {
    for (u, unit) in s.chunks_exact(U).enumerate() {
        let at = (u * PANEL_ROWS + r) * U;
        d[at..at + U].copy_from_slice(unit);
    }
}

/// [`pack`] reversed: the ggml rows of a packed `n x k` matrix.
pub fn unpack(ty: WType, n: usize, k: usize, packed: &[u8]) -> Vec<u8> {
    assert_eq!(packed.len(), len(ty, Layout::Rows8, n, k));
    let mut out = vec![0u8; n * ty.row_bytes(k)];
    moves(ty, k, 0..n, |g, p, l| {
        out[g..g + l].copy_from_slice(&packed[p..p + l])
    });
    out
}

/// Row `row`'s ggml bytes out of a matrix of `ty` with rows `k` long in `layout`, into `out`
/// (`ty.row_bytes(k)` long).
pub fn row_bytes_into(
    ty: WType,
    layout: Layout,
    k: usize,
    data: &[u8],
    row: usize,
    out: &mut [u8],
) {
    let rb = ty.row_bytes(k);
    assert_eq!(out.len(), rb);
    match layout {
        Layout::Ggml => out.copy_from_slice(&data[row * rb..(row + 1) * rb]),
        Layout::Rows8 => {
            let base = row * rb;
            moves(ty, k, row..row + 1, |g, p, l| {
                out[g - base..g - base + l].copy_from_slice(&data[p..p + l]);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).rotate_left(7) as u8)
            .collect()
    }

    #[test]
    fn the_fields_cover_each_block_once_in_whole_units() {
        for ty in WType::ALL {
            let Some(fs) = fields(ty) else { continue };
            let mut covered = vec![0; ty.type_size()];
            let mut packed = 0;
            for fd in fs {
                assert_eq!(fd.packed, packed, "{ty}");
                assert_eq!(fd.len % fd.unit, 0, "{ty}");
                covered[fd.at..fd.at + fd.len]
                    .iter_mut()
                    .for_each(|c| *c += 1);
                packed += PANEL_ROWS * fd.len;
            }
            assert!(covered.iter().all(|&c| c == 1), "{ty}: {covered:?}");
        }
    }

    /// Packing moves every byte to one place and back: any row count (padding included), and
    /// each row read alone is its ggml bytes.
    #[test]
    fn packing_round_trips_every_row() {
        for ty in [
            WType::Q4K,
            WType::Q6K,
            WType::Q8_0,
            WType::Q4_0,
            WType::Q5_0,
        ] {
            let k = 512;
            for n in [8, 13, 24] {
                let data = bytes(n * ty.row_bytes(k), n as u32);
                let p = pack(ty, n, k, &data);
                assert_eq!(p.len(), n.next_multiple_of(8) * ty.row_bytes(k));
                assert_ne!(p[..data.len()], data[..], "{ty}: packing moved nothing");
                assert_eq!(unpack(ty, n, k, &p), data, "{ty} n={n}");
                let mut row = vec![0; ty.row_bytes(k)];
                for r in 0..n {
                    row_bytes_into(ty, Layout::Rows8, k, &p, r, &mut row);
                    assert_eq!(
                        row,
                        data[r * row.len()..(r + 1) * row.len()],
                        "{ty} row {r}"
                    );
                }
            }
        }
    }

    /// The Q4_K nibbles land as the kernels read them: the 32 bytes at 128 + 32u of a panel's
    /// block are bytes 16 + 4u..16 + 4u + 4 of rows 0..8.
    #[test]
    fn q4k_nibble_vectors_hold_one_word_of_each_row() {
        let (ty, n, k) = (WType::Q4K, 8, 256);
        let data = bytes(n * 144, 3);
        let p = pack(ty, n, k, &data);
        for u in 0..32 {
            for r in 0..8 {
                let at = 128 + 32 * u + 4 * r;
                assert_eq!(
                    p[at..at + 4],
                    data[r * 144 + 16 + 4 * u..r * 144 + 20 + 4 * u]
                );
            }
        }
        // d of the 8 rows first, then dmin, then scale byte 0 of the 8 rows.
        for r in 0..8 {
            assert_eq!(p[2 * r..2 * r + 2], data[r * 144..r * 144 + 2]);
            assert_eq!(p[16 + 2 * r..18 + 2 * r], data[r * 144 + 2..r * 144 + 4]);
            assert_eq!(p[32 + r], data[r * 144 + 4]);
        }
    }
}
