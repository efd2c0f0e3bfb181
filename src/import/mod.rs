//! ONNX import: tract-onnx parses the file (weights embedded or external); each node is
//! translated into IR ops through a table of op families; input shapes are made concrete
//! from the model, `--input` and `--dim`; shape sub-graphs fold into constants.

mod context;
mod error;
mod ops;
mod options;
mod raw;
mod reference;
mod tensor;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tract_onnx::pb::{self, ModelProto};
use tract_onnx::prelude::Framework;

pub use error::ImportError;
pub use ops::SHAPE_OPS;
pub use options::{resolve_sums, DimSpec, ImportOptions, InputSpec};
pub use reference::{fixed_output_dims, in_reference_run, run_tract, TractPlan};
pub use tensor::from_tract as tensor_from_tract;

use crate::ir::{self, DType, Graph, NodeId, Origin, TensorType};
pub(crate) use context::tensor_from_proto;
use context::{node_name, NodeCtx};

/// One dimension of an input as the model declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeclaredDim {
    /// A number.
    Fixed(usize),
    /// A name (`batch`, `sequence_length`), given a size with `--dim`.
    Symbolic(String),
    /// Neither: the model leaves it open.
    Unknown,
}

/// A graph input (or output) as the ONNX file declares it.
#[derive(Clone, Debug)]
pub struct DeclaredInput {
    /// Its name.
    pub name: String,
    /// Its element type (`None` for one fusec does not take).
    pub dtype: Option<DType>,
    /// `None` where the model gives no shape at all.
    pub dims: Option<Vec<DeclaredDim>>,
}

/// An op the importer cannot translate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// The node's name.
    pub node: String,
    /// Its op_type.
    pub op_type: String,
    /// Its domain (empty for the default ONNX domain).
    pub domain: String,
}

/// What the ONNX file holds, before any shape is made concrete.
#[derive(Clone, Debug)]
pub struct OnnxSummary {
    /// The file.
    pub path: PathBuf,
    /// The opset of the default domain.
    pub opset: i64,
    /// The exporter that wrote it, with its version.
    pub producer: String,
    /// The graph's inputs (initializers listed as inputs excluded).
    pub inputs: Vec<DeclaredInput>,
    /// The graph's output names.
    pub outputs: Vec<String>,
    /// The graph's outputs as declared: names, element types, shapes.
    pub declared_outputs: Vec<DeclaredInput>,
    /// Nodes in the graph.
    pub node_count: usize,
    /// Node count per `op_type`.
    pub op_histogram: BTreeMap<String, usize>,
    /// Elements and bytes of the floating-point initializers (the weights).
    pub parameters: usize,
    /// See `parameters`.
    pub parameter_bytes: usize,
    /// Nodes of ops the importer cannot translate.
    pub unsupported: Vec<UnsupportedOp>,
}

/// An imported model: the IR graph with concrete shapes, and what the file held.
#[derive(Clone, Debug)]
pub struct Model {
    /// The IR graph.
    pub graph: Graph,
    /// What the file held.
    pub onnx: OnnxSummary,
    /// ONNX nodes whose every output folded into a constant at import.
    pub folded_nodes: usize,
}

impl Model {
    /// IR nodes translated from a shape-only ONNX op that are still computed at run time.
    pub fn remaining_shape_ops(&self) -> usize {
        self.graph
            .node_ids()
            .filter(|&id| {
                let node = self.graph.node(id);
                SHAPE_OPS.contains(&node.origin.op_type.as_str()) && !matches!(node.op, ir::Op::Constant(_))
            })
            .count()
    }
}

/// The ONNX op types (default domain) the importer translates, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut ops: Vec<&'static str> = ops::registry().keys().copied().collect();
    ops.sort_unstable();
    ops
}

/// Reads and decodes an ONNX file, with errors that say what is wrong with it.
pub fn load_proto(path: &Path) -> Result<ModelProto, ImportError> {
    Ok(Source::open(path)?.proto)
}

