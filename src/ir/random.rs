//! Deterministic pseudo-random tensors (splitmix64), for tests and benchmarks: never zeros,
//! the same values for the same seed on every machine.

use ndarray::{ArrayD, IxDyn};

use super::dtype::TensorType;
use super::tensor::Tensor;

/// A small seeded generator of 64-bit values (SplitMix64): the same sequence from the same
/// seed on every machine.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A tensor of `ty` with values drawn uniformly: floats in `[low, high)`, integers in
/// `low as i64 .. high as i64`, booleans half true.
pub fn random_tensor(ty: &TensorType, seed: u64, low: f64, high: f64) -> Tensor {
    let mut rng = SplitMix64(seed);
    let values: Vec<f64> = (0..ty.len())
        .map(|_| {
            let u = rng.unit();
            if ty.dtype.is_float() {
                low + u * (high - low)
            } else {
                (low + u * (high - low)).floor()
            }
        })
        .collect();
    let array = ArrayD::from_shape_vec(IxDyn(&ty.shape), values)
        .unwrap_or_else(|_| unreachable!("the value count is the shape's element count"));
    Tensor::from_f64(array, ty.dtype)
}

/// Whether a model input named `name` is a mask (its name ends in `mask`, in any case).
pub fn is_mask(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with("mask")
}

/// A random value for a model input named `name`, as a tokenizer's batch would give it:
/// `attention_mask` (or any rank-2 input whose name ends in `mask`) right-padded — the first
/// row whole, each other row a random length of at least one token; `token_type_ids` 0 for
/// the first half of each row and 1 after; `position_ids` each row 0, 1, 2, …; any other input
/// [`random_tensor`] in `[low, high)`.
pub fn random_input(name: &str, ty: &TensorType, seed: u64, low: f64, high: f64) -> Tensor {
    let lower = name.to_ascii_lowercase();
    let [rows, columns] = ty.shape[..] else { return random_tensor(ty, seed, low, high) };
    let values: Vec<f64> = if is_mask(name) {
        let mut rng = SplitMix64(seed);
        (0..rows)
            .flat_map(|r| {
                let length = if r == 0 { columns } else { 1 + (rng.unit() * columns as f64) as usize };
                (0..columns).map(move |c| f64::from(u8::from(c < length)))
            })
            .collect()
    } else if lower.contains("position_ids") {
        // Each row its positions in order (within any model's table of positions).
        (0..rows).flat_map(|_| (0..columns).map(|c| c as f64)).collect()
    } else if lower.contains("token_type") {
        (0..rows).flat_map(|_| (0..columns).map(|c| f64::from(u8::from(2 * c >= columns)))).collect()
    } else {
        return random_tensor(ty, seed, low, high);
    };
    let array = ArrayD::from_shape_vec(IxDyn(&ty.shape), values)
        .unwrap_or_else(|_| unreachable!("the value count is the shape's element count"));
    Tensor::from_f64(array, ty.dtype)
}
