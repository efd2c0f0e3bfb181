//! The e-class analysis: every class knows its static type and, when it is computable at
//! compile time, its constant value (then a `Const` node joins the class: constant folding).
//! [`ir_op`] is the one mapping from language nodes back to IR ops.

use std::collections::HashMap;
use std::sync::Arc;

use egg::{Analysis, DidMerge, EGraph, Id};

use super::lang::{ConstId, FusionLang, InputId, OpId};
use crate::ir::{ops, BinaryOp, Op, ReduceOp, Tensor, TensorType, UnaryOp};

/// The e-graph fusion saturates.
pub type FusionGraph = EGraph<FusionLang, FusionAnalysis>;

/// Constants computed inside the e-graph are kept only up to this many elements.
const FOLD_LIMIT: usize = 1 << 16;

/// The e-class analysis: each class's type and constant value, and the tables the language's
/// leaves index (constants, ops, inputs).
#[derive(Debug, Default)]
pub struct FusionAnalysis {
    /// Whether every element of a constant equals a value, by constant (the `Arc` kept, so
    /// that its address is not reused) and the value's bits: rules test each constant on every
    /// iteration, and a folded mask has millions of elements.
    equal: HashMap<(usize, u64), (Arc<Tensor>, bool)>,
    constants: Vec<Arc<Tensor>>,
    constant_keys: HashMap<String, ConstId>,
    ops: Vec<Op>,
    op_keys: HashMap<String, OpId>,
    inputs: Vec<(String, TensorType)>,
}

/// What the analysis knows of one e-class.
#[derive(Clone, Debug, Default)]
pub struct Data {
    /// `None` for leaves that are not tensors (`none`, permutations).
    pub ty: Option<TensorType>,
    /// Its value, where it is a constant (up to a size).
    pub constant: Option<Arc<Tensor>>,
    /// The axes, where the class is a permutation leaf.
    pub perm: Option<Vec<usize>>,
}

impl FusionAnalysis {
    /// The id of `value`: one per distinct value (its type and elements, bit for bit), so
    /// that equal constants are one class whatever their size — which constants are shared
    /// must not depend on the sizes a program is planned for.
    pub fn intern_constant(&mut self, value: Arc<Tensor>) -> ConstId {
        self.intern(value, true)
    }

    /// The id of `value`, one per tensor (shared only with the same `Arc`): for weights,
    /// which are many bytes to hash and equal no other.
    pub fn intern_tensor(&mut self, value: Arc<Tensor>) -> ConstId {
        self.intern(value, false)
    }

    fn intern(&mut self, value: Arc<Tensor>, by_value: bool) -> ConstId {
        let key = if by_value {
            format!("{} {:016x}", value.tensor_type(), value.content_hash())
        } else {
            format!("ptr {:p}", Arc::as_ptr(&value))
        };
        let known = self.constant_keys.get(&key).copied();
        if let Some(id) = known.filter(|&id| !by_value || self.constants[id.0 as usize] == value) {
            return id;
        }
        let id = ConstId(self.constants.len() as u32);
        self.constants.push(value);
        // Equal hashes, other values (or NaNs, which equal nothing): one of its own, unkeyed.
        if known.is_none() {
            self.constant_keys.insert(key, id);
        }
        id
    }

    /// The id of `op` (one per distinct op and attributes).
    pub fn intern_op(&mut self, op: Op) -> OpId {
        let key = op.to_string();
        if let Some(&id) = self.op_keys.get(&key) {
            return id;
        }
        let id = OpId(self.ops.len() as u32);
        self.ops.push(op);
        self.op_keys.insert(key, id);
        id
    }