/// An ONNX file mapped into memory and decoded without the bytes of its large initializers,
/// which stay in the mapping until [`Source::initializer`] reads them (see `raw.rs`).
struct Source {
    proto: ModelProto,
    /// Per initializer of the graph, in order: where its left-out raw data is in `map`.
    raw: Vec<Option<Range<usize>>>,
    map: memmap2::Mmap,
}

impl Source {
    fn open(path: &Path) -> Result<Source, ImportError> {
        let read = |source| ImportError::Read { path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(read)?;
        if file.metadata().map_err(read)?.len() == 0 {
            return Err(ImportError::Empty { path: path.to_path_buf() });
        }
        // SAFETY: the mapping is read-only and private; like any reader, the import sees
        // garbage (or the process a SIGBUS) if another process truncates the file meanwhile.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(read)?;
        let decode = |message: String| ImportError::Decode { path: path.to_path_buf(), message };
        let stripped = raw::strip(&map).map_err(decode)?;
        let proto = tract_onnx::onnx()
            .proto_model_for_read(&mut stripped.model.as_slice())
            .map_err(|e| decode(format!("{e:#}")))?;
        if proto.graph.is_none() {
            return Err(ImportError::NoGraph { path: path.to_path_buf() });
        }
        Ok(Source { proto, raw: stripped.raw, map })
    }

    /// Initializer `index` of the graph (`t`) as an IR tensor. Raw data left in the mapping
    /// is converted from there and its pages given back, so that the file's weights and the
    /// IR's are not both in memory.
    fn initializer(&self, index: usize, t: &pb::TensorProto, path: &Path) -> Result<ir::Tensor, String> {
        let Some(range) = self.raw.get(index).cloned().flatten() else {
            return tensor_from_proto(t, path);
        };
        let bytes = &self.map[range.clone()];
        let tensor = match raw::tensor(t.data_type, &t.dims, bytes) {
            Some(tensor) => tensor,
            None => {
                let mut whole = t.clone();
                whole.raw_data = bytes.to_vec();
                tensor_from_proto(&whole, path)
            }
        };
        // SAFETY: a read-only private file mapping: dropped pages read back from the file.
        #[cfg(unix)]
        let _ = unsafe {
            self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, range.start, range.len())
        };
        tensor
    }
}

fn graph_of<'a>(proto: &'a ModelProto, path: &Path) -> Result<&'a pb::GraphProto, ImportError> {
    proto.graph.as_ref().ok_or_else(|| ImportError::NoGraph { path: path.to_path_buf() })
}

fn opset_of(proto: &ModelProto) -> i64 {
    proto.opset_import.iter().find(|o| o.domain.is_empty() || o.domain == "ai.onnx").map_or(1, |o| o.version)
}

fn declared_input(info: &pb::ValueInfoProto) -> DeclaredInput {
    use pb::tensor_shape_proto::dimension::Value;
    use pb::type_proto::Value as TypeValue;
    let tensor = info.r#type.as_ref().and_then(|t| match &t.value {
        Some(TypeValue::TensorType(tt)) => Some(tt),
        _ => None,
    });
    let dtype = tensor.and_then(|t| DType::from_onnx_code(i64::from(t.elem_type)));
    let dims = tensor.and_then(|t| t.shape.as_ref()).map(|shape| {
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(Value::DimValue(v)) if *v >= 0 => DeclaredDim::Fixed(*v as usize),
                Some(Value::DimParam(p)) if !p.is_empty() => DeclaredDim::Symbolic(p.clone()),
                _ => DeclaredDim::Unknown,
            })
            .collect()
    });
    DeclaredInput { name: info.name.clone(), dtype, dims }
}

/// Summarises an ONNX file: inputs, op histogram, weights, unsupported ops. Needs no shapes.
pub fn summarize(path: &Path) -> Result<OnnxSummary, ImportError> {
    let proto = load_proto(path)?;
    summarize_proto(&proto, path)
}

