//! Symbolic sizes (`--dim NAME=LO..HI`): every fixture planned for ranges of its dims, its
//! sizes fitted as products of the dims, checked against programs planned for one size each.

mod common;

use std::collections::HashMap;

use fusec::codegen::Step;
use fusec::import::{DimSpec, ImportOptions};
use fusec::pipeline::plan_symbolic;
use fusec::CompileOptions;

/// The ranges each fixture is planned for: batch and, for the text models, seq (the tiny
/// BERTs hold 64 positions).
fn ranges(file: &str) -> Vec<DimSpec> {
    let text = ["bert", "gpt2", "llama"].iter().any(|p| file.starts_with(p));
    let mut specs = vec!["batch=1..8".parse().unwrap()];
    if text && !common::has_cache(file) {
        specs.push("seq=1..64".parse().unwrap());
    }
    specs
}

/// The dims each fixture keeps at one size: a decoder with a cache at one decoding step (its
/// cache lengths as ranges, `total` = `past` + `seq`: `tests/cache_ranges.rs`).
fn fixed(file: &str) -> Vec<DimSpec> {
    if !common::has_cache(file) {
        return Vec::new();
    }
    ["seq=1", "past=5", "total=6"].iter().map(|d| d.parse().unwrap()).collect()
}

fn options(file: &str, dims: Vec<DimSpec>) -> CompileOptions {
    let _ = file;
    CompileOptions { import: ImportOptions::new(vec![], dims), ..Default::default() }
}

#[test]
fn every_fixture_has_symbolic_sizes_that_match_static_plans() {
    let mut report = String::new();
    for file in common::all_fixtures() {
        if file == "op_coverage.onnx" {
            continue; // no symbolic dims
        }
        let path = common::model_path(&file);
        let dims = ranges(&file);
        let all: Vec<DimSpec> = dims.iter().cloned().chain(fixed(&file)).collect();
        let (plan, symbolic) = match plan_symbolic(&path, &options(&file, all)) {
            Ok(x) => x,
            Err(e) => {
                report += &format!("{file}: ERROR {e}\n");
                continue;
            }
        };
        // The inputs carry the dims they declare.
        for binding in &plan.inputs {
            let shape = symbolic.display(binding.value);
            assert!(shape.contains("batch"), "{file}: input {} is {shape}", binding.name);
        }
        // Evaluated at sizes it was not fitted at, every shape is that of the program planned
        // for those sizes alone (with the same choices). At size 1 the passes drop size-1
        // reshapes and broadcasts, so that program has fewer nodes: those it has are compared.
        let points: &[&[usize]] =
            if dims.len() == 2 { &[&[3, 7], &[5, 13], &[1, 1]] } else { &[&[3], &[5], &[1]] };
        for values in points {
            let fixed: Vec<DimSpec> = dims
                .iter()
                .zip(values.iter())
                .map(|(d, v)| format!("{}={v}", d.symbol).parse().unwrap())
                .chain(fixed(&file))
                .collect();
            let import = ImportOptions::new(vec![], fixed);
            let model = fusec::import::import(&path, &import).unwrap();
            let options =
                CompileOptions { import, attention: symbolic.attention.clone(), ..Default::default() };
            let (single, _) = fusec::pipeline::plan_model(model, &path, &options, &mut |_| {}).unwrap();
            let ones = values.contains(&1);
            if !ones {
                assert_eq!(single.graph.node_count(), plan.graph.node_count(), "{file} at {values:?}");
            }
            // By name where a name is one node's in both programs (an op's constants and
            // decomposition steps take its output's name).
            let mut by_name: HashMap<&str, Option<&[usize]>> = HashMap::new();
            for id in single.graph.node_ids() {
                let node = single.graph.node(id);
                by_name.entry(node.name.as_str()).and_modify(|s| *s = None).or_insert(Some(&node.ty.shape));
            }
            let mut names: HashMap<&str, usize> = HashMap::new();
            for id in plan.graph.node_ids() {
                *names.entry(plan.graph.node(id).name.as_str()).or_default() += 1;
            }
            let mut compared = 0;
            for id in plan.graph.node_ids() {
                let node = plan.graph.node(id);
                let expected = if ones {
                    let unique = names.get(node.name.as_str()) == Some(&1);
                    by_name.get(node.name.as_str()).copied().flatten().filter(|_| unique)
                } else {
                    Some(single.graph.node(id).ty.shape.as_slice())
                };
                let Some(expected) = expected else { continue };
                assert_eq!(
                    symbolic.eval(id, values).as_deref(),
                    Some(expected),
                    "{file}: '{}' is {} at {values:?}",
                    node.name,
                    symbolic.display(id)
                );
                compared += 1;
            }
            assert!(compared * 2 > plan.graph.node_count(), "{file} at {values:?}: {compared} compared");
        }
        report += &format!(
            "{file}: {} of {} values symbolic\n",
            symbolic.symbolic_nodes(),
            plan.graph.node_count()
        );
    }
    println!("{report}");
}

