//! Depthwise convolutions with large windows (7×7, 5×5) in f16 channels-last programs run as
//! the shared-memory tile kernel (`codegen::depthwise`) at awkward sizes — odd heights and
//! widths, stride 2, dilation 2, 32 to 160 channels — with a bias and SiLU in their epilogue;
//! a 3×3 and a 5×5 over 48 channels keep the generated loop.
//! (Asymmetric pads keep a convolution NCHW: `passes::channels_last` gives cuDNN only
//! symmetric ones.) Every kernel compiles with NVRTC where it is found; on a GPU each
//! model runs against tract.

mod common;

use std::path::Path;

use common::onnx::{int, ints, node, weight, write_model};
use fusec::codegen::Step;
use fusec::import::{import, run_tract, ImportOptions};
use fusec::ir::{rel_l2, DType};
use fusec::pipeline::{plan_reporting, CompileOptions};

const HALF_TOLERANCE: f64 = 1e-2;

struct Case {
    name: &'static str,
    channels: i64,
    size: [i64; 2],
    window: i64,
    pads: [i64; 4],
    strides: [i64; 2],
    dilations: [i64; 2],
}

const CASES: [Case; 5] = [
    Case {
        name: "dw7",
        channels: 96,
        size: [13, 11],
        window: 7,
        pads: [3, 3, 3, 3],
        strides: [1, 1],
        dilations: [1, 1],
    },
    Case {
        name: "dw5s2",
        channels: 64,
        size: [17, 15],
        window: 5,
        pads: [2, 2, 2, 2],
        strides: [2, 2],
        dilations: [1, 1],
    },
    Case {
        name: "dw5d2",
        channels: 160,
        size: [9, 12],
        window: 5,
        pads: [4, 4, 4, 4],
        strides: [1, 1],
        dilations: [2, 2],
    },
    Case {
        name: "dw5c48",
        channels: 48,
        size: [10, 9],
        window: 5,
        pads: [2, 2, 2, 2],
        strides: [1, 1],
        dilations: [1, 1],
    },
    Case {
        name: "dw3",
        channels: 32,
        size: [10, 9],
        window: 3,
        pads: [1, 1, 1, 1],
        strides: [1, 1],
        dilations: [1, 1],
    },
];

/// A depthwise convolution with a bias, then SiLU (`x · sigmoid(x)`); batch 3.
fn model(dir: &Path, case: &Case) -> std::path::PathBuf {
    let c = case.channels;
    let nodes = vec![
        node(
            "Conv",
            &["x", "w", "b"],
            "conv",
            vec![
                ints("kernel_shape", &[case.window, case.window]),
                ints("pads", &case.pads),
                ints("strides", &case.strides),
                ints("dilations", &case.dilations),
                int("group", c),
            ],
        ),
        node("Sigmoid", &["conv"], "gate", vec![]),
        node("Mul", &["conv", "gate"], "y", vec![]),
    ];
    let init =
        vec![weight("w", &[c, 1, case.window, case.window], 91, -0.3, 0.6), weight("b", &[c], 92, -0.2, 0.4)];
    write_model(dir, case.name, &[3, c, case.size[0], case.size[1]], nodes, init)
}

#[test]
fn large_depthwise_windows_stage_their_tiles_in_shared_memory() {
    let dir = tempfile::tempdir().unwrap();
    let options = CompileOptions { precision: DType::F16, channels_last: true, ..Default::default() };
    let gpu = fusec::runtime::driver_available();
    if !gpu {
        println!("skipping the GPU runs: no CUDA driver on this machine");
    }
    for case in &CASES {
        let path = model(dir.path(), case);
        let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
        let steps = fusec::codegen::generate(&plan).unwrap_or_else(|e| panic!("{e}"));
        let convs: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Launch(k) if k.source.contains(": conv\n") => Some(k),
                _ => None,
            })
            .collect();
        assert_eq!(convs.len(), 1, "{}: {:?}", case.name, convs.iter().map(|k| &k.name).collect::<Vec<_>>());
        let source = &convs[0].source;
        let shared = source.contains("__shared__ __align__(16) float dw_in");
        assert_eq!(shared, case.window >= 5 && case.channels % 32 == 0, "{}:\n{source}", case.name);
        if shared {
            // The SiLU is the tile kernel's epilogue: no kernel reads the convolution back.
            assert!(source.contains("fusec::sigmoid(v"), "{}:\n{source}", case.name);
        }
        if fusec::nvrtc::available() {
            for source in steps.iter().flat_map(Step::sources) {
                fusec::nvrtc::compile(source, "sm_90").unwrap_or_else(|e| panic!("{}: {e}", case.name));
            }
        } else {
            eprintln!("skipping NVRTC compilation: NVRTC not found");
        }
        if !gpu {
            continue;
        }
        let model = import(&path, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let inputs = common::random_inputs(&model, 9);
        let values: Vec<_> = inputs.iter().map(|(_, t)| t.clone()).collect();
        let theirs = run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
        let bundle = fusec::compile(&path, &CompileOptions { arch: Some("sm_90".into()), ..options.clone() })
            .unwrap_or_else(|e| panic!("{e}"));
        let mut session = fusec::runtime::Session::new(&bundle, 0).unwrap_or_else(|e| panic!("{e}"));
        let ours = session.run(&inputs).unwrap_or_else(|e| panic!("{e}"));
        let err = rel_l2(&ours[0].1, &theirs[0]);
        println!("{}: rel-L2 {err:e} against tract", case.name);
        assert!(err <= HALF_TOLERANCE, "{} on the GPU: rel-L2 {err:e}", case.name);
    }
}