fn summarize_proto(proto: &ModelProto, path: &Path) -> Result<OnnxSummary, ImportError> {
    let graph = graph_of(proto, path)?;
    let initializers: std::collections::HashSet<&str> =
        graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let mut op_histogram = BTreeMap::new();
    let mut unsupported = Vec::new();
    for node in &graph.node {
        *op_histogram.entry(node.op_type.clone()).or_insert(0) += 1;
        let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        if !default_domain || !ops::registry().contains_key(node.op_type.as_str()) {
            unsupported.push(UnsupportedOp {
                node: node_name(node),
                op_type: node.op_type.clone(),
                domain: node.domain.clone(),
            });
        }
    }
    let (mut parameters, mut parameter_bytes) = (0, 0);
    for t in &graph.initializer {
        if let Some(dtype) = DType::from_onnx_code(i64::from(t.data_type)).filter(|d| d.is_float()) {
            let count = t.dims.iter().map(|&d| d.max(0) as usize).product::<usize>();
            parameters += count;
            parameter_bytes += count * dtype.size_bytes();
        }
    }
    Ok(OnnxSummary {
        path: path.to_path_buf(),
        opset: opset_of(proto),
        producer: format!("{} {}", proto.producer_name, proto.producer_version).trim().to_string(),
        inputs: graph
            .input
            .iter()
            .filter(|i| !initializers.contains(i.name.as_str()))
            .map(declared_input)
            .collect(),
        outputs: graph.output.iter().map(|o| o.name.clone()).collect(),
        declared_outputs: graph.output.iter().map(declared_input).collect(),
        node_count: graph.node.len(),
        op_histogram,
        parameters,
        parameter_bytes,
        unsupported,
    })
}

/// The most elements one input may have (2^36: 256 GiB of f32, beyond any one GPU), so that
/// sizes computed from input shapes cannot overflow.
pub const MAX_INPUT_ELEMENTS: usize = 1 << 36;