/// One program planned for ranges, evaluated on the CPU (the reference evaluator) at points
/// of them — every shape evaluated, constants cut to their leading part, as a bundle for the
/// ranges runs it — agrees with tract on the ONNX file at each point.
#[test]
fn a_program_for_ranges_evaluated_at_several_points_matches_tract() {
    let mut report = String::new();
    for file in common::all_fixtures() {
        if file == "op_coverage.onnx" {
            continue;
        }
        let path = common::model_path(&file);
        let seq_range = common::seq_range(&file);
        let seq = if seq_range { "1..64" } else { "7" };
        for precision in [fusec::ir::DType::F32, fusec::ir::DType::F16] {
            let options = CompileOptions {
                import: common::dims_at(&file, "1..4", seq),
                precision,
                ..Default::default()
            };
            let plan = fusec::pipeline::plan_range(&path, &options).unwrap_or_else(|e| panic!("{file}: {e}"));
            let symbolic = plan.symbolic.as_ref().unwrap();
            let points: Vec<(usize, usize)> =
                if seq_range { vec![(1, 1), (3, 7), (4, 64), (2, 33)] } else { vec![(1, 7), (3, 7), (4, 7)] };
            let tolerance = if precision == fusec::ir::DType::F32 { 1e-5 } else { 1e-2 };
            for (k, &(b, s)) in points.iter().enumerate() {
                let values: Vec<usize> = if seq_range { vec![b, s] } else { vec![b] };
                let graph =
                    plan.instantiate(symbolic, &values).unwrap_or_else(|e| panic!("{file} {b}x{s}: {e}"));
                let model =
                    fusec::import::import(&path, &common::dims_at(&file, &b.to_string(), &s.to_string()))
                        .unwrap();
                let inputs = common::random_inputs(&model, 90 + k as u64);
                let feeds: HashMap<_, _> = inputs.iter().cloned().collect();
                let ours =
                    fusec::ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{file} {b}x{s}: {e}"));
                let values: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
                let theirs = fusec::import::run_tract(&path, &values).unwrap();
                for ((name, a), t) in ours.iter().zip(&theirs) {
                    assert_eq!(a.shape(), t.shape(), "{file} {b}x{s} {name}");
                    let err = fusec::ir::rel_l2(a, t);
                    assert!(err <= tolerance, "{file} {precision} at {b}x{s}: {name} rel-L2 {err:e}");
                }
            }
            report += &format!("{file} {precision}: {} points\n", points.len());
        }
    }
    println!("{report}");
}

/// A fixture compiled for batch sizes 1..4 and, where the model has a sequence, sequence
/// lengths 1..64.
fn ranged(file: &str, precision: fusec::ir::DType) -> Result<fusec::Bundle, fusec::pipeline::CompileError> {
    let options = CompileOptions {
        import: common::dims_at(file, "1..4", if common::seq_range(file) { "1..64" } else { "1" }),
        precision,
        arch: Some("sm_90".into()),
        ..Default::default()
    };
    fusec::compile(&common::model_path(file), &options)
}

