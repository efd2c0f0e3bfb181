//! `fusec bench`: fused versus unfused latency on the GPU, side by side.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use fusec::bundle::IoSpec;
use fusec::import::InputSpec;
use fusec::ir::{is_mask, random_input, rel_l2, DType, Tensor};
use fusec::runtime::{Session, SessionOptions, PROFILE_REPEAT};
use fusec::{Bundle, CompileOptions};

use super::bench_report::{gemm_choice_lines, print_profile, print_profile_pair};
use super::progress::Progress;
use super::shapes::ShapeArgs;

/// Compare fused and unfused latency on the GPU: compile the model twice (fused, with a CUDA
/// graph; unfused, one kernel per node and no graph), check their outputs agree, then time
/// both with CUDA events after a warm-up, rotating input sets.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  fusec bench models/bert_ts.onnx --dim batch=8 --dim seq=64\n  fusec bench models/bert_ts.onnx --dim batch=8 --dim seq=64 --precision fp16 --profile --svg bert.svg\n  fusec bench models/bert_ts.onnx --dim batch=8 --dim seq=64 --json - | jq .speedup\n  fusec bench bert.bundle --iters 500 --json bert.json"
)]
pub struct Bench {
    /// An ONNX model, or a bundle (its source model is compiled again unfused).
    model: PathBuf,
    #[command(flatten)]
    shapes: ShapeArgs,
    /// Element type of weights and activations (for an ONNX model).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "fp16", "bf16"])]
    precision: String,
    /// A decoder's key/value cache updated in place, in both builds (as `compile
    /// --cache-in-place`; `--decode` does it unless FUSEC_CACHE_IN_PLACE=0).
    #[arg(long)]
    cache_in_place: bool,
    /// Half-type builds keep an erf-GELU after a GEMM exact, in an epilogue kernel of its own
    /// (by default it is computed in its tanh form inside cuBLASLt's epilogue: at most 4.7e-4
    /// apart, rel-L2 2e-4 over unit-normal inputs, about f16's own rounding). Also
    /// `FUSEC_EXACT_GELU=1`.
    #[arg(long)]
    exact_gelu: bool,
    /// Timed runs of each variant.
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Untimed runs first.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Also write the results as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The GPU to run on.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Also draw the latencies (and, with --profile, the top steps) as an SVG plot.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// No progress line (there is none anyway when standard error is not a terminal).
    #[arg(short, long)]
    quiet: bool,
    /// Also time every step of the fused program on its own and list the top kernels.
    #[arg(long)]
    profile: bool,
    /// With --profile: also each step's share of the program's time where it runs among the
    /// others (the program's first steps timed up to each one; slow on large programs).
    #[arg(long, requires = "profile")]
    in_program: bool,
    /// Do not choose GEMM algorithms by timing the fused program at load: GEMMs with a bias
    /// epilogue take the cuBLASLt heuristic's first algorithm, the others cuBLAS (choices
    /// timed before are cached beside the NVRTC cache).
    #[arg(long)]
    no_gemm_tuning: bool,
    /// For a bundle with ranges of sizes (`--dim batch=1..32 --dim seq=1..512`): time it at
    /// each of these points beside a bundle compiled for that point alone, and the first run
    /// of each point (its set-up and CUDA graph capture), instead of fused against unfused.
    /// A point is a size per range, in name order, joined by `x` (`8x384`: batch 8, seq 384);
    /// one number for a bundle with one range.
    #[arg(long, visible_alias = "shapes", value_delimiter = ',', value_name = "AxB,...")]
    sizes: Vec<String>,
    /// Exit with status 1 when the fused build's median is slower than the unfused one's (a
    /// warning is printed either way): a fused build must never be slower.
    #[arg(long)]
    strict: bool,
    /// For a decoder exported with its cache: generate PROMPTxNEW tokens (`128x256`) greedily,
    /// fused against unfused, each compiled for one step at batch `--dim batch=B` (default 1)
    /// with a cache of PROMPT+NEW positions; prints the time to the first tokens and ms per
    /// token.
    #[arg(long, value_name = "PROMPTxNEW")]
    decode: Option<String>,
}

