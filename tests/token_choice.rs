//! The GPU's token choices against the host's: greedy (`Session::argmax_rows`) and top-k /
//! top-p draws (`Session::sample_rows`) on awkward rows — on the GPU, skipped without one.

mod common;

use fusec::import::ImportOptions;
use fusec::ir::{DType, Tensor};
use fusec::CompileOptions;
use ndarray::{ArrayD, IxDyn};

/// The GPU's greedy choice (`Session::argmax_rows`) picks what the host's does, on every row
/// of a model's output (awkward widths: rows of 40, and of 280 seen as 7 rows of 40 each).
#[test]
fn the_gpu_argmax_is_the_hosts() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver");
        return;
    }
    let file = "mlp_block.onnx";
    let options = CompileOptions { import: ImportOptions::default().dim("batch", 3), ..Default::default() };
    let bundle = fusec::compile(&common::model_path(file), &options).unwrap();
    let mut session = fusec::Session::new(&bundle, 0).unwrap();
    let model = fusec::import::import(&common::model_path(file), &options.import).unwrap();
    let inputs = common::random_inputs(&model, 5);
    let outputs = session.run(&inputs).unwrap();
    let (name, values) = (&outputs[0].0, outputs[0].1.to_f64_vec());
    let mut sampler = fusec::generate::Sampler::new(fusec::generate::Sampling::Greedy, 1.0, 0).unwrap();
    for (rows, width) in [(21, 40), (3, 280), (1, 840)] {
        let ours = session.argmax_rows(name, rows, width).unwrap();
        let theirs: Vec<i64> = (0..rows)
            .map(|r| {
                let row: Vec<f32> = values[r * width..(r + 1) * width].iter().map(|&v| v as f32).collect();
                sampler.choose(&row) as i64
            })
            .collect();
        assert_eq!(ours, theirs, "{rows} rows of {width}");
    }
    assert!(session.argmax_rows(name, 22, 40).is_err(), "more rows than the output holds");
}

/// A session of `y = x <op> c` over `[rows, width]` f32 logits (`Mul` by 1 keeps every value
/// as it is), run on the values `value(row, index, u)` gives (`u` a seeded draw in [0, 1)):
/// the session, the output's name and the logits it holds.
fn logits_session(
    (op, c): (&str, f32),
    (rows, width): (usize, usize),
    seed: u64,
    value: impl Fn(usize, usize, f32) -> f32,
) -> (fusec::Session, String, Vec<f32>) {
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![common::onnx::node(op, &["x", "c"], "y", vec![])];
    let c = common::onnx::weight("c", &[1], 1, c, 0.0);
    let path = common::onnx::write_model(dir.path(), "logits", &[rows as i64, width as i64], nodes, vec![c]);
    let bundle = fusec::compile(&path, &CompileOptions::default()).unwrap();
    let mut session = fusec::Session::new(&bundle, 0).unwrap();
    let mut next = common::xorshift(seed);
    let values: Vec<f64> = (0..rows * width)
        .map(|i| f64::from(value(i / width, i % width, (next() % 1_000_000) as f32 / 1_000_000.0)))
        .collect();
    let x = Tensor::from_f64(ArrayD::from_shape_vec(IxDyn(&[rows, width]), values).unwrap(), DType::F32);
    let outputs = session.run(&[("x".to_string(), x)]).unwrap();
    let name = outputs[0].0.clone();
    let logits: Vec<f32> = outputs[0].1.to_f64_vec().iter().map(|&v| v as f32).collect();
    (session, name, logits)
}

/// The greedy choice over rows the kernel splits over many blocks (chunks of 4,096 from 8
/// rows, of 1,024 below or with `FUSEC_ARGMAX_ITEMS=4`, merged by atomics) picks what the
/// host's does: rows of a vocabulary (50,257) and of awkward widths around a chunk, ties
/// falling in different chunks (the first must win), NaNs and -inf, rows
/// all -inf or all NaN (index 0), -0 before +0 (equal: the first), the largest value last, and
/// the same launch twice (the kernel clears its merge slots for the next).
#[test]
fn the_gpu_argmax_is_the_hosts_across_blocks() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver");
        return;
    }
    let width = 50_257usize;
    let (mut session, name, logits) = logits_session(("Mul", 1.0), (7, width), 17, |r, i, u| match r {
        // Ties: a few values, the largest in many chunks.
        0 => (u * 4.0).floor(),
        1 if i % 7 == 0 => f32::NAN,
        1 if i % 5 == 0 => f32::NEG_INFINITY,
        2 => f32::NEG_INFINITY,
        3 => f32::NAN,
        // Every value negative but a -0 and, later, a +0.
        4 if i == 3_000 => -0.0,
        4 if i == 40_000 => 0.0,
        4 => -1.0 - u,
        5 if i == width - 1 => 30.0,
        _ => 20.0 * u - 10.0,
    });
    let mut sampler = fusec::generate::Sampler::new(fusec::generate::Sampling::Greedy, 1.0, 0).unwrap();
    for (rows, width) in [
        (7, width),
        (1, width),
        (343, 1025),
        (3, 1024),
        (5, 1023),
        (2, 5003),
        (8, 4097),
        (9, 4096),
        (10, 4095),
        (1, 7 * width),
        (9, 1),
    ] {
        for _ in 0..2 {
            let ours = session.argmax_rows(&name, rows, width).unwrap();
            let theirs: Vec<i64> =
                (0..rows).map(|r| sampler.choose(&logits[r * width..(r + 1) * width]) as i64).collect();
            assert_eq!(ours, theirs, "{rows} rows of {width}");
        }
    }
    // The cases above were what they were meant to be.
    let row = |r: usize| &logits[r * width..(r + 1) * width];
    assert_eq!(session.argmax_rows(&name, 7, width).unwrap()[2..6], [0, 0, 3_000, width as i64 - 1]);
    assert!(row(0).iter().filter(|&&v| v == 3.0).count() > 100);
}

