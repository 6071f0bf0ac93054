//! SmolLM2-135M's matrices, shared by the matmul benchmark and `examples/step_rows`.

/// (outputs n, inputs k) of one layer's Q, K, V, O, gate, up and down.
pub const LAYER: [(usize, usize); 7] = [
    (576, 576),
    (192, 576),
    (192, 576),
    (576, 576),
    (1536, 576),
    (1536, 576),
    (576, 1536),
];
/// Its layers.
#[allow(dead_code)]
pub const LAYERS: usize = 30;
