//! Symbolic sizes (`--dim NAME=LO..HI`): every fixture planned for ranges of its dims, its
//! sizes fitted as products of the dims, checked against programs planned for one size each.

mod common;

use std::collections::HashMap;

use fusec::import::{DimSpec, ImportOptions};
use fusec::symbolic::plan_symbolic;
use fusec::CompileOptions;

/// The ranges each fixture is planned for: batch and, for the text models, seq (the tiny
/// BERTs hold 64 positions).
fn ranges(file: &str) -> Vec<DimSpec> {
    let text = ["bert", "gpt2", "llama"].iter().any(|p| file.starts_with(p));
    let mut specs = vec!["batch=1..8".parse().unwrap()];
    if text {
        specs.push("seq=1..64".parse().unwrap());
    }
    specs
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
        let (plan, symbolic) = match plan_symbolic(&path, &options(&file, dims.clone())) {
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
            let by_name: HashMap<&str, &[usize]> = single
                .graph
                .node_ids()
                .map(|id| (single.graph.node(id).name.as_str(), single.graph.node(id).ty.shape.as_slice()))
                .collect();
            let mut compared = 0;
            for id in plan.graph.node_ids() {
                let node = plan.graph.node(id);
                let expected = if ones {
                    by_name.get(node.name.as_str()).copied()
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

/// A fixture compiled for batch sizes 1..4 (seq 7 where the model has one).
fn batch_range(
    file: &str,
    precision: fusec::ir::DType,
) -> Result<fusec::Bundle, fusec::pipeline::CompileError> {
    let options = CompileOptions {
        import: common::batch_dims(file, "1..4"),
        precision,
        arch: Some("sm_90".into()),
        ..Default::default()
    };
    fusec::compile(&common::model_path(file), &options)
}

#[test]
fn every_fixture_compiles_for_a_range_of_batch_sizes() {
    let mut failed = Vec::new();
    for file in common::all_fixtures() {
        if file == "op_coverage.onnx" {
            continue;
        }
        match batch_range(&file, fusec::ir::DType::F32) {
            Ok(bundle) => {
                let range = bundle.header.range.as_ref().expect("a range");
                assert_eq!((range.symbol.as_str(), range.low, range.high), ("batch", 1, 4), "{file}");
                assert!(bundle.header.inputs.iter().any(|i| i.range_axis == Some(0)), "{file}");
                println!("{file}: {} launches", bundle.header.launches);
            }
            Err(e) => failed.push(format!("{file}: {e}")),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn a_range_bundle_round_trips_and_checks_its_inputs() {
    let file = "bert_mask_ts.onnx";
    let bundle = batch_range(file, fusec::ir::DType::F32).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.bundle");
    bundle.save(&path).unwrap();
    let loaded = fusec::Bundle::load(&path).unwrap();
    assert_eq!(loaded.header, bundle.header);
    let header = &loaded.header;
    let range = header.range.as_ref().unwrap();
    let names: Vec<&str> = header.inputs.iter().map(|i| i.name.as_str()).collect();
    assert!(header.inputs.iter().all(|i| i.range_axis == Some(0)), "{:?}", header.inputs);
    assert!(header.outputs.iter().all(|o| o.range_axis == Some(0)));
    assert_eq!(header.inputs[0].shape_text(Some(range)), "[batch, 7]");
    assert_eq!(header.outputs[0].shape_at(3, range.high), vec![3, 7, 64]);

    let inputs_at = |batch: &str| {
        let model =
            fusec::import::import(&common::model_path(file), &common::batch_dims(file, batch)).unwrap();
        common::random_inputs(&model, 1)
    };
    let check = |inputs: &[(String, fusec::ir::Tensor)]| {
        fusec::bundle::input_size(&header.inputs, Some(range), inputs)
    };
    for n in 1..=4 {
        assert_eq!(check(&inputs_at(&n.to_string())), Ok(Some(n)));
    }
    // Above the range: the input, its axis, the range and the value are named.
    let err = check(&inputs_at("5")).unwrap_err();
    assert!(
        err.contains(&format!("input '{}' has 5 along axis 0", names[0]))
            && err.contains("batch must be in 1..4"),
        "{err}"
    );
    // Inputs at two sizes.
    let mut mixed = inputs_at("2");
    mixed[1] = inputs_at("3").remove(1);
    let err = check(&mixed).unwrap_err();
    assert!(err.contains("batch=3") && err.contains("batch=2"), "{err}");
    // Another rank, or another size on a fixed axis.
    let mut wrong = inputs_at("2");
    wrong[0].1 = wrong[0].1.reshaped(&[14]).unwrap();
    let err = check(&wrong).unwrap_err();
    assert!(
        err.contains(&format!("input '{}' is i64[14], the model takes i64[batch, 7]", names[0])),
        "{err}"
    );
    let mut wrong = inputs_at("2");
    wrong[0].1 = wrong[0].1.reshaped(&[7, 2]).unwrap();
    assert!(check(&wrong).unwrap_err().contains("the model takes i64[batch, 7]"));
    // A bundle for one size takes that size only.
    let fixed = fusec::compile(
        &common::model_path(file),
        &CompileOptions { import: common::batch_dims(file, "2"), ..Default::default() },
    )
    .unwrap();
    assert_eq!(fusec::bundle::input_size(&fixed.header.inputs, None, &inputs_at("2")), Ok(None));
    assert!(fusec::bundle::input_size(&fixed.header.inputs, None, &inputs_at("3"))
        .unwrap_err()
        .contains("the model takes i64[2, 7]"));
}

#[test]
fn ranges_kernels_cannot_follow_are_errors_that_name_the_value() {
    let path = common::model_path("bert_ts.onnx");
    let compile = |dims: &[&str]| {
        let dims = dims.iter().map(|d| d.parse().unwrap()).collect();
        fusec::compile(
            &path,
            &CompileOptions { import: ImportOptions::new(vec![], dims), ..Default::default() },
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    // seq is not the leading axis of the values that follow it: not built yet, said so.
    let err = compile(&["batch=2", "seq=1..16"]);
    assert!(
        err.contains("is [2, seq]") && err.contains("not the leading axis") && err.contains("--dim NAME=N"),
        "{err}"
    );
    let err = compile(&["batch=1..4", "seq=1..16"]);
    assert!(err.contains("its sizes follow 2 ranges"), "{err}");
    // inspect shows the symbolic sizes of such a program all the same.
    let (_, symbolic) = plan_symbolic(
        &path,
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