    /// A new graph input's id.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> InputId {
        self.inputs.push((name.to_string(), ty));
        InputId(self.inputs.len() as u32 - 1)
    }

    /// The constant of `id`.
    pub fn constant(&self, id: ConstId) -> &Arc<Tensor> {
        &self.constants[id.0 as usize]
    }

    /// Whether every element of `value` is exactly `want` (remembered per constant).
    pub fn all_equal(&mut self, value: &Arc<Tensor>, want: f64) -> bool {
        let key = (Arc::as_ptr(value) as usize, want.to_bits());
        if let Some((_, equal)) = self.equal.get(&key) {
            return *equal;
        }
        let equal = value.to_f64().iter().all(|&x| x == want);
        self.equal.insert(key, (value.clone(), equal));
        equal
    }

    /// The op of `id`.
    pub fn op(&self, id: OpId) -> &Op {
        &self.ops[id.0 as usize]
    }

    /// The input (name, type) of `id`.
    pub fn input(&self, id: InputId) -> &(String, TensorType) {
        &self.inputs[id.0 as usize]
    }
}

fn last_axis(data: &Data) -> Option<usize> {
    data.ty.as_ref().and_then(|t| t.rank().checked_sub(1))
}

fn scalar(data: &Data) -> Option<f32> {
    data.constant.as_ref().filter(|c| c.len() == 1).map(|c| c.to_f64_vec()[0] as f32)
}

/// The IR op `node` stands for and the classes that are its IR inputs, given the data of
/// its children. `None` for leaves and for the pattern-only nodes.
pub fn ir_op<'a>(
    node: &FusionLang,
    analysis: &FusionAnalysis,
    data: impl Fn(Id) -> &'a Data,
) -> Option<(Op, Vec<Id>)> {
    use FusionLang as L;
    let present = |ids: &[Id]| -> Vec<Id> { ids.iter().copied().filter(|&i| data(i).ty.is_some()).collect() };
    let binary = |op, c: &[Id; 2]| Some((Op::Binary(op), c.to_vec()));
    let unary = |op, c: &[Id; 1]| Some((Op::Unary(op), c.to_vec()));
    let reduce = |op, c: &[Id; 1]| {
        let axis = last_axis(data(c[0]))?;
        Some((Op::Reduce { op, axes: vec![axis], keep_dims: true }, c.to_vec()))
    };
    match node {
        L::Add(c) => binary(BinaryOp::Add, c),
        L::Sub(c) => binary(BinaryOp::Sub, c),
        L::Mul(c) => binary(BinaryOp::Mul, c),
        L::Div(c) => binary(BinaryOp::Div, c),
        L::Pow(c) => binary(BinaryOp::Pow, c),
        L::Neg(c) => unary(UnaryOp::Neg, c),
        L::Sqrt(c) => unary(UnaryOp::Sqrt, c),
        L::Recip(c) => unary(UnaryOp::Reciprocal, c),
        L::Exp(c) => unary(UnaryOp::Exp, c),
        L::Erf(c) => unary(UnaryOp::Erf, c),
        L::Tanh(c) => unary(UnaryOp::Tanh, c),
        L::IsNaN(c) => unary(UnaryOp::IsNaN, c),
        L::NanToZero(c) => unary(UnaryOp::NanToZero, c),
        L::Gelu(c) => unary(UnaryOp::Gelu, c),
        L::GeluTanh(c) => unary(UnaryOp::GeluTanh, c),
        L::RotateHalf(c) => Some((Op::RotateHalf, c.to_vec())),
        L::Mean(c) => reduce(ReduceOp::Mean, c),
        L::Sum(c) => reduce(ReduceOp::Sum, c),
        L::Max(c) => reduce(ReduceOp::Max, c),
        L::Softmax(c) => Some((Op::Softmax { axis: last_axis(data(c[0]))? }, c.to_vec())),
        L::MatMul(c) => Some((Op::MatMul, c.to_vec())),
        L::Where(c) => Some((Op::Where, c.to_vec())),
        L::Dropout(c) => Some((Op::Dropout, c.to_vec())),
        L::Identity(c) => Some((Op::Identity, c.to_vec())),
        L::Transpose([x, p]) => Some((Op::Transpose { perm: data(*p).perm.clone()? }, vec![*x])),
        L::LayerNorm([x, g, b, eps]) => {
            if data(*g).ty.is_none() && data(*b).ty.is_some() {
                return None;
            }
            let op = Op::LayerNorm { axis: last_axis(data(*x))?, epsilon: scalar(data(*eps))? };
            Some((op, present(&[*x, *g, *b])))
        }
        L::RmsNorm([x, g, eps]) => {
            let op =
                Op::RmsNorm { axis: last_axis(data(*x))?, epsilon: scalar(data(*eps))?, deviation: false };
            Some((op, present(&[*x, *g])))
        }
        L::Attention([q, k, v, m, s]) | L::AttentionNanToZero([q, k, v, m, s]) => {
            let nan_to_zero = matches!(node, L::AttentionNanToZero(_));
            let op = Op::Attention { scale: scalar(data(*s))?, nan_to_zero };
            Some((op, present(&[*q, *k, *v, *m])))
        }
        L::Other(op, children) => Some((analysis.ops[op.0 as usize].clone(), children.clone())),
        L::Variance(_) | L::SoftmaxNanToZero(_) | L::Absent | L::Const(_) | L::Input(_) | L::Perm(_) => None,
    }
}

