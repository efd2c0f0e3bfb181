//! `Session::profile_in_program` (`fusec bench --profile --in-program`) on the GPU: a share for
//! every step of the program, none for a step another kernel runs, and the session's results
//! after it as they were before it (it replays parts of the program many times). Skips, with
//! a printed reason, where there is no CUDA driver.

mod common;

use fusec::ir::{rel_l2, Tensor};
use fusec::runtime::Session;

#[test]
fn shares_cover_every_step_and_leave_the_results() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver on this machine");
        return;
    }
    let (bundle, model) = common::compiled_variant("mlp_block.onnx", 0);
    let inputs = common::random_inputs(&model, 7);
    let mut session = Session::new(&bundle, 0).unwrap();
    let before: Vec<Tensor> = session.run(&inputs).unwrap().into_iter().map(|(_, t)| t).collect();
    let steps = session.profile(&inputs, 3).unwrap();
    let shares = session.profile_in_program(&inputs, 3).unwrap().expect("the session replays graphs");
    assert_eq!(shares.len(), steps.len());
    for (step, share) in steps.iter().zip(&shares) {
        assert!(share.is_finite(), "{}: {share}", step.name);
        if step.name.contains("(in another step's kernel)") {
            assert_eq!(*share, 0.0, "{}", step.name);
        }
    }
    // The shares add up to the whole program's time: more than nothing.
    assert!(shares.iter().sum::<f64>() > 0.0, "{shares:?}");
    let after: Vec<Tensor> = session.run(&inputs).unwrap().into_iter().map(|(_, t)| t).collect();
    // (A GEMM's algorithm may be chosen again between the runs: equal to f32 rounding.)
    for (a, b) in after.iter().zip(&before) {
        let e = rel_l2(a, b);
        assert!(e <= 1e-5, "rel-L2 {e} after the profile");
    }
}
