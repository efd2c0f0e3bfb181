//! A network whose output is a convolution's (a segmentation or detection head): in a half-type
//! build the output stays f32, and the cast to it runs after the convolution rather than in
//! its kernel, so the convolution stays a cuDNN call (its kernel's output must be of its own
//! type: cuDNN writes its raw result there) instead of falling to the generated loop.

mod common;

use common::onnx::{ints, node, weight, write_model};
use fusec::codegen::Step;
use fusec::ir::DType;
use fusec::pipeline::{plan_reporting, CompileOptions};

#[test]
fn a_convolution_whose_result_is_the_output_stays_on_cudnn() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![
        node(
            "Conv",
            &["x", "w0", "b0"],
            "c0",
            vec![ints("kernel_shape", &[7, 7]), ints("strides", &[2, 2]), ints("pads", &[3, 3, 3, 3])],
        ),
        node("Relu", &["c0"], "r0", vec![]),
        node(
            "Conv",
            &["r0", "w1", "b1"],
            "y",
            vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
        ),
    ];
    let init = vec![
        weight("w0", &[16, 3, 7, 7], 3, -0.3, 0.6),
        weight("b0", &[16], 4, -0.2, 0.4),
        weight("w1", &[16, 16, 3, 3], 5, -0.2, 0.4),
        weight("b1", &[16], 6, -0.2, 0.4),
    ];
    let path = write_model(dir.path(), "head", &[2, 3, 31, 29], nodes, init);
    for precision in [DType::F32, DType::F16, DType::BF16] {
        let options = CompileOptions { precision, ..Default::default() };
        let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap();
        let steps = fusec::codegen::generate(&plan).unwrap();
        let library = steps.iter().filter(|s| matches!(s, Step::Conv { .. })).count();
        let loops =
            steps.iter().filter(|s| matches!(s, Step::Launch(k) if k.source.contains(": conv\n"))).count();
        assert_eq!((library, loops), (2, 0), "{precision}: cuDNN convolutions and generated loops");
        let output = plan.graph.outputs()[0].1;
        assert_eq!(plan.graph.node(output).ty.dtype, DType::F32, "{precision}: the output stays f32");
        if fusec::nvrtc::available() {
            for source in steps.iter().flat_map(Step::sources) {
                fusec::nvrtc::compile(source, "sm_90").unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}
