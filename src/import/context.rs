//! The context one ONNX node is translated in: its inputs as IR values, its attributes, and
//! `add`, which folds any op whose inputs are all constants into a constant. That folding is
//! what turns exporters' shape sub-graphs (Shape → Gather → Concat → Reshape) into constants.

use std::path::Path;
use std::sync::Arc;

use tract_onnx::pb::{NodeProto, TensorProto};

use super::error::ImportError;
use super::tensor::from_tract;
use crate::ir::{self, Graph, NodeId, Op, Origin, Tensor, TensorType};

pub(crate) struct NodeCtx<'a> {
    pub graph: &'a mut Graph,
    pub proto: &'a NodeProto,
    /// One entry per listed input; `None` where ONNX leaves an optional input empty.
    pub inputs: Vec<Option<NodeId>>,
    pub opset: i64,
    pub path: &'a Path,
}

pub(crate) type Translated = Result<Vec<NodeId>, ImportError>;

impl NodeCtx<'_> {
    /// The node's name, or its first output's name for unnamed nodes.
    pub fn name(&self) -> String {
        node_name(self.proto)
    }

    pub fn op_type(&self) -> &str {
        &self.proto.op_type
    }

    pub fn error(&self, message: impl Into<String>) -> ImportError {
        ImportError::Node {
            path: self.path.to_path_buf(),
            node: self.name(),
            op_type: self.proto.op_type.clone(),
            opset: self.opset,
            message: message.into(),
        }
    }

    fn origin(&self) -> Origin {
        Origin::new(self.name(), self.proto.op_type.clone())
    }

    pub fn input(&self, i: usize) -> Result<NodeId, ImportError> {
        self.opt_input(i).ok_or_else(|| self.error(format!("input {i} is required")))
    }

    pub fn opt_input(&self, i: usize) -> Option<NodeId> {
        self.inputs.get(i).copied().flatten()
    }

    pub fn ty(&self, i: usize) -> Result<TensorType, ImportError> {
        Ok(self.graph.node(self.input(i)?).ty.clone())
    }

    pub fn rank(&self, i: usize) -> Result<usize, ImportError> {
        Ok(self.ty(i)?.rank())
    }

    /// Input `i`'s value, which must be known at compile time (after folding).
    pub fn const_input(&self, i: usize, what: &str) -> Result<Arc<Tensor>, ImportError> {
        let id = self.input(i)?;
        self.graph.constant(id).cloned().ok_or_else(|| {
            self.error(format!(
                "input {i} ('{}', the {what}) must be a constant after folding, but it depends on a graph input",
                self.proto.input[i]
            ))
        })
    }

    pub fn opt_const_ints(&self, i: usize, what: &str) -> Result<Option<Vec<i64>>, ImportError> {
        match self.opt_input(i) {
            Some(_) => Ok(Some(self.const_input(i, what)?.to_i64_vec())),
            None => Ok(None),
        }
    }

    pub fn const_ints(&self, i: usize, what: &str) -> Result<Vec<i64>, ImportError> {
        Ok(self.const_input(i, what)?.to_i64_vec())
    }

    fn attr<'b, T: tract_onnx::pb_helpers::AttrScalarType<'b>>(
        &'b self,
        name: &str,
    ) -> Result<Option<T>, ImportError> {
        self.proto.get_attr_opt(name).map_err(|e| self.error(format!("attribute {name}: {e}")))
    }

    pub fn attr_int(&self, name: &str) -> Result<Option<i64>, ImportError> {
        self.attr(name)
    }

    pub fn attr_float(&self, name: &str) -> Result<Option<f32>, ImportError> {
        self.attr(name)
    }

    pub fn attr_string(&self, name: &str) -> Result<Option<String>, ImportError> {
        self.attr(name)
    }

    pub fn attr_tensor(&self, name: &str) -> Result<Option<Tensor>, ImportError> {
        let Some(proto): Option<&TensorProto> = self.attr(name)? else {
            return Ok(None);
        };
        tensor_from_proto(proto, self.path)
            .map(Some)
            .map_err(|m| self.error(format!("attribute {name}: {m}")))
    }

    pub fn attr_ints(&self, name: &str) -> Result<Option<Vec<i64>>, ImportError> {
        self.proto.get_attr_opt_vec(name).map_err(|e| self.error(format!("attribute {name}: {e}")))
    }

    pub fn attr_floats(&self, name: &str) -> Result<Option<Vec<f32>>, ImportError> {
        self.proto.get_attr_opt_vec(name).map_err(|e| self.error(format!("attribute {name}: {e}")))
    }

    /// `axis` (negative counts from the end) as an index into a rank-`rank` shape.
    pub fn axis(&self, axis: i64, rank: usize) -> Result<usize, ImportError> {
        let resolved = if axis < 0 { axis + rank as i64 } else { axis };
        if resolved < 0 || resolved >= rank as i64 {
            return Err(self.error(format!("axis {axis} is out of range for rank {rank}")));
        }
        Ok(resolved as usize)
    }

    pub fn axes(&self, axes: &[i64], rank: usize) -> Result<Vec<usize>, ImportError> {
        axes.iter().map(|&a| self.axis(a, rank)).collect()
    }

    /// Adds `op` on `inputs` as the value of output 0.
    /// The name of the node's first output (what [`NodeCtx::add`] names its value).
    pub fn output_name(&self) -> String {
        self.proto.output.first().cloned().unwrap_or_default()
    }

    pub fn add(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId, ImportError> {
        let name = self.output_name();
        self.add_named(op, inputs, &name)
    }

    /// Adds `op` on `inputs` as value `name`; folds it to a constant if every input is one.
    pub fn add_named(&mut self, op: Op, inputs: &[NodeId], name: &str) -> Result<NodeId, ImportError> {
        let constants: Option<Vec<&Arc<Tensor>>> = inputs.iter().map(|&i| self.graph.constant(i)).collect();
        if let (Some(values), false) = (constants, inputs.is_empty()) {
            let ty = self.graph.infer(&op, inputs).map_err(|m| self.error(m))?;
            self.check_constant_size(&ty.shape)?;
            let args: Vec<&Tensor> = values.iter().map(|t| t.as_ref()).collect();
            let value = ir::ops::evaluate(&op, &args).map_err(|m| self.error(m))?;
            return self.folded(value, &ty.shape, name);
        }
        // Constants some of which are kept expanded: a pointwise op of them is computed on
        // what is expanded (its broadcast gives the same values), and a view of one value is
        // that value.
        let sources: Option<Vec<Tensor>> = inputs.iter().map(|&i| self.expanded_source(i)).collect();
        if let (Some(sources), false) = (sources, inputs.is_empty()) {
            let ty = self.graph.infer(&op, inputs).map_err(|m| self.error(m))?;
            let value = if op.is_pointwise() {
                let args: Vec<&Tensor> = sources.iter().collect();
                Some(ir::ops::evaluate(&op, &args).map_err(|m| self.error(m))?)
            } else if sources.iter().all(|s| s.len() == 1)
                && (op.is_view()
                    || (matches!(op, Op::Concat { .. }) && sources.windows(2).all(|w| w[0] == w[1])))
            {
                Some(sources[0].clone())
            } else {
                None
            };
            if let Some(value) = value {
                let value = match value.shape().len() == ty.rank() {
                    true => value,
                    false => value
                        .reshaped(&vec![1; ty.rank()])
                        .ok_or_else(|| self.error("a view of one value"))?,
                };
                return self.expanded(value, &ty.shape, name);
            }
        }
        let origin = self.origin();
        self.graph.add_op(op, inputs, name, origin).map_err(|e| match e {
            ir::IrError::Op { message, .. } => self.error(message),
            other => self.error(other.to_string()),
        })
    }

    /// A folded `value` of `shape`: a constant, or where it is large and a broadcast of a
    /// smaller one ([`ir::UNIFORM_ELEMENTS`]), that smaller one expanded.
    fn folded(&mut self, value: Tensor, shape: &[usize], name: &str) -> Result<NodeId, ImportError> {
        // Floating-point and boolean values only: integer constants are shapes, axes and
        // indices that ops read at import.
        let kept = value.dtype().is_float() || value.dtype() == ir::DType::Bool;
        if kept && value.len() >= ir::UNIFORM_ELEMENTS {
            if let Some(source) = value.broadcast_source() {
                return self.expanded(source, shape, name);
            }
        }
        Ok(self.constant_named(value, name))
    }

    /// `value` (of the rank of `shape`, a broadcast of it) expanded to `shape`: a view of a
    /// small constant where a constant of `shape` would hold the same values many times.
    pub fn expanded(&mut self, value: Tensor, shape: &[usize], name: &str) -> Result<NodeId, ImportError> {
        if value.shape() == shape {
            return self.folded(value, shape, name);
        }
        let small = self.constant_named(value, &format!("{name}.value"));
        let origin = self.origin();
        self.graph
            .add_op(Op::Expand { shape: shape.to_vec() }, &[small], name, origin)
            .map_err(|e| self.error(e.to_string()))
    }

    /// The values of `id` where it is a constant, or a constant expanded
    /// ([`NodeCtx::expanded`]): that constant, of `id`'s rank.
    fn expanded_source(&self, id: NodeId) -> Option<Tensor> {
        let source = match self.graph.node(id).op {
            Op::Expand { .. } => self.graph.inputs_of(id)[0],
            _ => id,
        };
        let value = self.graph.constant(source)?;
        (value.shape().len() == self.graph.node(id).ty.rank()).then(|| value.as_ref().clone())
    }

    /// An error unless a constant of `shape` stays within [`MAX_CONSTANT_ELEMENTS`]: what a
    /// file can make the import allocate by folding is capped, whatever sizes it declares.
    pub fn check_constant_size(&self, shape: &[usize]) -> Result<(), ImportError> {
        match ir::element_count(shape) {
            Some(n) if n <= MAX_CONSTANT_ELEMENTS => Ok(()),
            _ => Err(self.error(format!(
                "this would make a constant of shape {shape:?}, more than the {MAX_CONSTANT_ELEMENTS} elements the import materialises"
            ))),
        }
    }

    /// Adds a constant as the value of output 0.
    pub fn constant(&mut self, value: Tensor) -> NodeId {
        let name = self.proto.output.first().cloned().unwrap_or_default();
        self.constant_named(value, &name)
    }

    pub fn constant_named(&mut self, value: Tensor, name: &str) -> NodeId {
        let origin = self.origin();
        self.graph.add_constant(name, Arc::new(value), origin)
    }
}

