//! Host tensors: constants in the IR, inputs and outputs of the reference evaluator.

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

use super::dtype::{DType, TensorType};

/// A dense, host-side tensor of one of the IR's element types.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    /// 32-bit floats.
    F32(ArrayD<f32>),
    /// IEEE halves.
    F16(ArrayD<f16>),
    /// bfloat16s.
    BF16(ArrayD<bf16>),
    /// 64-bit floats.
    F64(ArrayD<f64>),
    /// 64-bit integers.
    I64(ArrayD<i64>),
    /// 32-bit integers.
    I32(ArrayD<i32>),
    /// Booleans.
    Bool(ArrayD<bool>),
}

/// Applies `$body` to the array inside any variant, yielding a value of one type.
macro_rules! with_array {
    ($tensor:expr, $array:ident => $body:expr) => {
        match $tensor {
            Tensor::F32($array) => $body,
            Tensor::F16($array) => $body,
            Tensor::BF16($array) => $body,
            Tensor::F64($array) => $body,
            Tensor::I64($array) => $body,
            Tensor::I32($array) => $body,
            Tensor::Bool($array) => $body,
        }
    };
}

/// Applies `$body` (an array of the same element type) to any variant, keeping the variant.
/// Layout ops (reshape, transpose, gather, …) are written once with it for every type.
macro_rules! map_array {
    ($tensor:expr, $array:ident => $body:expr) => {
        match $tensor {
            Tensor::F32($array) => Tensor::F32($body),
            Tensor::F16($array) => Tensor::F16($body),
            Tensor::BF16($array) => Tensor::BF16($body),
            Tensor::F64($array) => Tensor::F64($body),
            Tensor::I64($array) => Tensor::I64($body),
            Tensor::I32($array) => Tensor::I32($body),
            Tensor::Bool($array) => Tensor::Bool($body),
        }
    };
}

pub(crate) use map_array;

/// An element type of [`Tensor`]: generic code gets at the typed array through it.
pub trait Element: Clone + Default + 'static {
    /// The tensor's array, if its elements are of this type.
    fn array(tensor: &Tensor) -> Option<&ArrayD<Self>>;
}

macro_rules! element {
    ($($ty:ty => $variant:ident),*) => {$(
        impl Element for $ty {
            fn array(tensor: &Tensor) -> Option<&ArrayD<Self>> {
                match tensor {
                    Tensor::$variant(a) => Some(a),
                    _ => None,
                }
            }
        }
    )*};
}

element!(f32 => F32, f16 => F16, bf16 => BF16, f64 => F64, i64 => I64, i32 => I32, bool => Bool);