/// The concrete type of every input, from the model, `--input` and `--dim`.
fn resolve_inputs(
    summary: &OnnxSummary,
    options: &ImportOptions,
) -> Result<Vec<(String, TensorType)>, ImportError> {
    let path = summary.path.clone();
    let names = || summary.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ");
    for spec in &options.inputs {
        if !summary.inputs.iter().any(|i| i.name == spec.name) {
            let suggestion =
                crate::suggest::did_you_mean(&spec.name, summary.inputs.iter().map(|i| i.name.as_str()));
            return Err(ImportError::UnknownInput {
                path,
                name: spec.name.clone(),
                available: names(),
                suggestion,
            });
        }
    }
    let symbols: Vec<&str> = summary
        .inputs
        .iter()
        .flat_map(|i| i.dims.iter().flatten())
        .filter_map(|d| match d {
            DeclaredDim::Symbolic(s) => Some(s.as_str()),
            _ => None,
        })
        .fold(Vec::new(), |mut seen, s| {
            // Each name once, in the order the inputs declare them.
            if !seen.contains(&s) {
                seen.push(s);
            }
            seen
        });
    for symbol in options.dims.keys() {
        if !symbols.contains(&symbol.as_str()) {
            let available = if symbols.is_empty() { "none".to_string() } else { symbols.join(", ") };
            let suggestion = crate::suggest::did_you_mean(symbol, symbols.iter().copied());
            return Err(ImportError::UnknownDim { path, symbol: symbol.clone(), available, suggestion });
        }
    }
    // Every symbolic dim not given, as flags that would compile (for the error below).
    let mut seen = std::collections::HashSet::new();
    let not_given: Vec<&str> =
        symbols.iter().copied().filter(|s| !options.dims.contains_key(*s) && seen.insert(*s)).collect();
    let missing = match not_given.as_slice() {
        [] | [_] => String::new(),
        many => {
            let flags: Vec<String> = many.iter().map(|s| format!("--dim {s}=1")).collect();
            format!(" (the model's symbolic dims not given: {}; e.g. {})", many.join(", "), flags.join(" "))
        }
    };
    let mut resolved = Vec::new();
    for input in summary.inputs.iter().filter(|i| !options.constants.iter().any(|(n, _)| *n == i.name)) {
        let fail = |message: String| ImportError::InputShape {
            path: path.clone(),
            input: input.name.clone(),
            message,
        };
        let spec = options.inputs.iter().find(|s| s.name == input.name);
        let dtype = match (spec.and_then(|s| s.dtype), input.dtype) {
            (Some(given), Some(declared)) if given != declared => {
                return Err(fail(format!("--input gives {given}, the model declares {declared}")))
            }
            (Some(d), _) | (None, Some(d)) => d,
            (None, None) => {
                return Err(fail(
                    "the model declares no supported element type; give one with --input NAME:SHAPE:TYPE"
                        .into(),
                ))
            }
        };
        let shape = match (spec, &input.dims) {
            (Some(spec), Some(dims)) => {
                if spec.shape.len() != dims.len() {
                    return Err(fail(format!(
                        "--input gives rank {} ({:?}), the model declares rank {}",
                        spec.shape.len(),
                        spec.shape,
                        dims.len()
                    )));
                }
                for (axis, (given, declared)) in spec.shape.iter().zip(dims).enumerate() {
                    if let DeclaredDim::Fixed(d) = declared {
                        if d != given {
                            return Err(fail(format!(
                                "--input gives {given} for dimension {axis}, which the model fixes at {d}"
                            )));
                        }
                    }
                }
                spec.shape.clone()
            }
            (Some(spec), None) => spec.shape.clone(),
            (None, None) => {
                return Err(fail("the model declares no shape; give one with --input NAME:SHAPE".into()))
            }
            (None, Some(dims)) => dims
                .iter()
                .enumerate()
                .map(|(axis, d)| match d {
                    DeclaredDim::Fixed(v) => Ok(*v),
                    DeclaredDim::Symbolic(s) => {
                        options.dims.get(s).copied().ok_or_else(|| ImportError::SymbolicDim {
                            path: path.clone(),
                            input: input.name.clone(),
                            axis,
                            symbol: s.clone(),
                            missing: format!("{missing}{}", cache_sum_hint(summary, s).unwrap_or_default()),
                        })
                    }
                    DeclaredDim::Unknown => Err(ImportError::SymbolicDim {
                        path: path.clone(),
                        input: input.name.clone(),
                        axis,
                        symbol: "?".into(),
                        missing: String::new(),
                    }),
                })
                .collect::<Result<_, _>>()?,
        };
        if ir::element_count(&shape).is_none_or(|n| n > MAX_INPUT_ELEMENTS) {
            return Err(fail(format!(
                "shape {shape:?} has more than the {MAX_INPUT_ELEMENTS} elements an input may have"
            )));
        }
        resolved.push((input.name.clone(), TensorType::new(dtype, shape)));
    }
    Ok(resolved)
}

/// Imports the ONNX model at `path` with concrete input shapes.
pub fn import(path: &Path, options: &ImportOptions) -> Result<Model, ImportError> {
    let mut models = import_each(path, std::slice::from_ref(options))?;
    models.pop().ok_or_else(|| ImportError::NoGraph { path: path.to_path_buf() })
}

/// [`import`] with each of `options` (other sizes of the same model): the file is read and
/// its weights converted once, and shared by the graphs.
pub fn import_each(path: &Path, options: &[ImportOptions]) -> Result<Vec<Model>, ImportError> {
    with_translator(path, |translate| {
        // Each size translated (and its shape sub-graphs folded) on its own core.
        crate::parallel::map(options, translate).into_iter().collect()
    })?
}