/// The most elements of a constant the import makes itself (folding shape arithmetic,
/// `ConstantOfShape`, `Range`): 2^28, 1 GiB of f32.
pub const MAX_CONSTANT_ELEMENTS: usize = 1 << 28;

pub(crate) fn node_name(proto: &NodeProto) -> String {
    if !proto.name.is_empty() {
        return proto.name.clone();
    }
    proto.output.first().cloned().unwrap_or_else(|| format!("<unnamed {}>", proto.op_type))
}

/// Where an external-data tensor's bytes are, checked to lie inside the model's directory:
/// a relative path without `..`, which after resolving symbolic links is still under that
/// directory. `None` for a tensor stored in the file itself.
fn external_location(proto: &TensorProto, path: &Path) -> Result<Option<std::path::PathBuf>, String> {
    // TensorProto.DataLocation.EXTERNAL
    if proto.data_location != Some(1) {
        return Ok(None);
    }
    let location = proto
        .external_data
        .iter()
        .find(|e| e.key == "location")
        .map(|e| e.value.as_str())
        .ok_or("external data without a 'location'")?;
    let relative = Path::new(location);
    let leaves = relative
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
    if location.is_empty() || leaves {
        return Err(format!(
            "external data location '{location}' leaves the model's directory (only relative paths without '..' are read)"
        ));
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let file = dir.join(relative);
    let (real_dir, real_file) = (dir.canonicalize(), file.canonicalize());
    match (real_dir, real_file) {
        (Ok(d), Ok(f)) if f.starts_with(&d) => Ok(Some(file)),
        (Ok(_), Ok(f)) => Err(format!(
            "external data location '{location}' resolves to {}, outside the model's directory",
            f.display()
        )),
        (_, Err(e)) => Err(format!("external data '{}': {e}", file.display())),
        (Err(e), _) => Err(format!("model directory '{}': {e}", dir.display())),
    }
}

/// Loads a `TensorProto` (embedded or external data) as an IR tensor. External data must lie
/// inside the model's directory ([`external_location`]).
pub(crate) fn tensor_from_proto(proto: &TensorProto, path: &Path) -> Result<Tensor, String> {
    external_location(proto, path)?;
    // tract reads these element types (raw bytes, inline or external, or typed fields) and
    // stops the process (`unimplemented!`) on others: string, complex, bfloat16, float8, 4-bit.
    // Their sizes in bytes, by ONNX code: FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64,
    // BOOL, FLOAT16, DOUBLE, UINT32, UINT64.
    const READABLE: [(i32, usize); 12] =
        [(1, 4), (2, 1), (3, 1), (4, 2), (5, 2), (6, 4), (7, 8), (9, 1), (10, 2), (11, 8), (12, 4), (13, 8)];
    let Some(&(_, size)) = READABLE.iter().find(|(code, _)| *code == proto.data_type) else {
        return Err(format!("ONNX element type {} is not supported here", proto.data_type));
    };
    // tract sizes the tensor as the element size times each dim in turn and panics where that
    // overflows (even with a 0 among the dims): an error here instead.
    let bytes =
        proto.dims.iter().try_fold(size, |n, &d| usize::try_from(d).ok().and_then(|d| n.checked_mul(d)));
    if bytes.is_none_or(|b| b > isize::MAX as usize) {
        return Err(format!("dims {:?} are negative or too large", proto.dims));
    }
    let dir = path.parent().and_then(|d| d.to_str());
    let resolver = tract_onnx::data_resolver::MmapDataResolver;
    let t = tract_onnx::tensor::load_tensor(&resolver, proto, dir).map_err(|e| format!("{e:#}"))?;
    from_tract(&t)
}