/// Top-k and top-p draws on the GPU (`Session::sample_rows`) pick what the host's sampler
/// picks for the same draws (`Sampler::choose_with`) — both of the kernel's ways: kept sets of
/// at most 1,024 candidates sorted, larger ones searched (top-k 2000, the wide nuclei) — on
/// rows of 1,997 logits built to be
/// awkward: spread out, quantized to a few values (ties), with NaNs and -inf, flat, all -inf,
/// all NaN; at several k, p and temperatures, with draws near 0 and near 1; rows taken every
/// third from the third (a prompt step's last positions) as well.
#[test]
fn the_gpu_draws_are_the_hosts() {
    use fusec::generate::{Sampler, Sampling};
    use fusec::runtime::{RowDraw, SampledRows};
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver");
        return;
    }
    let (rows, width) = (12usize, 1997usize);
    let (mut session, name, logits) = logits_session(("Add", 0.5), (rows, width), 3, |r, i, u| match r {
        1 => (u * 4.0).floor() - 1.0,
        2 if i % 7 == 0 => f32::NAN,
        2 if i % 5 == 0 => f32::NEG_INFINITY,
        3 => 0.25,
        4 => f32::NEG_INFINITY,
        5 => f32::NAN,
        r if r > 8 => 40.0 * u - 20.0,
        _ => 8.0 * u - 4.0,
    });
    let samplings = [
        (Sampling::TopK(1), 1.0),
        (Sampling::TopK(5), 0.7),
        (Sampling::TopK(40), 1.0),
        (Sampling::TopK(2000), 1.3),
        (Sampling::TopP(0.1), 1.0),
        (Sampling::TopP(0.9), 0.8),
        (Sampling::TopP(1.0), 1.0),
        (Sampling::TopP(0.5), 3.0),
    ];
    let mut draw_rng = common::xorshift(11);
    for (sampling, temperature) in samplings {
        let sampler = Sampler::new(sampling, temperature, 0).unwrap();
        let draw = match sampling {
            Sampling::TopK(k) => RowDraw::TopK(k),
            Sampling::TopP(p) => RowDraw::TopP(p),
            Sampling::Greedy => unreachable!(),
        };
        for at in [
            SampledRows { rows, width, step: 1, offset: 0 },
            SampledRows { rows: 3, width, step: 3, offset: 2 },
        ] {
            for set in 0..4 {
                let draws: Vec<f64> = (0..at.rows)
                    .map(|i| match (set, i % 3) {
                        (0, 0) => 0.0,
                        (0, 1) => 0.999_999,
                        _ => (draw_rng() % 1_000_000) as f64 / 1_000_000.0,
                    })
                    .collect();
                let ours = session.sample_rows(&name, at, draw, temperature, &draws).unwrap();
                let theirs: Vec<i64> = (0..at.rows)
                    .map(|i| {
                        let row = i * at.step + at.offset;
                        sampler.choose_with(&logits[row * width..(row + 1) * width], draws[i]) as i64
                    })
                    .collect();
                assert_eq!(ours, theirs, "{sampling} at {temperature}, {at:?}, draws {draws:?}");
            }
        }
    }
    let at = SampledRows { rows, width, step: 1, offset: 0 };
    let draws = vec![0.5; rows];
    let over = SampledRows { rows: 5, width, step: 3, offset: 0 };
    assert!(
        session.sample_rows(&name, over, RowDraw::TopK(3), 1.0, &draws[..5]).is_err(),
        "rows past the output"
    );
    assert!(session.sample_rows(&name, at, RowDraw::TopK(3), 1.0, &draws[..3]).is_err(), "too few draws");
    assert!(session.sample_rows(&name, at, RowDraw::TopK(3), 1.0, &vec![1.0; rows]).is_err(), "a draw of 1");
    assert!(session.sample_rows(&name, at, RowDraw::TopP(0.0), 1.0, &draws).is_err(), "p = 0");
    assert!(session.sample_rows(&name, at, RowDraw::TopK(3), 0.0, &draws).is_err(), "temperature 0");
}
