//! Saturation + extraction time for BERT at base depth (12 layers; width does not change the
//! e-graph), against the 2 s budget. Run with `cargo bench --bench fusion`; exits non-zero
//! if the median is over budget.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use fusec::fusion::{self, FusionLimits};
use fusec::import::{import, ImportOptions};
use fusec::passes::{run_passes, standard};

const BUDGET: Duration = Duration::from_secs(2);
const RUNS: usize = 15;

fn main() -> ExitCode {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/bert12_ts.onnx");
    // The fixture has 64 positions; the e-graph does not depend on the sizes.
    let options = ImportOptions::default().dim("batch", 8).dim("seq", 64);
    let model = match import(&path, &options) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut graph = model.graph;
    if let Err(e) = run_passes(&mut graph, &standard()) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let mut times = Vec::with_capacity(RUNS);
    let mut last = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        match fusion::fuse(&graph, &FusionLimits::default()) {
            Ok(fused) => last = Some(fused),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
        times.push(started.elapsed());
    }
    times.sort();
    let Some(fused) = last else { return ExitCode::FAILURE };
    let r = &fused.report;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "bert12 (8x64): {} IR nodes -> {} e-nodes / {} classes, {} after {} iterations",
        graph.node_count(),
        r.egraph_nodes,
        r.egraph_classes,
        r.stop_reason,
        r.iterations
    );
    println!(
        "saturation + extraction over {RUNS} runs: median {:.1} ms, min {:.1} ms, max {:.1} ms (budget {} ms)",
        ms(times[RUNS / 2]),
        ms(times[0]),
        ms(times[RUNS - 1]),
        BUDGET.as_millis()
    );
    if times[RUNS / 2] > BUDGET {
        eprintln!("over budget");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