impl Analysis<FusionLang> for FusionAnalysis {
    type Data = Data;

    fn make(egraph: &mut FusionGraph, enode: &FusionLang, _id: Id) -> Data {
        let analysis = &egraph.analysis;
        let data = |id: Id| &egraph[id].data;
        match enode {
            FusionLang::Const(c) => {
                let value = analysis.constant(*c).clone();
                Data { ty: Some(value.tensor_type()), constant: Some(value), perm: None }
            }
            FusionLang::Input(i) => Data { ty: Some(analysis.input(*i).1.clone()), ..Data::default() },
            FusionLang::Perm(p) => Data { perm: Some(p.0.clone()), ..Data::default() },
            FusionLang::Variance([x]) => {
                let ty = data(*x).ty.as_ref().map(|t| {
                    let mut shape = t.shape.clone();
                    if let Some(last) = shape.last_mut() {
                        *last = 1;
                    }
                    TensorType::new(t.dtype, shape)
                });
                Data { ty, ..Data::default() }
            }
            FusionLang::SoftmaxNanToZero([x]) => Data { ty: data(*x).ty.clone(), ..Data::default() },
            _ => {
                let Some((op, inputs)) = ir_op(enode, analysis, data) else { return Data::default() };
                let types: Option<Vec<&TensorType>> = inputs.iter().map(|&i| data(i).ty.as_ref()).collect();
                let ty = types.and_then(|t| ops::infer(&op, &t).ok());
                let values: Option<Vec<&Tensor>> =
                    inputs.iter().map(|&i| data(i).constant.as_deref()).collect();
                // A small constant expanded stays a view, as the passes keep it
                // ([`crate::ir::UNIFORM_ELEMENTS`]).
                let kept_expanded = |t: &TensorType, values: &[&Tensor]| {
                    matches!(op, crate::ir::Op::Expand { .. })
                        && (t.dtype.is_float() || t.dtype == crate::ir::DType::Bool)
                        && t.len() >= crate::ir::UNIFORM_ELEMENTS
                        && values.first().is_some_and(|v| v.len() < t.len())
                };
                let constant = match (&ty, values) {
                    (Some(t), Some(values))
                        if t.len() <= FOLD_LIMIT && !inputs.is_empty() && !kept_expanded(t, &values) =>
                    {
                        ops::evaluate(&op, &values).ok().map(Arc::new)
                    }
                    _ => None,
                };
                Data { ty, constant, perm: None }
            }
        }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        let mut changed = DidMerge(false, false);
        if a.ty.is_none() && b.ty.is_some() {
            a.ty = b.ty;
            changed.0 = true;
        }
        if a.constant.is_none() && b.constant.is_some() {
            a.constant = b.constant;
            changed.0 = true;
        } else if a.constant.is_some() && b.constant.is_none() {
            changed.1 = true;
        }
        if a.perm.is_none() && b.perm.is_some() {
            a.perm = b.perm;
            changed.0 = true;
        }
        changed
    }

    fn modify(egraph: &mut FusionGraph, id: Id) {
        let Some(value) = egraph[id].data.constant.clone() else { return };
        if egraph[id].nodes.iter().any(|n| matches!(n, FusionLang::Const(_))) {
            return;
        }
        let c = egraph.analysis.intern_constant(value);
        let leaf = egraph.add(FusionLang::Const(c));
        egraph.union(id, leaf);
    }
}