impl Tensor {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F16(_) => DType::F16,
            Tensor::BF16(_) => DType::BF16,
            Tensor::F64(_) => DType::F64,
            Tensor::I64(_) => DType::I64,
            Tensor::I32(_) => DType::I32,
            Tensor::Bool(_) => DType::Bool,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        with_array!(self, a => a.shape())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_array!(self, a => a.len())
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type and shape.
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype(), self.shape().to_vec())
    }

    /// Bytes of its elements.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// A tensor of `dtype` built from f64 values (rounded, truncated or compared with zero).
    pub fn from_f64(values: ArrayD<f64>, dtype: DType) -> Tensor {
        match dtype {
            DType::F32 => Tensor::F32(values.mapv(|v| v as f32)),
            DType::F16 => Tensor::F16(values.mapv(f16::from_f64)),
            DType::BF16 => Tensor::BF16(values.mapv(bf16::from_f64)),
            DType::F64 => Tensor::F64(values),
            DType::I64 => Tensor::I64(values.mapv(|v| v as i64)),
            DType::I32 => Tensor::I32(values.mapv(|v| v as i32)),
            DType::Bool => Tensor::Bool(values.mapv(|v| v != 0.0)),
        }
    }

    /// A tensor of `dtype` built from i64 values.
    pub fn from_i64(values: ArrayD<i64>, dtype: DType) -> Tensor {
        match dtype {
            DType::I64 => Tensor::I64(values),
            DType::I32 => Tensor::I32(values.mapv(|v| v as i32)),
            DType::Bool => Tensor::Bool(values.mapv(|v| v != 0)),
            _ => Tensor::from_f64(values.mapv(|v| v as f64), dtype),
        }
    }

    /// Every element as f64 (booleans as 0/1).
    pub fn to_f64(&self) -> ArrayD<f64> {
        match self {
            Tensor::F32(a) => a.mapv(f64::from),
            Tensor::F16(a) => a.mapv(f64::from),
            Tensor::BF16(a) => a.mapv(f64::from),
            Tensor::F64(a) => a.clone(),
            Tensor::I64(a) => a.mapv(|v| v as f64),
            Tensor::I32(a) => a.mapv(f64::from),
            Tensor::Bool(a) => a.mapv(|v| if v { 1.0 } else { 0.0 }),
        }
    }

    /// Every element as i64 (floats truncated toward zero, booleans as 0/1).
    pub fn to_i64(&self) -> ArrayD<i64> {
        match self {
            Tensor::I64(a) => a.clone(),
            Tensor::I32(a) => a.mapv(i64::from),
            Tensor::Bool(a) => a.mapv(i64::from),
            other => other.to_f64().mapv(|v| v as i64),
        }
    }

    /// Every element as bool (non-zero is true).
    pub fn to_bool(&self) -> ArrayD<bool> {
        match self {
            Tensor::Bool(a) => a.clone(),
            other if other.dtype().is_float() => other.to_f64().mapv(|v| v != 0.0),
            other => other.to_i64().mapv(|v| v != 0),
        }
    }

    /// Converts to another element type with ONNX `Cast` semantics.
    pub fn cast(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        // Weights lowered to a half type: converted directly, in bulk (f32 → f16 or bf16
        // rounds to nearest even as through f64, which holds every f32 exactly).
        if let Tensor::F32(a) = self {
            use half::slice::HalfFloatSliceExt;
            fn halve<T: Copy>(
                a: &ArrayD<f32>,
                zero: T,
                convert: impl Fn(&mut [T], &[f32]),
            ) -> Option<ArrayD<T>> {
                let values = a.as_slice()?;
                let mut out = ArrayD::from_elem(a.raw_dim(), zero);
                convert(out.as_slice_mut()?, values);
                Some(out)
            }
            let halved = match dtype {
                DType::F16 => halve(a, f16::ZERO, |o, v| o.convert_from_f32_slice(v)).map(Tensor::F16),
                DType::BF16 => halve(a, bf16::ZERO, |o, v| o.convert_from_f32_slice(v)).map(Tensor::BF16),
                _ => None,
            };
            if let Some(halved) = halved {
                return halved;
            }
        }
        match (self.dtype().is_float(), dtype) {
            (false, _) => Tensor::from_i64(self.to_i64(), dtype),
            (true, DType::Bool) => Tensor::Bool(self.to_bool()),
            (true, _) => Tensor::from_f64(self.to_f64(), dtype),
        }
    }

    /// The elements as a flat list of i64: for shape-like constants (axes, shapes, indices).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        self.to_i64().iter().copied().collect()
    }

    /// The elements as a flat list of f64, in logical (row-major) order.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.to_f64().iter().copied().collect()
    }

    /// A rank-0 f32 tensor.
    pub fn scalar_f32(value: f32) -> Tensor {
        Tensor::F32(ArrayD::from_elem(IxDyn(&[]), value))
    }

    /// A 1-D i64 tensor of `values`.
    pub fn from_i64_slice(values: &[i64]) -> Tensor {
        Tensor::I64(ndarray::Array1::from(values.to_vec()).into_dyn())
    }

    /// A tensor of `ty` filled with `value` (converted to the element type).
    pub fn full(ty: &TensorType, value: f64) -> Tensor {
        Tensor::from_f64(ArrayD::from_elem(IxDyn(&ty.shape), value), ty.dtype)
    }

    /// The smallest tensor this one is a broadcast of: every axis along which all the slices
    /// are the same (bit for bit) kept at size 1; `None` where there is none.
    pub fn broadcast_source(&self) -> Option<Tensor> {
        let shape = self.shape().to_vec();
        let mut current = self.clone();
        let mut reduced = false;
        for (axis, &size) in shape.iter().enumerate() {
            if size <= 1 {
                continue;
            }
            let first = current.slice_axis_first(axis);
            let same = current.equals_broadcast_of(&first, axis);
            if same {
                current = first;
                reduced = true;
            }
        }
        reduced.then_some(current)
    }

    /// Slice 0 along `axis`, the axis kept at size 1.
    fn slice_axis_first(&self, axis: usize) -> Tensor {
        map_array!(self, a => a.slice_axis(ndarray::Axis(axis), ndarray::Slice::from(0..1)).to_owned())
    }

    /// Whether every slice along `axis` equals `first` (bit for bit).
    fn equals_broadcast_of(&self, first: &Tensor, axis: usize) -> bool {
        fn all<T>(a: &ArrayD<T>, f: &ArrayD<T>, axis: usize, same: impl Fn(&T, &T) -> bool) -> bool {
            a.axis_iter(ndarray::Axis(axis)).all(|s| s.iter().zip(f.iter()).all(|(x, y)| same(x, y)))
        }
        match (self, first) {
            (Tensor::F32(a), Tensor::F32(f)) => all(a, f, axis, |x, y| x.to_bits() == y.to_bits()),
            (Tensor::F16(a), Tensor::F16(f)) => all(a, f, axis, |x, y| x.to_bits() == y.to_bits()),
            (Tensor::BF16(a), Tensor::BF16(f)) => all(a, f, axis, |x, y| x.to_bits() == y.to_bits()),
            (Tensor::F64(a), Tensor::F64(f)) => all(a, f, axis, |x, y| x.to_bits() == y.to_bits()),
            (Tensor::I64(a), Tensor::I64(f)) => all(a, f, axis, |x, y| x == y),
            (Tensor::I32(a), Tensor::I32(f)) => all(a, f, axis, |x, y| x == y),
            (Tensor::Bool(a), Tensor::Bool(f)) => all(a, f, axis, |x, y| x == y),
            _ => false,
        }
    }

    /// Reshapes (row-major) to `shape`, which must have the same element count.
    pub fn reshaped(&self, shape: &[usize]) -> Option<Tensor> {
        fn reshape<T: Clone>(a: &ArrayD<T>, shape: &[usize]) -> Option<ArrayD<T>> {
            let values: Vec<T> = a.iter().cloned().collect();
            ArrayD::from_shape_vec(IxDyn(shape), values).ok()
        }
        Some(map_array!(self, a => reshape(a, shape)?))
    }

    /// A hash of the element type, shape and elements (bit for bit): equal tensors hash
    /// equal.
    pub fn content_hash(&self) -> u64 {
        fn mix<T>(a: &ArrayD<T>, bits: impl Fn(&T) -> u64) -> u64 {
            let start = a
                .shape()
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, &d| (h ^ d as u64).wrapping_mul(0x0000_0100_0000_01b3));
            a.iter().fold(start, |h, v| (h ^ bits(v)).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(7))
        }
        let h = match self {
            Tensor::F32(a) => mix(a, |v| u64::from(v.to_bits())),
            Tensor::F16(a) => mix(a, |v| u64::from(v.to_bits())),
            Tensor::BF16(a) => mix(a, |v| u64::from(v.to_bits())),
            Tensor::F64(a) => mix(a, |v| v.to_bits()),
            Tensor::I64(a) => mix(a, |&v| v as u64),
            Tensor::I32(a) => mix(a, |&v| v as u32 as u64),
            Tensor::Bool(a) => mix(a, |&v| u64::from(v)),
        };
        h ^ self.dtype().onnx_code() as u64
    }

    /// The leading block of `shape` (each axis cut to its first `shape[i]` entries); `None`
    /// where `shape` has another rank or is larger along an axis.
    pub fn leading_part(&self, shape: &[usize]) -> Option<Tensor> {
        if self.shape().len() != shape.len() || self.shape().iter().zip(shape).any(|(a, b)| b > a) {
            return None;
        }
        Some(
            map_array!(self, a => a.slice_each_axis(|ax| ndarray::Slice::from(0..shape[ax.axis.index()])).to_owned()),
        )
    }
}