/// How far two builds of one model in `precision` may be apart (rel-L2): two half-type
/// builds each round differently, and a deep network's logits amplify it. ResNet-50's
/// (random weights, calibrated statistics) differ from its f32 ones by 3.0e-2 in PyTorch's
/// own fp16 and 1.3e-1 in its bf16, whose rounding is eight times coarser; fusec's fused and
/// unfused bf16 builds by 5.0e-2 at batch 32 (`benches/NOTES.md`). A wrong kernel gives ~1.
fn builds_tolerance(precision: DType) -> f64 {
    match precision {
        DType::F32 => 1e-5,
        DType::BF16 => 2e-1,
        _ => 5e-2,
    }
}

/// `8x384` as sizes of `ranges` (in order); an error names the point and the ranges.
fn parse_point(text: &str, ranges: &[fusec::bundle::BundleRange]) -> anyhow::Result<Vec<usize>> {
    let names = || ranges.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
    let values: Vec<usize> =
        text.split('x').map(|v| v.trim().parse::<usize>()).collect::<Result<_, _>>().with_context(|| {
            format!("--sizes {text}: not sizes joined by x (the bundle's ranges: {})", names())
        })?;
    // A sum of others (`total=past+seq`) may be left out: it is its parts' sizes added.
    let parts = ranges.iter().filter(|r| !r.is_sum()).count();
    let values = if values.len() == parts && parts < ranges.len() {
        let mut all = Vec::with_capacity(ranges.len());
        let mut given = values.iter();
        for r in ranges {
            all.push(if r.is_sum() { 0 } else { *given.next().unwrap_or(&0) });
        }
        fusec::ir::with_sums(ranges, &all).unwrap_or(all)
    } else {
        values
    };
    if values.len() != ranges.len() {
        bail!(
            "--sizes {text}: {} sizes for the bundle's {} ranges ({})",
            values.len(),
            ranges.len(),
            names()
        );
    }
    if fusec::ir::with_sums(ranges, &values).as_ref() != Some(&values) {
        bail!("--sizes {text}: a sum of the bundle's ranges is not its parts' sizes added ({})", names());
    }
    for (r, &v) in ranges.iter().zip(&values) {
        if v < r.low || v > r.high {
            bail!("--sizes {text}: {}={v} is outside the bundle's range {r}", r.symbol);
        }
    }
    Ok(values)
}

/// `batch=8,seq=384`.
fn point_text(ranges: &[fusec::bundle::BundleRange], values: &[usize]) -> String {
    ranges.iter().zip(values).map(|(r, v)| format!("{}={v}", r.symbol)).collect::<Vec<_>>().join(",")
}

struct Row {
    label: &'static str,
    launches: usize,
    header: fusec::bundle::Header,
    median: f64,
    p10: f64,
    p90: f64,
    floor_ms: f64,
}

