//! Conversion of tract's tensors (initializers, `Constant` values) into IR tensors.

use tract_onnx::prelude::{DatumType, Tensor as TractTensor};

use crate::ir::Tensor;

/// The IR tensor holding the same values as `t`; small integer types widen to i32/i64.
pub fn from_tract(t: &TractTensor) -> Result<Tensor, String> {
    fn array<T: tract_onnx::prelude::Datum + Clone>(t: &TractTensor) -> Result<ndarray::ArrayD<T>, String> {
        Ok(t.to_plain_array_view::<T>().map_err(|e| e.to_string())?.to_owned())
    }
    let widened = |to: DatumType| t.cast_to_dt(to).map_err(|e| e.to_string());
    Ok(match t.datum_type() {
        DatumType::F32 => Tensor::F32(array(t)?),
        DatumType::F64 => Tensor::F64(array(t)?),
        DatumType::F16 => Tensor::F16(array(t)?),
        DatumType::I64 => Tensor::I64(array(t)?),
        DatumType::I32 => Tensor::I32(array(t)?),
        DatumType::Bool => Tensor::Bool(array(t)?),
        DatumType::I8 | DatumType::I16 | DatumType::U8 | DatumType::U16 => {
            Tensor::I32(array(&*widened(DatumType::I32)?)?)
        }
        DatumType::U32 => Tensor::I64(array(&*widened(DatumType::I64)?)?),
        other => return Err(format!("element type {other:?} is not supported")),
    })
}
