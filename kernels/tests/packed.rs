//! Matrices packed 8 rows at a time (`Layout::Rows8`) against the same matrices in ggml rows:
//! bit for bit on every backend, batch size, row count (padding included) and thread count, and
//! a changed byte in any field of a packed block changes the rows it belongs to.

mod common;

use common::*;
use tpslab_kernels::{Backend, Layout, QMatrix, ThreadPool, WType, matmul_with, packed};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const PACKED_TYPES: [WType; 12] = [
    WType::Q4K,
    WType::Q5K,
    WType::Q6K,
    WType::Q3K,
    WType::Q2K,
    WType::IQ4XS,
    WType::Q4_1,
    WType::Q5_1,
    WType::IQ4NL,
    WType::Q8_0,
    WType::Q4_0,
    WType::Q5_0,
];

/// The packed matmul gives the ggml rows' bits, for decode (1 row), the in-place sizes and the
/// batches (those past 32 rows through the repacked panels), every backend this CPU has and 1
/// to 3 threads.
#[test]
fn packed_matrices_give_the_bits_of_their_rows() {
    let mut r = rng(41);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    for ty in PACKED_TYPES {
        for &(n, k) in &[(8, 256), (13, 512), (40, 768), (70, 256)] {
            let data = random_weights(&mut r, ty, n, k);
            let rows = QMatrix::rows(ty, n, k, &data);
            let pk = packed::pack(ty, n, k, &data);
            let w = QMatrix {
                layout: Layout::Rows8,
                data: &pk,
                ..rows
            };
            // Past 32 rows packed Q5_K, Q6_K, Q3_K and Q2_K are repacked into the batched panels;
            // past 64 a group's scales are unpacked once for all its column tiles (Q4_K).
            let more: &[usize] = if ty == WType::Q4K { &[70] } else { &[] };
            for &m in [1, 2, 3, 4, 5, 9, 10, 17, 33, 38].iter().chain(more) {
                let x = random_vec(&mut r, m * k, 1.0);
                let mut want = vec![0f32; m * n];
                matmul_with(Backend::Portable, &pools[0], &rows, &x, m, &mut want);
                for backend in Backend::ALL.into_iter().filter(|b| b.is_available()) {
                    for pool in &pools {
                        let mut y = vec![f32::NAN; m * n];
                        matmul_with(backend, pool, &w, &x, m, &mut y);
                        assert_eq!(
                            bits(&y),
                            bits(&want),
                            "{ty} {backend:?} n={n} k={k} m={m} threads={}",
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }
}

/// Every byte of a packed block counts, in its own row: a byte changed in a field (d, dmin, a
/// scale, a level or high bit) changes that row's output on every backend, and no other row's,
/// in decode (one activation row) and in a batch of two (the two-panel tiles: 16 rows a tile,
/// 512-bit on `Backend::Avx512Zmm`), the changed block in either panel.
#[test]
fn a_changed_byte_of_a_packed_block_changes_its_row_only() {
    let mut r = rng(43);
    let pool = ThreadPool::new(2);
    for ty in PACKED_TYPES {
        let (n, k) = (16, 256);
        let data = random_weights(&mut r, ty, n, k);
        let pk = packed::pack(ty, n, k, &data);
        let x1 = random_vec(&mut r, k, 1.0);
        // The second activation row quantizes to the first's integers (a change that meets a
        // zero of them changes neither), with its own scale.
        let x2: Vec<f32> = x1.iter().map(|v| 2.0 * v).collect();
        let fields = packed::fields(ty).expect("a packed type");
        for (backend, m, row) in Backend::ALL
            .into_iter()
            .filter(|b| b.is_available())
            .flat_map(|b| [(b, 1, 5), (b, 2, 5), (b, 2, 13)])
        {
            let x: Vec<f32> = [&x1[..], &x2[..]].concat()[..m * k].to_vec();
            let run = |bytes: &[u8]| {
                let w = QMatrix {
                    ty,
                    n,
                    k,
                    data: bytes,
                    layout: Layout::Rows8,
                };
                let mut y = vec![0f32; m * n];
                matmul_with(backend, &pool, &w, &x, m, &mut y);
                y
            };
            let base = run(&pk);
            for fd in fields {
                // Row 5 of the first panel or of the second: its unit in the middle of the
                // field.
                let u = fd.len / fd.unit / 2;
                let panel = pk.len() / 2;
                let at = (row / 8) * panel + fd.packed + u * 8 * fd.unit + (row % 8) * fd.unit;
                let mut bad = pk.clone();
                // The low bits of a byte, so a 6-bit scale or a nibble changes too.
                bad[at] ^= 0x03;
                let y = run(&bad);
                for (i, (y, base)) in y.iter().zip(&base).enumerate() {
                    let (j, col) = (i % n, i / n);
                    let changed = y.to_bits() != base.to_bits();
                    assert_eq!(
                        changed,
                        j == row,
                        "{ty} {backend:?} m={m} field at {} row {j} of activation row {col}",
                        fd.at
                    );
                }
            }
        }
    }
}
