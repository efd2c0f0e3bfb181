//! Deterministic pseudo-random tensors (splitmix64), for tests and benchmarks: never zeros,
//! the same values for the same seed on every machine.

use ndarray::{ArrayD, IxDyn};

use super::dtype::TensorType;
use super::tensor::Tensor;

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
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
