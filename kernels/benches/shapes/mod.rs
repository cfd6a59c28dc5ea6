//! The projection shapes of one Qwen3-0.6B layer (hidden 1024, 16 query and 8 KV
//! heads of 128, MLP 3072) that the GEMM benches time, and the activation rows of
//! one 300-token document and of a packed batch of 16.

/// `(name, n, k)`: the projections of one layer.
pub const SHAPES: [(&str, usize, usize); 4] = [
    ("q_proj", 2048, 1024),
    ("o_proj", 1024, 2048),
    ("gate_proj", 3072, 1024),
    ("down_proj", 1024, 3072),
];

/// Activation rows per call.
pub const ROWS: [usize; 2] = [300, 4800];