/// Median, 10th and 90th percentile of `times`.
fn percentiles(times: &mut [f64]) -> (f64, f64, f64) {
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// Four random, non-zero input sets (token ids below 16, floats in [-1, 1), padding masks and
/// token types as a tokenizer gives them: see `random_input`); one when the
/// inputs are larger than the GPU's L2 cache anyway (rotating them then only costs uploads).
/// With `full_masks` (a decoder's step with its cache, [`fusec::generate::cache::has_cache`])
/// every mask is ones: every sequence at the top of its cache, the step reading all of it as
/// its floor counts it (random padding would leave every row but the first a random share).
/// An integer input that indexes a table of fewer than 16 entries directly (`limits`, the
/// bundle's [`fusec::bundle::Header::index_limits`]) is drawn below the table's size.
fn input_sets(
    inputs: &[IoSpec],
    full_masks: bool,
    limits: &BTreeMap<String, usize>,
) -> anyhow::Result<Vec<Vec<(String, Tensor)>>> {
    let bytes: usize = inputs.iter().filter_map(|i| i.tensor_type()).map(|t| t.size_bytes()).sum();
    let sets = if bytes > 16 << 20 { 1 } else { 4 };
    (0..sets)
        .map(|set| {
            inputs
                .iter()
                .enumerate()
                .map(|(k, spec)| {
                    let ty = spec
                        .tensor_type()
                        .with_context(|| format!("input {} has type {}", spec.name, spec.dtype))?;
                    let (low, high) = match limits.get(&spec.name) {
                        _ if ty.dtype.is_float() => (-1.0, 1.0),
                        Some(&n) if n < 16 => (0.0, n as f64),
                        _ => (1.0, 16.0),
                    };
                    if full_masks && is_mask(&spec.name) {
                        return Ok((spec.name.clone(), Tensor::full(&ty, 1.0)));
                    }
                    Ok((spec.name.clone(), random_input(&spec.name, &ty, 1000 * set + k as u64, low, high)))
                })
                .collect()
        })
        .collect()
}

/// Input sets at the point `values` of a bundle's ranges (`input_sets` of the shapes there).
fn input_sets_at(
    header: &fusec::bundle::Header,
    values: &[usize],
    full_masks: bool,
) -> anyhow::Result<Vec<Vec<(String, Tensor)>>> {
    let specs: Vec<IoSpec> =
        header.inputs.iter().map(|i| IoSpec { shape: i.shape_at(values), ..i.clone() }).collect();
    input_sets(&specs, full_masks, &header.index_limits)
}

impl Bench {
    /// `--sizes`: the bundle for ranges against one bundle per point, side by side.
    fn bench_sizes(
        &self,
        ranged: &Bundle,
        onnx: &std::path::Path,
        import: &fusec::import::ImportOptions,
    ) -> anyhow::Result<ExitCode> {
        let ranges = ranged.header.ranges.clone();
        if ranges.is_empty() {
            bail!("--sizes needs a bundle for a range of sizes: compile with --dim NAME=LO..HI");
        }
        let points: Vec<Vec<usize>> =
            self.sizes.iter().map(|p| parse_point(p, &ranges)).collect::<anyhow::Result<_>>()?;
        let top = fusec::ir::tops(&ranges);
        let progress = Progress::new(self.quiet, "loading the bundle for the ranges");
        let options = SessionOptions { tune_gemms: !self.no_gemm_tuning, ..Default::default() };
        let mut session = Session::with_options(ranged, self.device, options)?;
        // The session's first run, at the top of the ranges (as a server's first request):
        // what is timed below as each point's first run is that point's own set-up.
        let full_masks = fusec::generate::cache::has_cache(&ranged.header.inputs, &ranged.header.outputs);
        session.run(&input_sets_at(&ranged.header, &top, full_masks)?[0])?;
        let mut rows = Vec::new();
        for values in &points {
            let at = point_text(&ranges, values);
            let mut fixed = import.clone();
            for (r, &n) in ranges.iter().zip(values) {
                fixed.dims.insert(r.symbol.clone(), n);
                fixed.low.remove(&r.symbol);
            }
            // Whole input shapes (a bundle's, when a bundle was given) at this point.
            for spec in &mut fixed.inputs {
                if let Some(io) = ranged.header.inputs.iter().find(|i| i.name == spec.name) {
                    spec.shape = io.shape_at(values);
                }
            }
            progress.set(format!("compiling {onnx:?} for {at} alone"));
            let compile_options =
                CompileOptions { import: fixed, precision: ranged.header.precision, ..Default::default() };
            let single = fusec::compile(onnx, &compile_options)?;
            let mut alone = Session::with_options(&single, self.device, options)?;
            let sets = input_sets_at(&ranged.header, values, full_masks)?;
            // Its first run now: the weights it uploads at load, and anything else it leaves in
            // flight, are done before the other session's first run at this point is timed.
            let theirs = alone.run(&sets[0])?;
            progress.set(format!("{at}: first run, then {} timed runs of each", self.iters));
            // The first run at this point, without the copies in and out any run has: its
            // steps set up (launches scaled, GEMM descriptors), its graph captured and run.
            let started = std::time::Instant::now();
            session.select(values)?;
            let setup_ms = started.elapsed().as_secs_f64() * 1e3;
            session.upload(&sets[0])?;
            let started = std::time::Instant::now();
            session.execute_all()?;
            let first_ms = setup_ms + started.elapsed().as_secs_f64() * 1e3;
            let ours = session.run(&sets[0])?;
            // Two half-type programs of one model (their kernels and library algorithms may
            // differ) against each other: the bound of the fused-unfused comparison below.
            let tolerance = builds_tolerance(ranged.header.precision);
            for ((name, x), (_, y)) in ours.iter().zip(&theirs) {
                let err = rel_l2(x, y);
                if err.is_nan() || err > tolerance {
                    bail!("{at}: the bundle for the ranges and the one for {at} alone differ on {name}: rel-L2 {err:e} (tolerance {tolerance:e})");
                }
            }
            let (single_ms, _, _) =
                percentiles(&mut alone.time_runs(&sets, self.warmup, self.iters.max(1))?);
            let (range_ms, p10, p90) =
                percentiles(&mut session.time_runs(&sets, self.warmup, self.iters.max(1))?);
            if self.profile {
                let n = self.iters.clamp(1, 50);
                print_profile_pair(&at, &session.profile(&sets[0], n)?, &alone.profile(&sets[0], n)?);
            }
            rows.push((values.clone(), range_ms, p10, p90, single_ms, first_ms, setup_ms));
        }
        drop(progress);
        let names: Vec<String> = ranges.iter().map(|r| r.to_string()).collect();
        let point_label = |v: &[usize]| v.iter().map(|n| n.to_string()).collect::<Vec<_>>().join("x");
        if !super::shapes::json_to_stdout(self.json.as_deref()) {
            println!(
                "{} on {}, {}, {}: one bundle for the ranges against one compiled for each point alone, {} runs after {} warm-up, CUDA events",
                onnx.display(),
                session.device_name,
                ranged.header.precision,
                names.join(" "),
                self.iters,
                self.warmup
            );
            println!(
                "{:>10} {:>12} {:>10} {:>10} {:>12} {:>8} {:>15} {:>11}",
                ranges.iter().map(|r| r.symbol.as_str()).collect::<Vec<_>>().join("x"),
                "range (ms)",
                "p10",
                "p90",
                "alone (ms)",
                "ratio",
                "first run (ms)",
                "set-up (ms)"
            );
            for (values, range_ms, p10, p90, single_ms, first_ms, setup_ms) in &rows {
                println!(
                    "{:>10} {range_ms:>12.4} {p10:>10.4} {p90:>10.4} {single_ms:>12.4} {:>7.3}x {first_ms:>15.2} {setup_ms:>11.2}",
                    point_label(values),
                    range_ms / single_ms
                );
            }
            println!("ratio = ranges / alone (median); first run = the point's first run after the session's first (at the top of the ranges), without copying inputs and outputs: its set-up (launches scaled, GEMM descriptors), graph capture and run, timed on the host");
        }
        if let Some(path) = &self.json {
            let json = serde_json::json!({
                "schema": "fusec-bench-sizes",
                "schema_version": fusec::picture::JSON_SCHEMA_VERSION,
                "model": onnx.display().to_string(),
                "device": session.device_name,
                "precision": ranged.header.precision,
                "ranges": super::shapes::ranges_json(&ranges),
                "iterations": self.iters,
                "sizes": rows.iter().map(|(values, range_ms, p10, p90, single_ms, first_ms, setup_ms)| serde_json::json!({
                    "size": values.first(), "point": values, "range_median_ms": range_ms, "range_p10_ms": p10, "range_p90_ms": p90,
                    "alone_median_ms": single_ms, "ratio": range_ms / single_ms, "first_run_ms": first_ms,
                    "setup_ms": setup_ms,
                })).collect::<Vec<_>>(),
            });
            super::shapes::write_json(path, &json)?;
        }
        Ok(ExitCode::SUCCESS)
    }

    pub fn execute(self) -> anyhow::Result<ExitCode> {
        if !fusec::runtime::driver_available() {
            bail!("fusec bench needs an NVIDIA GPU: no CUDA driver (libcuda.so) was found on this machine");
        }
        let precision = super::shapes::precision(&self.precision);
        if let Some(setting) = &self.decode {
            let setting = super::bench_decode::parse_setting(setting)?;
            let batch = self.shapes.options()?.dims.get("batch").copied().unwrap_or(1);
            return super::bench_decode::bench_decode(
                &self.model,
                batch,
                setting,
                precision,
                self.device,
                self.strict,
            );
        }
        let progress = Progress::new(self.quiet, "starting");
        let (fused, onnx, import) = if self.model.extension().is_some_and(|e| e == "onnx") {
            let import = self.shapes.options_for(&self.model)?;
            progress.set(format!("compiling {} (fused)", self.model.display()));
            let options = CompileOptions {
                import: import.clone(),
                precision,
                cache_in_place: self.cache_in_place,
                exact_gelu: self.exact_gelu || CompileOptions::default().exact_gelu,
                ..Default::default()
            };
            (fusec::compile(&self.model, &options)?, self.model.clone(), import)
        } else {
            let bundle = Bundle::load(&self.model)?;
            let specs = bundle
                .header
                .inputs
                .iter()
                .map(|i| InputSpec {
                    name: i.name.clone(),
                    shape: i.shape.clone(),
                    dtype: DType::from_name(&i.dtype),
                })
                .collect();
            let onnx = PathBuf::from(&bundle.header.model);
            (bundle, onnx, fusec::import::ImportOptions::new(specs, vec![]))
        };
        if !self.sizes.is_empty() {
            drop(progress);
            return self.bench_sizes(&fused, &onnx, &import);
        }
        progress.set(format!("compiling {} (unfused)", onnx.display()));
        let options = CompileOptions {
            import,
            no_fuse: true,
            precision: fused.header.precision,
            cache_in_place: self.cache_in_place,
            ..Default::default()
        };
        let unfused = fusec::compile(&onnx, &options)?;
        let full_masks = fusec::generate::cache::has_cache(&fused.header.inputs, &fused.header.outputs);
        let sets = input_sets(&fused.header.inputs, full_masks, &fused.header.index_limits)?;
        progress.set("loading both (NVRTC, GEMM algorithm choice) and checking their outputs agree");
        let tune_gemms = !self.no_gemm_tuning;
        // The unfused build is loaded first, so that the fused one makes its load-time choices
        // (programmatic dependent launch) in the state it is timed in: on ViT-B/16 at batch 8
        // the plain program's replays ran 0.817 ms before the unfused build was loaded and
        // 0.835–0.845 after, while with programmatic launch they held at 0.82 (H100,
        // `benches/NOTES.md`).
        let mut slow = Session::with_options(
            &unfused,
            self.device,
            SessionOptions { cuda_graph: false, tune_gemms, ..Default::default() },
        )?;
        let mut fast = Session::with_options(
            &fused,
            self.device,
            SessionOptions { cuda_graph: true, tune_gemms, ..Default::default() },
        )?;
        let tolerance = builds_tolerance(fused.header.precision);
        let (a, b) = (fast.run(&sets[0])?, slow.run(&sets[0])?);
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            let err = rel_l2(x, y);
            if err.is_nan() || err > tolerance {
                bail!("fused and unfused outputs differ on {name}: rel-L2 {err:e} (tolerance {tolerance:e})");
            }
        }
        progress.set("measuring copy bandwidth and GEMM rate");
        let rates = fusec::runtime::measure_rates(self.device, fused.header.precision)?;
        progress.set(format!("timing {} runs of each", self.iters));
        let mut rows = Vec::new();
        for (label, bundle, session) in [("unfused", &unfused, &mut slow), ("fused", &fused, &mut fast)] {
            let mut times = session.time_runs(&sets, self.warmup, self.iters.max(1))?;
            let (median, p10, p90) = percentiles(&mut times);
            let h = &bundle.header;
            let floor_ms = 1e3
                * f64::max(
                    h.flops as f64 / rates.gemm_flops_per_s,
                    h.traffic_bytes as f64 / rates.copy_bytes_per_s,
                );
            rows.push(Row {
                label,
                launches: session.launches(),
                header: h.clone(),
                median,
                p10,
                p90,
                floor_ms,
            });
        }
        let profile = if self.profile {
            progress.set("profiling the fused program step by step, alone and repeated in a graph");
            let mut steps = fast.profile(&sets[0], self.iters.clamp(1, 50))?;
            if self.in_program {
                progress.set("timing the fused program up to each of its steps");
                let shares = fast.profile_in_program(&sets[0], self.iters.clamp(1, 10))?;
                for (step, share) in steps.iter_mut().zip(shares.into_iter().flatten()) {
                    step.in_program_ms = Some(share);
                }
            }
            Some((steps, fast.chained(&sets[0], self.iters.clamp(1, 50))?))
        } else {
            None
        };
        drop(progress);
        let speedup = rows[0].median / rows[1].median;
        let fused_slower = rows[1].median > rows[0].median;
        if fused_slower {
            eprintln!(
                "warning: {}: the fused build is slower than the unfused one ({:.4} ms against {:.4} ms median)",
                onnx.display(),
                rows[1].median,
                rows[0].median
            );
        }
        // With `--json -` standard output carries only the JSON.
        if !super::shapes::json_to_stdout(self.json.as_deref()) {
            println!(
                "{} on {} ({}), {}, {} runs after {} warm-up, CUDA events, {} input sets rotated",
                onnx.display(),
                fast.device_name,
                fast.arch,
                fused.header.precision,
                self.iters,
                self.warmup,
                sets.len()
            );
            println!(
                "measured at start-up: copy {:.2} TB/s (read + write), {} GEMM {:.1} TFLOP/s; model: {:.3} GFLOP in matrix products",
                rates.copy_bytes_per_s / 1e12,
                rates.gemm_dtype,
                rates.gemm_flops_per_s / 1e12,
                fused.header.flops as f64 / 1e9
            );
            println!(
                "{:<9} {:>12} {:>10} {:>10} {:>9} {:>7} {:>13} {:>10} {:>11}",
                "",
                "median (ms)",
                "p10",
                "p90",
                "launches",
                "cuBLAS",
                "graph breaks",
                "HBM (MB)",
                "floor (ms)"
            );
            for r in &rows {
                println!(
                    "{:<9} {:>12.4} {:>10.4} {:>10.4} {:>9} {:>7} {:>13} {:>10.2} {:>11.4}",
                    r.label,
                    r.median,
                    r.p10,
                    r.p90,
                    r.launches,
                    r.header.gemm_calls,
                    r.header.graph_breaks,
                    r.header.traffic_bytes as f64 / 1e6,
                    r.floor_ms
                );
            }
            println!(
                "speedup (unfused / fused median): {speedup:.2}x; fused is {:.2}x its floor",
                rows[1].median / rows[1].floor_ms
            );
            println!("floor = max(FLOPs / GEMM rate, estimated HBM bytes / copy bandwidth)");
            gemm_choice_lines(&fast.gemm_choices).iter().for_each(|l| println!("{l}"));
            if let Some(c) = &fast.launch_choice {
                println!(
                    "programmatic dependent launch {} (the fused program timed as a CUDA graph: {:.4} ms without, {:.4} ms with)",
                    if c.programmatic { "on" } else { "off" },
                    c.plain_ms,
                    c.programmatic_ms
                );
            }
            if let Some((steps, chained)) = &profile {
                print_profile(steps);
                if let Some((queued, one)) = chained {
                    println!(
                        "the fused program {PROFILE_REPEAT} times back to back: {queued:.4} ms a run as {PROFILE_REPEAT} graph launches, {one:.4} ms as one graph of {PROFILE_REPEAT} runs"
                    );
                }
            }
        }
        if let Some(path) = &self.svg {
            use fusec::picture::{latency_svg, Bar};
            let variants: Vec<Bar> = rows
                .iter()
                .map(|r| Bar {
                    label: r.label.to_string(),
                    median_ms: r.median,
                    p10_ms: r.p10,
                    p90_ms: r.p90,
                })
                .collect();
            let mut steps: Vec<Bar> = profile
                .iter()
                .flat_map(|(steps, _)| steps)
                .map(|s| {
                    let ms = s.repeated_ms.unwrap_or(s.alone_ms);
                    Bar { label: s.name.clone(), median_ms: ms, p10_ms: ms, p90_ms: ms }
                })
                .collect();
            steps.sort_by(|a, b| b.median_ms.total_cmp(&a.median_ms));
            steps.truncate(12);
            let title = format!("{} on {}, {}", onnx.display(), fast.device_name, fused.header.precision);
            std::fs::write(path, latency_svg(&title, &variants, &steps))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if let Some(path) = &self.json {
            let json = serde_json::json!({
                "schema": "fusec-bench",
                "schema_version": fusec::picture::JSON_SCHEMA_VERSION,
                "model": onnx.display().to_string(),
                "device": fast.device_name,
                "arch": fast.arch,
                "precision": fused.header.precision,
                "inputs": super::shapes::io_json(&fused.header.inputs, &fused.header.ranges),
                "iterations": self.iters,
                "warmup": self.warmup,
                "input_sets": sets.len(),
                "rates": rates,
                "flops": fused.header.flops,
                "speedup": speedup,
                "fused_slower": fused_slower,
                "variants": rows.iter().map(|r| serde_json::json!({
                    "variant": r.label, "median_ms": r.median, "p10_ms": r.p10, "p90_ms": r.p90,
                    "kernels": r.header.kernels, "launches": r.launches, "gemm_calls": r.header.gemm_calls,
                    "graph_breaks": r.header.graph_breaks, "traffic_bytes": r.header.traffic_bytes, "floor_ms": r.floor_ms,
                })).collect::<Vec<_>>(),
                "gemm_choices": fast.gemm_choices.iter().map(|c| serde_json::json!({
                    "gemm": c.gemm, "reference": format!("{:?}", c.reference), "candidates": c.candidates, "chosen": c.chosen,
                    "heuristic": c.heuristic, "first_us": c.first_us, "chosen_us": c.chosen_us, "cached": c.cached, "revised": c.revised, "config": c.config,
                    "skinny": c.skinny, "narrow": c.narrow,
                })).collect::<Vec<_>>(),
                "chained": profile.as_ref().and_then(|(_, c)| *c).map(|(queued, one)| serde_json::json!({
                    "runs": PROFILE_REPEAT, "launches_ms": queued, "one_graph_ms": one,
                })),
                "programmatic_launch": fast.launch_choice.map(|c| serde_json::json!({
                    "on": c.programmatic, "plain_ms": c.plain_ms, "programmatic_ms": c.programmatic_ms,
                })),
                "profile": profile.as_ref().map(|(steps, _)| steps.iter().map(|s| serde_json::json!({"step": s.name, "ms": s.alone_ms, "repeated_ms": s.repeated_ms, "library_ms": s.library_ms, "in_program_ms": s.in_program_ms})).collect::<Vec<_>>()),
            });
            super::shapes::write_json(path, &json)?;
        }
        if fused_slower && self.strict {
            return Ok(ExitCode::FAILURE);
        }
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{input_sets, parse_point};
    use fusec::bundle::{BundleRange, IoSpec};
    use fusec::generate::cache::has_cache;
    use fusec::ir::{DType, TensorType};
    use fusec::plan::Location;

    /// An integer input that indexes a small table is drawn below its size; others as before.
    #[test]
    fn small_tables_inputs_stay_inside_them() {
        let spec =
            |name: &str| IoSpec::new(name, &TensorType::new(DType::I64, vec![4, 9]), Location::Arena(0));
        let inputs = [spec("segment_ids"), spec("input_ids"), spec("tiny_ids")];
        let limits = BTreeMap::from([
            ("segment_ids".to_string(), 2),
            ("input_ids".into(), 512),
            ("tiny_ids".into(), 1),
        ]);
        for set in input_sets(&inputs, false, &limits).unwrap() {
            let values = |name: &str| set.iter().find(|(n, _)| n == name).unwrap().1.to_f64_vec();
            assert!(values("segment_ids").iter().all(|&v| v == 0.0 || v == 1.0));
            assert!(values("segment_ids").contains(&1.0) && values("segment_ids").contains(&0.0));
            assert!(values("input_ids").iter().all(|&v| (1.0..16.0).contains(&v)));
            assert!(values("tiny_ids").iter().all(|&v| v == 0.0));
        }
    }

    /// A decoder's step with its cache is timed with masks of ones (every sequence at the top
    /// of its cache, the whole cache read); other models' masks are random padding (the first
    /// row whole, the others of random lengths).
    #[test]
    fn a_cache_steps_masks_are_whole() {
        let spec = |name: &str, dtype: DType, shape: &[usize]| {
            IoSpec::new(name, &TensorType::new(dtype, shape.to_vec()), Location::Arena(0))
        };
        let inputs = [
            spec("input_ids", DType::I64, &[8, 1]),
            spec("attention_mask", DType::I64, &[8, 65]),
            spec("past_key_values.0.key", DType::F16, &[8, 2, 64, 16]),
        ];
        let outputs =
            [spec("logits", DType::F32, &[8, 1, 10]), spec("present.0.key", DType::F16, &[8, 2, 65, 16])];
        assert!(has_cache(&inputs, &outputs));
        assert!(!has_cache(&inputs, &outputs[..1]));
        assert!(!has_cache(&inputs[..2], &outputs));
        for full in [true, false] {
            for set in input_sets(&inputs, full, &BTreeMap::new()).unwrap() {
                let mask = set.iter().find(|(n, _)| n == "attention_mask").unwrap().1.to_f64_vec();
                let live = mask.iter().filter(|&&v| v == 1.0).count();
                assert!(mask.iter().all(|&v| v == 0.0 || v == 1.0));
                assert!(mask[..65].iter().all(|&v| v == 1.0), "the first row is whole");
                match full {
                    true => assert_eq!(live, 8 * 65),
                    false => assert!(live < 8 * 65, "{live}"),
                }
                let ids = set.iter().find(|(n, _)| n == "input_ids").unwrap().1.to_f64_vec();
                assert!(ids.iter().all(|&v| (1.0..16.0).contains(&v)), "{ids:?}");
            }
        }
    }

    /// A step for a range of cache lengths: `--sizes` gives the parts (or every range); a sum
    /// is its parts' sizes added, and a point outside a range is an error naming it.
    #[test]
    fn sizes_of_a_bundle_with_a_sum_of_dims() {
        let mut total = BundleRange::new("total", 1, 2048);
        total.sum = vec!["past".into()];
        total.offset = 1;
        let ranges = [BundleRange::new("batch", 1, 8), BundleRange::new("past", 0, 2047), total];
        assert_eq!(parse_point("1x128", &ranges).unwrap(), [1, 128, 129]);
        assert_eq!(parse_point("8x0x1", &ranges).unwrap(), [8, 0, 1]);
        let err = parse_point("1x128x130", &ranges).unwrap_err().to_string();
        assert!(err.contains("not its parts' sizes added"), "{err}");
        let err = parse_point("9x128", &ranges).unwrap_err().to_string();
        assert!(err.contains("batch=9 is outside"), "{err}");
        let err = parse_point("1", &ranges).unwrap_err().to_string();
        assert!(err.contains("1 sizes for the bundle's 3 ranges"), "{err}");
    }
}