/// Calls `work` with a translator of the model at `path` at any sizes: the file is read and
/// its weights converted once, shared by every graph the translator makes, and each graph is
/// made when asked for (a caller that plans one size before the next holds one size's
/// folded constants at a time).
pub fn with_translator<R>(
    path: &Path,
    work: impl FnOnce(&(dyn Fn(&ImportOptions) -> Result<Model, ImportError> + Sync)) -> R,
) -> Result<R, ImportError> {
    let source = Source::open(path)?;
    let proto = &source.proto;
    let summary = summarize_proto(proto, path)?;
    if !summary.unsupported.is_empty() {
        let list: Vec<String> = summary
            .unsupported
            .iter()
            .map(|u| {
                let domain = if u.domain.is_empty() { String::new() } else { format!("{}::", u.domain) };
                format!("node '{}' ({domain}{}, opset {})", u.node, u.op_type, summary.opset)
            })
            .collect();
        return Err(ImportError::Unsupported {
            path: path.to_path_buf(),
            count: list.len(),
            list: list.join(", "),
        });
    }
    let onnx_graph = graph_of(proto, path)?;
    // Converted on a few cores (the file's bytes to IR tensors), kept in the file's order.
    let indexed: Vec<(usize, &pb::TensorProto)> = onnx_graph.initializer.iter().enumerate().collect();
    let tensors = crate::parallel::map_on(crate::parallel::CONVERSIONS, &indexed, |&(index, t)| {
        source.initializer(index, t, path)
    });
    let mut initializers = Vec::with_capacity(indexed.len());
    for ((_, t), value) in indexed.into_iter().zip(tensors) {
        let value = value.map_err(|message| ImportError::Initializer {
            path: path.to_path_buf(),
            name: t.name.clone(),
            message,
        })?;
        initializers.push((t.name.as_str(), Arc::new(value)));
    }
    Ok(work(&|options: &ImportOptions| translate(path, onnx_graph, &summary, &initializers, options)))
}

