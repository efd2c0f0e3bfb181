//! The next decoding step's position and mask column set in the launch that copies this
//! step's keys and values into the cache (`Session::copy_output_rows_setting`), and that launch
//! joined with the greedy choice fed back (`Session::argmax_feed_copying`) or a top-k / top-p
//! draw (`Session::sample_feed_copying`): the step after it gives what it gives with the copy,
//! the two columns set and the tokens written on their own, and the ids fed back are the
//! argmax (the draw `sample_rows` makes) — on the GPU, skipped without one; misuse is an error
//! there too.

mod common;

use fusec::ir::{DType, Tensor};
use fusec::runtime::{CacheCopy, ColumnSet, RowCopy, RowDraw, SampledRows};
use fusec::CompileOptions;
use ndarray::{ArrayD, IxDyn};

#[test]
fn a_cache_copy_sets_the_next_steps_columns() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (the copy kernel runs on a GPU machine)");
        return;
    }
    let (batch, past, heads, size) = (2usize, 15usize, 4usize, 16usize);
    let dims = ["batch=2", "seq=1", "past=15", "total=16"].iter().map(|d| d.parse().unwrap()).collect();
    let options = CompileOptions {
        import: fusec::import::ImportOptions::new(vec![], dims),
        cache_in_place: true,
        ..Default::default()
    };
    let bundle = fusec::compile(&common::model_path("gpt2_cache_ts.onnx"), &options).unwrap();
    let ints = |shape: &[usize], v: Vec<i64>| {
        Tensor::from_i64(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap(), DType::I64)
    };
    // Row 1 has slots 4..9 empty; the step's own position is the last column.
    let mask: Vec<i64> = (0..batch * (past + 1))
        .map(|i| i64::from(i / (past + 1) == 0 || !(4..9).contains(&(i % (past + 1)))))
        .collect();
    let mut inputs = vec![
        ("input_ids".to_string(), ints(&[batch, 1], vec![5, 300])),
        ("attention_mask".to_string(), ints(&[batch, past + 1], mask)),
        ("position_ids".to_string(), ints(&[batch, 1], vec![3, 3])),
    ];
    for spec in bundle.header.inputs.iter().filter(|s| s.name.starts_with("past")) {
        let k = inputs.len();
        let values: Vec<f32> =
            (0..batch * heads * past * size).map(|i| ((i * 37 + k * 11) % 101) as f32 / 50.0 - 1.0).collect();
        let shape = IxDyn(&[batch, heads, past, size]);
        inputs.push((spec.name.clone(), Tensor::F32(ArrayD::from_shape_vec(shape, values).unwrap())));
    }
    let pairs: Vec<(String, String)> = bundle
        .header
        .inputs
        .iter()
        .filter(|s| s.name.starts_with("past"))
        .map(|s| (s.name.replacen("past_key_values", "present", 1), s.name.clone()))
        .collect();
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    // The new position (the present's last) into slot 3, rows of `size` f32s.
    let row = size * 4;
    let copy = RowCopy {
        rows: batch * heads,
        width: row,
        from_offset: past * row,
        from_pitch: (past + 1) * row,
        to_offset: 3 * row,
        to_pitch: (past + 1) * row,
    };
    let sets = [
        ColumnSet { input: "position_ids", column: 0, value: 4.0 },
        ColumnSet { input: "attention_mask", column: 5, value: 1.0 },
    ];
    let mut results = Vec::new();
    // 0: the copy and the sets in one launch, 1: each on its own, 2: with the choice too.
    for mode in 0..3 {
        let mut session = fusec::Session::new(&bundle, 0).unwrap();
        session.run(&inputs).unwrap();
        let ids = session.argmax_rows("logits", batch, 512).unwrap();
        match mode {
            0 => session.copy_output_rows_setting(CacheCopy { pairs: &pairs, copy, sets: &sets }).unwrap(),
            1 => {
                session.copy_output_rows_many(&pairs, copy).unwrap();
                for set in &sets {
                    session.set_input_column(set.input, set.column, set.value).unwrap();
                }
            }
            _ => {
                let cache = CacheCopy { pairs: &pairs, copy, sets: &sets };
                session.argmax_feed_copying("logits", (batch, 512), "input_ids", cache).unwrap()
            }
        }
        if mode < 2 {
            session.write_input("input_ids", &ints(&[batch, 1], ids)).unwrap();
        } else {
            assert_eq!(session.fed_tokens().unwrap(), ids, "the ids fed back beside the copy");
        }
        session.execute_all().unwrap();
        let outputs: Vec<Vec<f64>> = bundle
            .header
            .outputs
            .iter()
            .map(|o| session.read_output(&o.name).unwrap().to_f64_vec())
            .collect();
        results.push(outputs);
        // Misuse: a column past the input, an input that is not [rows, columns].
        let past_end = ColumnSet { input: "attention_mask", column: past + 1, value: 1.0 };
        assert!(session
            .copy_output_rows_setting(CacheCopy { pairs: &pairs, copy, sets: &[past_end] })
            .is_err());
        let not_2d = ColumnSet { input: pairs[0].1, column: 0, value: 1.0 };
        assert!(session
            .copy_output_rows_setting(CacheCopy { pairs: &pairs, copy, sets: &[not_2d] })
            .is_err());
    }
    assert_eq!(results[0], results[1], "the step after the copy, columns set in its launch or on their own");
    assert_eq!(results[0], results[2], "the step after the copy, the choice in its launch or on its own");
    // Drawn tokens: the draw and the copy in one launch against the draw, the copy, the sets
    // and the ids written on their own, for a top-k and a top-p draw.
    let at = SampledRows { rows: batch, width: 512, step: 1, offset: 0 };
    let draws = [0.37, 0.81];
    for draw in [RowDraw::TopK(5), RowDraw::TopP(0.8)] {
        let mut drawn = Vec::new();
        for one_launch in [true, false] {
            let mut session = fusec::Session::new(&bundle, 0).unwrap();
            session.run(&inputs).unwrap();
            let ids = session.sample_rows("logits", at, draw, 0.9, &draws).unwrap();
            let cache = CacheCopy { pairs: &pairs, copy, sets: &sets };
            if one_launch {
                session.sample_feed_copying("logits", at, (draw, 0.9), &draws, "input_ids", cache).unwrap();
                assert_eq!(session.fed_tokens().unwrap(), ids, "the ids drawn beside the copy ({draw:?})");
            } else {
                session.copy_output_rows_setting(cache).unwrap();
                session.write_input("input_ids", &ints(&[batch, 1], ids)).unwrap();
            }
            session.execute_all().unwrap();
            drawn.push(session.read_output("logits").unwrap().to_f64_vec());
        }
        assert_eq!(
            drawn[0], drawn[1],
            "the step after the draw and the copy in one launch or apart ({draw:?})"
        );
    }
    // The copy against the host: the cache is in place (each present output is its past
    // input's memory), so after the copy every row's slot 3 holds its slot 15 and nothing
    // else moved — whole rows, and the first 15 of each row's 16 floats.
    for width in [row, row - 4] {
        let mut session = fusec::Session::new(&bundle, 0).unwrap();
        session.run(&inputs).unwrap();
        let before: Vec<Vec<f64>> =
            pairs.iter().map(|(present, _)| session.read_output(present).unwrap().to_f64_vec()).collect();
        let part = RowCopy { width, ..copy };
        session.copy_output_rows_setting(CacheCopy { pairs: &pairs, copy: part, sets: &sets }).unwrap();
        for ((present, _), before) in pairs.iter().zip(&before) {
            let after = session.read_output(present).unwrap().to_f64_vec();
            let mut expected = before.clone();
            for r in 0..batch * heads {
                for e in 0..width / 4 {
                    expected[(r * (past + 1) + 3) * size + e] = before[(r * (past + 1) + past) * size + e];
                }
            }
            assert_eq!(after, expected, "{present} after a copy of rows of {width} bytes");
        }
    }
    // The step did see the new columns: it differs from one without them.
    let mut session = fusec::Session::new(&bundle, 0).unwrap();
    session.run(&inputs).unwrap();
    session.copy_output_rows_many(&pairs, copy).unwrap();
    session.execute_all().unwrap();
    assert_ne!(session.read_output("logits").unwrap().to_f64_vec(), results[0][0]);
}