/// An element type's little-endian bytes: the layout of the weights blob, of staged inputs
/// and outputs, and of `.npy` data. Each type is written once here; every byte codec of the
/// crate goes through it.
trait LeBytes: Copy {
    /// Bytes per element.
    const SIZE: usize;
    fn put(self, out: &mut [u8]);
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! le_bytes {
    ($($ty:ty),*) => {$(
        impl LeBytes for $ty {
            const SIZE: usize = std::mem::size_of::<$ty>();
            fn put(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                <$ty>::from_le_bytes(bytes.try_into().unwrap_or_default())
            }
        }
    )*};
}

le_bytes!(f32, f16, bf16, f64, i64, i32);

impl LeBytes for bool {
    const SIZE: usize = 1;
    fn put(self, out: &mut [u8]) {
        out[0] = u8::from(self);
    }
    fn get(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

fn write_elements<T: LeBytes>(out: &mut [u8], a: &ArrayD<T>) {
    match a.as_slice() {
        // Contiguous: a slice walk, which the compiler turns into plain copies.
        Some(values) => {
            for (to, &v) in out.chunks_exact_mut(T::SIZE).zip(values) {
                v.put(to);
            }
        }
        None => {
            for (to, &v) in out.chunks_exact_mut(T::SIZE).zip(a.iter()) {
                v.put(to);
            }
        }
    }
}

fn read_elements<T: LeBytes>(bytes: &[u8], a: &mut ArrayD<T>) {
    let chunks = bytes.chunks_exact(T::SIZE);
    match a.as_slice_mut() {
        Some(values) => values.iter_mut().zip(chunks).for_each(|(to, b)| *to = T::get(b)),
        None => a.iter_mut().zip(chunks).for_each(|(to, b)| *to = T::get(b)),
    }
}

impl Tensor {
    /// The raw little-endian bytes of the elements, row-major.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size_bytes());
        self.append_le_bytes(&mut out);
        out
    }

    /// Appends the elements to `out` as [`Tensor::to_le_bytes`] lays them out.
    pub fn append_le_bytes(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + self.size_bytes(), 0);
        self.write_le_bytes(&mut out[start..]);
    }