/// Every fixture compiles (NVRTC included, where it is installed) for ranges of its dims; the
/// bundle names them, and its inputs follow them.
#[test]
fn every_fixture_compiles_for_ranges_of_its_dims() {
    let mut failed = Vec::new();
    for file in common::all_fixtures() {
        if file == "op_coverage.onnx" {
            continue;
        }
        for precision in [fusec::ir::DType::F32, fusec::ir::DType::F16] {
            match ranged(&file, precision) {
                Ok(bundle) => {
                    let h = &bundle.header;
                    let names: Vec<&str> = h.ranges.iter().map(|r| r.symbol.as_str()).collect();
                    let seq = common::seq_range(&file);
                    assert_eq!(names, if seq { vec!["batch", "seq"] } else { vec!["batch"] }, "{file}");
                    let text = h.inputs[0].shape_text(&h.ranges);
                    assert!(text.starts_with("[batch"), "{file}: {text}");
                    if seq {
                        assert!(text.contains("seq"), "{file}: {text}");
                    }
                    // Every launch follows the ranges; every GEMM has its sizes as expressions.
                    // As many convolutions on cuDNN as in a bundle for one batch.
                    let convs =
                        |steps: &[Step]| steps.iter().filter(|s| matches!(s, Step::Conv { .. })).count();
                    if file == "cnn_block.onnx" {
                        let options = CompileOptions {
                            import: common::dims_at(&file, "3", "1"),
                            precision,
                            arch: Some("sm_90".into()),
                            ..Default::default()
                        };
                        let one = fusec::compile(&common::model_path(&file), &options)
                            .unwrap_or_else(|e| panic!("{e}"));
                        let (ranged, alone) = (convs(&h.steps), convs(&one.header.steps));
                        assert!(
                            alone > 0 && ranged == alone,
                            "{file} {precision}: {ranged} cuDNN convolutions, {alone} at batch 3"
                        );
                        // Each set up at batch 3 as the session does is the one-batch bundle's
                        // convolution (shapes and parameters; the memory is planned apart).
                        let specs = |steps: &[Step]| -> Vec<fusec::codegen::ConvSpec> {
                            steps
                                .iter()
                                .filter_map(|s| match s {
                                    Step::Conv { conv, .. } => Some(conv.clone()),
                                    _ => None,
                                })
                                .collect()
                        };
                        for (r, o) in specs(&h.steps).iter().zip(specs(&one.header.steps)) {
                            let r = r.at(&[3]).unwrap();
                            let key = |c: &fusec::codegen::ConvSpec| {
                                (
                                    c.x_shape,
                                    c.w_shape,
                                    c.y_shape,
                                    c.pads,
                                    c.strides,
                                    c.dilations,
                                    c.group,
                                    c.channels_last,
                                )
                            };
                            assert_eq!(key(&r), key(&o), "{file} {precision}");
                        }
                    }
                    for step in &h.steps {
                        assert!(step.sources().all(|s| s.scale.is_some()), "{file}");
                        if let Step::Gemm { gemm, .. } = step {
                            assert!(gemm.dims.is_some(), "{file}");
                        }
                        // Convolutions stay on cuDNN, set up again at each batch.
                        if let Step::Conv { conv, .. } = step {
                            assert!(conv.batch.is_some(), "{file}: a convolution whose batch is fixed");
                        }
                    }
                    println!("{file} {precision}: {} launches, {}", h.launches, text);
                }
                Err(e) => failed.push(format!("{file} {precision}: {e}")),
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The sizes of a bundle's steps and outputs at points of its ranges are those of bundles
/// compiled for each point alone: launches (grid and units of work), GEMMs (M, N, K, batch
/// and strides) and output shapes.
#[test]
fn steps_at_a_point_are_those_of_a_bundle_for_that_point() {
    for file in ["bert_mask_dynamo.onnx", "gpt2_ts.onnx", "llama_ts.onnx"] {
        let path = common::model_path(file);
        let bundle = ranged(file, fusec::ir::DType::F16).unwrap();
        let h = &bundle.header;
        let alone = |b: usize, s: usize| {
            let options = CompileOptions {
                import: common::dims_at(file, &b.to_string(), &s.to_string()),
                precision: fusec::ir::DType::F16,
                ..Default::default()
            };
            fusec::compile(&path, &options).unwrap().header
        };
        // Kernels tiled as at the top (a bundle for one size may take packs along a dim that
        // a range makes a run-time size, or other attention tiles): their grids are compared.
        let top = alone(4, 64);
        let same_tiling: Vec<bool> = h
            .steps
            .iter()
            .zip(&top.steps)
            .map(|(a, b)| match (a, b) {
                (Step::Launch(a), Step::Launch(b)) => a.grid == b.grid && a.block == b.block,
                _ => true,
            })
            .collect();
        let mut compared = 0;
        for (b, s) in [(3usize, 7usize), (1, 1), (4, 64), (2, 33)] {
            let single = alone(b, s);
            let point = [b, s];
            for (o, spec) in h.outputs.iter().enumerate() {
                assert_eq!(spec.shape_at(&point), single.outputs[o].shape, "{file} {b}x{s}");
            }
            if single.steps.len() != h.steps.len() {
                // At size 1 the passes take shortcuts (a size-1 broadcast dropped): another
                // program, whose steps cannot be compared one by one.
                assert!(b == 1 || s == 1, "{file} {b}x{s}: {} steps, {}", single.steps.len(), h.steps.len());
                continue;
            }
            for (k, (ours, theirs)) in h.steps.iter().zip(&single.steps).enumerate() {
                match (ours, theirs) {
                    (Step::Gemm { gemm: g, .. }, Step::Gemm { gemm: t, .. }) => {
                        let g = g.at(&point).unwrap();
                        assert_eq!(
                            (g.m, g.n, g.k, g.batch, g.a.batch_stride, g.b.batch_stride),
                            (t.m, t.n, t.k, t.batch, t.a.batch_stride, t.b.batch_stride),
                            "{file} {b}x{s}: step {k}"
                        );
                        compared += 1;
                    }
                    (Step::Launch(l), Step::Launch(t)) if same_tiling[k] && !l.name.contains("attention") => {
                        let (_, blocks) = l.scale.as_ref().unwrap().at(&point).unwrap();
                        assert_eq!(blocks, t.grid, "{file} {b}x{s}: step {k} ({})", l.name);
                        compared += 1;
                    }
                    (Step::Launch(_), Step::Launch(_)) => {}
                    _ => panic!("{file} {b}x{s}: step {k} differs in kind"),
                }
            }
        }
        assert!(compared > 2 * h.steps.len(), "{file}: {compared} compared");
    }
}

/// A tensor-core attention kernel of a bundle for ranges carries variants tiled for other
/// points; every point sampled finds its tiling among them, and a short batch takes a tiling
/// that spreads its rows over more blocks than the top's.
#[test]
fn attention_kernels_have_variants_for_the_points_of_their_ranges() {
    // Batch up to 256: the top takes the largest blocks, batch 1 the smallest.
    let options = CompileOptions {
        import: common::dims_at("bert_ts.onnx", "1..256", "1..64"),
        precision: fusec::ir::DType::F16,
        ..Default::default()
    };
    let bundle = fusec::compile(&common::model_path("bert_ts.onnx"), &options).unwrap();
    let attention: Vec<&fusec::codegen::KernelSource> = bundle
        .header
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Launch(k) if k.attention.is_some() => Some(k),
            _ => None,
        })
        .collect();
    assert!(!attention.is_empty());
    for kernel in attention {
        let dims = kernel.attention.as_ref().unwrap();
        let top = kernel.tiling.unwrap();
        assert_eq!(dims.tiling_at(&[256, 64]), Some(top));
        for point in [[1usize, 64], [1, 7], [2, 33], [4, 1], [3, 50], [100, 64], [256, 3]] {
            let tiling = dims.tiling_at(&point).unwrap();
            let found = tiling == top || kernel.variants.iter().any(|v| v.tiling == Some(tiling));
            assert!(found, "{point:?}: {tiling:?} is not among the variants");
        }
        let short = dims.tiling_at(&[1, 64]).unwrap();
        assert!(short.warps * 4 / short.splits < top.warps * 4 / top.splits, "{short:?} against {top:?}");
        // Each variant launches as many threads as its tiling says, and differs from the top's.
        for v in &kernel.variants {
            let t = v.tiling.unwrap();
            assert_eq!(v.block as usize, 32 * t.warps * t.splits);
            assert_ne!(t, top);
        }
    }
}

#[test]
fn a_range_bundle_round_trips_and_checks_its_inputs() {
    let file = "bert_mask_dynamo.onnx";
    let bundle = ranged(file, fusec::ir::DType::F32).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.bundle");
    bundle.save(&path).unwrap();
    let loaded = fusec::Bundle::load(&path).unwrap();
    assert_eq!(loaded.header, bundle.header);
    let header = &loaded.header;
    let ranges = &header.ranges;
    let names: Vec<&str> = header.inputs.iter().map(|i| i.name.as_str()).collect();
    assert!(header.inputs.iter().all(|i| i.dims.is_some()), "{:?}", header.inputs);
    assert_eq!(header.inputs[0].shape_text(ranges), "[batch, seq]");
    assert_eq!(header.outputs[0].shape_text(ranges), "[batch, seq, 64]");
    assert_eq!(header.outputs[0].shape_at(&[3, 5]), vec![3, 5, 64]);

    let inputs_at = |batch: usize, seq: usize| {
        let import = common::dims_at(file, &batch.to_string(), &seq.to_string());
        let model = fusec::import::import(&common::model_path(file), &import).unwrap();
        common::random_inputs(&model, 1)
    };
    let check =
        |inputs: &[(String, fusec::ir::Tensor)]| fusec::bundle::input_point(&header.inputs, ranges, inputs);
    for (b, s) in [(1, 1), (3, 7), (4, 64), (2, 33)] {
        assert_eq!(check(&inputs_at(b, s)), Ok(vec![b, s]));
    }
    // Above a range: the input, its axis, the range and the value are named.
    let err = check(&inputs_at(5, 7)).unwrap_err();
    assert!(
        err.contains(&format!("input '{}' has 5 along axis 0", names[0]))
            && err.contains("batch must be in 1..4"),
        "{err}"
    );
    // (The model holds 64 positions: the inputs past them are made here, not imported.)
    let long = fusec::ir::Tensor::from_i64(
        ndarray::ArrayD::from_elem(ndarray::IxDyn(&[2, 65]), 1),
        fusec::ir::DType::I64,
    );
    let past: Vec<_> = inputs_at(2, 7).into_iter().map(|(n, _)| (n, long.clone())).collect();
    let err = check(&past).unwrap_err();
    assert!(err.contains("has 65 along axis 1") && err.contains("seq must be in 1..64"), "{err}");
    // Inputs at two points.
    let mut mixed = inputs_at(2, 7);
    mixed[1] = inputs_at(2, 9).remove(1);
    let err = check(&mixed).unwrap_err();
    assert!(err.contains("seq=9") && err.contains("seq=7"), "{err}");
    // Another rank.
    let mut wrong = inputs_at(2, 7);
    wrong[0].1 = wrong[0].1.reshaped(&[14]).unwrap();
    let err = check(&wrong).unwrap_err();
    assert!(
        err.contains(&format!("input '{}' is i64[14], the model takes i64[batch, seq]", names[0])),
        "{err}"
    );
    // A bundle for one size takes that size only.
    let fixed = fusec::compile(
        &common::model_path(file),
        &CompileOptions { import: common::dims_at(file, "2", "7"), ..Default::default() },
    )
    .unwrap();
    assert_eq!(fusec::bundle::input_point(&fixed.header.inputs, &[], &inputs_at(2, 7)), Ok(vec![]));
    assert!(fusec::bundle::input_point(&fixed.header.inputs, &[], &inputs_at(3, 7))
        .unwrap_err()
        .contains("the model takes i64[2, 7]"));
}

#[test]
fn ranges_one_program_cannot_serve_are_errors_that_name_the_value() {
    let compile = |path: &std::path::Path, dims: &[&str]| {
        let dims = dims.iter().map(|d| d.parse().unwrap()).collect();
        fusec::compile(
            path,
            &CompileOptions { import: ImportOptions::new(vec![], dims), ..Default::default() },
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    // The TorchScript export gathers its padding mask at an index grid (b·seq + s) that import
    // folds into a constant; in order, it is a view, and the export takes a sequence range.
    let masked = common::model_path("bert_mask_ts.onnx");
    compile(&masked, &["batch=2", "seq=1..16"]).unwrap();
    // The same grid negated (-(b·seq + s): the positions from the end, but the first) is a
    // constant whose values change with the sequence length: no one program serves the range.
    use prost::Message;
    let mut proto = tract_onnx::pb::ModelProto::decode(std::fs::read(&masked).unwrap().as_slice()).unwrap();
    let graph = proto.graph.as_mut().unwrap();
    let flatten = graph.node.iter().find(|n| n.op_type == "Flatten").unwrap().output[0].clone();
    let gather = graph.node.iter().position(|n| n.op_type == "Gather" && n.input[0] == flatten).unwrap();
    let grid = std::mem::replace(&mut graph.node[gather].input[1], "negated_grid".into());
    graph.node.insert(
        gather,
        tract_onnx::pb::NodeProto {
            name: "negate_grid".into(),
            op_type: "Neg".into(),
            input: vec![grid],
            output: vec!["negated_grid".into()],
            ..Default::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let reversed = dir.path().join("reversed_mask.onnx");
    std::fs::write(&reversed, proto.encode_to_vec()).unwrap();
    let err = compile(&reversed, &["batch=2", "seq=1..16"]).unwrap_err();
    assert!(err.contains("constant '") && err.contains("seq=8") && err.contains("--dim seq=N"), "{err}");
    // inspect shows the symbolic sizes of such a program all the same.
    let (_, symbolic) = plan_symbolic(
        &common::model_path("bert_ts.onnx"),
        &CompileOptions {
            import: ImportOptions::new(
                vec![],
                vec!["batch=1..4".parse().unwrap(), "seq=1..16".parse().unwrap()],
            ),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(symbolic.ranges(), "batch=1..4, seq=1..16");
}