/// The IR graph of `onnx_graph` with `options`' shapes, its initializers already converted.
fn translate(
    path: &Path,
    onnx_graph: &pb::GraphProto,
    summary: &OnnxSummary,
    initializers: &[(&str, Arc<ir::Tensor>)],
    options: &ImportOptions,
) -> Result<Model, ImportError> {
    let summary = summary.clone();
    let mut graph = Graph::new();
    let mut values: HashMap<String, NodeId> = HashMap::new();
    for &(name, ref value) in initializers {
        let id = graph.add_constant(name, value.clone(), Origin::new(name, "Initializer"));
        values.insert(name.to_string(), id);
    }
    for (name, value) in &options.constants {
        if !summary.inputs.iter().any(|i| i.name == *name) {
            let available = summary.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ");
            return Err(ImportError::UnknownInput {
                path: path.to_path_buf(),
                name: name.clone(),
                available,
                suggestion: crate::suggest::did_you_mean(
                    name,
                    summary.inputs.iter().map(|i| i.name.as_str()),
                ),
            });
        }
        let id = graph.add_constant(name, Arc::new(value.clone()), Origin::new(name, "FrozenInput"));
        values.insert(name.clone(), id);
    }
    for (name, ty) in resolve_inputs(&summary, options)? {
        values.insert(name.clone(), graph.add_input(&name, ty));
    }
    let mut folded_nodes = 0;
    for node in &onnx_graph.node {
        let inputs = node
            .input
            .iter()
            .map(|name| match name.as_str() {
                "" => Ok(None),
                name => values.get(name).copied().map(Some).ok_or_else(|| ImportError::Node {
                    path: path.to_path_buf(),
                    node: node_name(node),
                    op_type: node.op_type.clone(),
                    opset: summary.opset,
                    message: format!("input '{name}' is not produced by any earlier node, input or initializer (an unsupported extra output, like Dropout's mask, or a graph out of order)"),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let translate = ops::registry()[node.op_type.as_str()];
        let mut ctx = NodeCtx { graph: &mut graph, proto: node, inputs, opset: summary.opset, path };
        let outputs = translate(&mut ctx)?;
        if outputs.iter().all(|&id| graph.constant(id).is_some()) {
            folded_nodes += 1;
        }
        for (name, id) in node.output.iter().zip(outputs) {
            if !name.is_empty() {
                values.insert(name.clone(), id);
            }
        }
    }
    let mut outputs = Vec::new();
    for name in &summary.outputs {
        let id = values
            .get(name)
            .copied()
            .ok_or_else(|| ImportError::MissingOutput { path: path.to_path_buf(), name: name.clone() })?;
        outputs.push((name.clone(), id));
    }
    graph.set_outputs(outputs);
    graph.remove_unused();
    ir::verify(&graph).map_err(|source| ImportError::Ir { path: path.to_path_buf(), source })?;
    Ok(Model { graph, onnx: summary, folded_nodes })
}

/// A decoder's mask length and the two dims it adds: `(total, past, seq)` where the model
/// takes `attention_mask [batch, total]` beside cache inputs `past_key_values.* [batch, heads,
/// past, head_dim]` and `input_ids [batch, seq]`, three distinct symbols (the layout of Hugging
/// Face Optimum's and ONNX Runtime GenAI's exports, whose mask covers the cache and the new
/// tokens: `total = past + seq`).
pub fn cache_sum(summary: &OnnxSummary) -> Option<(String, String, String)> {
    let dim = |name: &dyn Fn(&str) -> bool, axis: usize| {
        summary.inputs.iter().filter(|i| name(&i.name)).find_map(|i| match i.dims.as_ref()?.get(axis)? {
            DeclaredDim::Symbolic(s) => Some(s.clone()),
            _ => None,
        })
    };
    let mask = dim(&|n| n == "attention_mask", 1)?;
    let past = dim(&|n| n.starts_with("past_key_values"), 2)?;
    let seq = dim(&|n| n == "input_ids", 1)?;
    (mask != past && mask != seq && past != seq).then_some((mask, past, seq))
}

/// The sum a decoder's mask length is ([`cache_sum`]), as the `--dim` spec that states it,
/// where `dims` give its cache's length and the new tokens' but not the mask's: what `fusec
/// compile`, `inspect`, `bench` and Python's `fusec.compile` add to the dims they are given.
pub fn inferred_cache_sum(summary: &OnnxSummary, dims: &[DimSpec]) -> Option<DimSpec> {
    let given = |symbol: &str| dims.iter().any(|d| d.symbol == symbol);
    let (mask, past, seq) = cache_sum(summary)?;
    (!given(&mask) && given(&past) && given(&seq)).then(|| DimSpec {
        symbol: mask,
        value: 0,
        low: 0,
        sum: vec![past, seq],
    })
}

/// [`inferred_cache_sum`] for the ONNX file at `model`, read only where `dims` give a cache's
/// length (a dim named `past…`; else there is nothing to infer, and `None`, as for a file that
/// cannot be read, whose import says why).
pub fn inferred_cache_sum_of(model: &Path, dims: &[DimSpec]) -> Option<DimSpec> {
    if !dims.iter().any(|d| d.symbol.starts_with("past")) {
        return None;
    }
    inferred_cache_sum(&summarize(model).ok()?, dims)
}

/// Where `symbol` is a decoder's mask length ([`cache_sum`]): the sum that it is, as the flag
/// that states it.
fn cache_sum_hint(summary: &OnnxSummary, symbol: &str) -> Option<String> {
    let (mask, past, seq) = cache_sum(summary)?;
    (mask == symbol).then(|| {
        format!(" (a decoder's mask covers its cache and the new tokens: --dim {symbol}={past}+{seq})")
    })
}