    /// Writes the elements into the start of `out` as [`Tensor::to_le_bytes`] lays them out
    /// (as many as fit).
    pub fn write_le_bytes(&self, out: &mut [u8]) {
        with_array!(self, a => write_elements(out, a))
    }

    /// Fills the tensor (its shape and type unchanged) from little-endian element bytes;
    /// elements past the end of `bytes` are left as they were.
    pub fn read_le_bytes(&mut self, bytes: &[u8]) {
        with_array!(self, a => read_elements(bytes, a))
    }

    /// A tensor of `shape` and `dtype` from exactly its little-endian element bytes; `None`
    /// where `bytes` holds another number of elements.
    pub fn from_le_bytes(bytes: &[u8], shape: &[usize], dtype: DType) -> Option<Tensor> {
        let count = super::dtype::element_count(shape)?;
        if bytes.len() / dtype.size_bytes().max(1) != count {
            return None;
        }
        // One pass into the typed vector, no intermediate array (outputs are megabytes).
        fn decode<T: LeBytes>(bytes: &[u8], shape: &[usize]) -> Option<ArrayD<T>> {
            let values: Vec<T> = bytes.chunks_exact(T::SIZE).map(T::get).collect();
            ArrayD::from_shape_vec(IxDyn(shape), values).ok()
        }
        Some(match dtype {
            DType::F32 => Tensor::F32(decode(bytes, shape)?),
            DType::F16 => Tensor::F16(decode(bytes, shape)?),
            DType::BF16 => Tensor::BF16(decode(bytes, shape)?),
            DType::F64 => Tensor::F64(decode(bytes, shape)?),
            DType::I64 => Tensor::I64(decode(bytes, shape)?),
            DType::I32 => Tensor::I32(decode(bytes, shape)?),
            DType::Bool => Tensor::Bool(decode(bytes, shape)?),
        })
    }
}

/// Relative L2 error `‖a − b‖ / ‖b‖` (with `b` the reference). NaN anywhere gives NaN, so a
/// comparison `≤ tol` fails; mismatched lengths give infinity.
pub fn rel_l2(actual: &Tensor, reference: &Tensor) -> f64 {
    if actual.shape() != reference.shape() {
        return f64::INFINITY;
    }
    let (a, b) = (actual.to_f64(), reference.to_f64());
    let mut diff = 0.0;
    let mut norm = 0.0;
    for (x, y) in a.iter().zip(b.iter()) {
        diff += (x - y) * (x - y);
        norm += y * y;
    }
    if norm == 0.0 {
        return if diff == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (diff / norm).sqrt()
}

/// Largest absolute element-wise difference; NaN if either side holds a NaN.
pub fn max_abs_diff(actual: &Tensor, reference: &Tensor) -> f64 {
    let (a, b) = (actual.to_f64(), reference.to_f64());
    a.iter().zip(b.iter()).map(|(x, y)| (x - y).abs()).fold(0.0, |m, d| {
        if d.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(d)
        }
    })
}

/// Folded floating-point and boolean constants of at least this many elements that are a
/// broadcast of a smaller one are kept as that smaller one expanded (a view) by the import and
/// by constant folding: an export's attention mask of ones, broadcast to `[batch, 1, seq, seq]`
/// and folded, is one value, not 8.4 million at 32 × 512. Every size alike (not only the
/// large ones), so that a program's structure does not change along its ranges.
pub const UNIFORM_ELEMENTS: usize = 2;
