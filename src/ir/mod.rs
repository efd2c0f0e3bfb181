//! The IR: a petgraph graph of ops with ONNX-level meaning, every value with a static shape
//! and element type; a verifier, a text dump and a CPU reference evaluator.

mod dtype;
mod dump;
mod error;
mod eval;
mod graph;
mod op;
pub(crate) mod ops;
mod random;
mod sym;
mod tensor;
mod verify;

pub use dtype::{element_count, DType, TensorType};
pub use dump::dump;
pub use error::IrError;
pub use eval::evaluate;
pub use graph::{Graph, Node, NodeId, Origin};
pub use op::{BinaryOp, Op, PoolKind, PoolWindow, ReduceOp, SliceAxis, UnaryOp};
pub use ops::gate::GateActivation;
pub use random::{is_mask, random_input, random_tensor, SplitMix64};
pub use sym::{ranges_text, symbol_param, tops, with_sums, DimRange, SymDim, SymbolicShapes};
pub use tensor::{max_abs_diff, rel_l2, Element, Tensor, UNIFORM_ELEMENTS};
pub use verify::verify;
