//! Every weight type against gguf-py's reference (`gguf.quants`): random but valid blocks
//! dequantize to exactly the f32 bits gguf-py gives, and the types gguf-py can quantize
//! quantize to its bytes. The fixture is written by `data/make_quant_fixtures.py`.

use tpslab_kernels::quantize::quantize;
use tpslab_kernels::{WType, dequantize_row};

const FIXTURE: &[u8] = include_bytes!("data/gguf_py_quants.bin");

/// The fixture's records: (name, bytes), in file order.
fn records() -> Vec<(String, &'static [u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    let take = |at: &mut usize, n: usize| {
        let s = &FIXTURE[*at..*at + n];
        *at += n;
        s
    };
    while at < FIXTURE.len() {
        let len = u16::from_le_bytes(take(&mut at, 2).try_into().expect("u16")) as usize;
        let name = String::from_utf8(take(&mut at, len).to_vec()).expect("ASCII name");
        let n = u32::from_le_bytes(take(&mut at, 4).try_into().expect("u32")) as usize;
        out.push((name, take(&mut at, n)));
    }
    out
}

fn record(name: &str) -> &'static [u8] {
    records()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| b)
        .unwrap_or_else(|| panic!("fixture has no record '{name}'"))
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

#[test]
fn dequantize_is_bit_identical_to_gguf_py() {
    let mut checked = Vec::new();
    for ty in WType::ALL.into_iter().filter(|&t| t != WType::F32) {
        let blocks = record(&format!("deq/{ty}/blocks"));
        let want = floats(record(&format!("deq/{ty}/values")));
        assert_eq!(blocks.len(), ty.row_bytes(want.len()), "{ty}: fixture size");
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, blocks, &mut got);
        for (e, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{ty} element {e} (block {}): {a} vs gguf-py {b}",
                e / ty.block_size()
            );
        }
        // Random blocks reach every level: the values are not all equal.
        assert!(want.iter().any(|v| *v != want[0]), "{ty}: degenerate data");
        checked.push(ty);
    }
    assert_eq!(checked.len(), WType::ALL.len() - 1);
}

#[test]
fn quantize_is_byte_identical_to_gguf_py() {
    for ty in [
        WType::BF16,
        WType::Q4_0,
        WType::Q4_1,
        WType::Q5_0,
        WType::Q5_1,
        WType::Q8_0,
        WType::MXFP4,
    ] {
        let x = floats(record(&format!("q/{ty}/input")));
        let want = record(&format!("q/{ty}/bytes"));
        let got = quantize(ty, &x);
        assert_eq!(got.len(), want.len(), "{ty}: size");
        let ts = ty.type_size();
        for (b, (o, t)) in got.chunks(ts).zip(want.chunks(ts)).enumerate() {
            assert_eq!(o, t, "{ty}: block {b} differs from gguf-py");
        }
    }
}

#[test]
fn the_fixture_holds_only_known_records() {
    let names: Vec<String> = records().into_iter().map(|(n, _)| n).collect();
    // 15 dequantized types (blocks and values) and 7 quantized ones (input and bytes).
    assert_eq!(names.len(), 15 * 2 + 7 * 2, "{names:?}");
}
