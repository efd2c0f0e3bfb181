//! The `fusec` binary, run as a user runs it.

mod common;

use std::process::{Command, Output};

use common::cli::{fusec, text};

/// The `--dim` flags each fixture needs.
fn dims_for(file: &str) -> Vec<&'static str> {
    match file {
        f if common::has_cache(f) => {
            vec!["--dim", "batch=3", "--dim", "seq=1", "--dim", "past=5", "--dim", "total=6"]
        }
        f if ["bert", "gpt2", "llama"].iter().any(|p| f.starts_with(p)) => {
            vec!["--dim", "batch=3", "--dim", "seq=7"]
        }
        "op_coverage.onnx" => vec![],
        _ => vec!["--dim", "batch=3"],
    }
}

#[test]
fn inspect_every_fixture() {
    for file in common::all_fixtures() {
        let path = common::model_path(&file);
        let mut args = vec!["inspect", path.to_str().unwrap()];
        args.extend(dims_for(&file));
        let out = fusec(&args);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{file}: {stderr}");
        assert!(stdout.contains("unsupported ops: none"), "{file}: {stdout}");
        let shape_line = stdout.lines().find(|l| l.starts_with("shape ops")).expect("a shape-ops line");
        assert!(shape_line.ends_with(", 0 left after folding"), "{file}: {shape_line}");
        assert!(stdout.contains("parameters  "), "{file}: {stdout}");
        assert!(stdout.contains("output      "), "{file}: {stdout}");
    }
}

/// `fusec inspect … | head`: the reader goes away before the output is written; fusec ends
/// quietly (SIGPIPE, as Unix tools do), not with a panic about a broken pipe.
#[cfg(unix)]
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fusec"))
        .args(["inspect", "models/bert12_ts.onnx", "--dim", "batch=2", "--dim", "seq=16", "--dump"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    // A pipe of one page (Linux; elsewhere the default), so that the ~36 KB dump cannot all
    // fit before the reader goes: the import takes far longer than this call.
    #[cfg(target_os = "linux")]
    // SAFETY: fcntl on a pipe descriptor this process owns.
    unsafe {
        use std::os::fd::AsRawFd;
        libc::fcntl(stdout.as_raw_fd(), libc::F_SETPIPE_SZ, 4096);
    }
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    // The read end is closed here, with most of the dump still to come.
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let status = child.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(status.success() || status.signal() == Some(libc::SIGPIPE), "{status:?}: {stderr}");
}

#[test]
fn inspect_reports_what_folding_did() {
    let path = common::model_path("bert_ts.onnx");
    let out = fusec(&["inspect", path.to_str().unwrap(), "--input", "input:2x9:i64"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("input       input [batch,seq] -> i64[2,9]"), "{stdout}");
    assert!(stdout.contains("output      last_hidden_state f32[2,9,64]"), "{stdout}");
    // The TorchScript export computes its attention mask from Shape/ConstantOfShape.
    assert!(stdout.contains("shape ops   14 in the file, 0 left after folding"), "{stdout}");
    assert!(stdout.contains("Shape 10") && stdout.contains("LayerNormalization 5"), "{stdout}");
}

#[test]
fn inspect_dump_prints_the_graph() {
    let path = common::model_path("gelu_erf_div.onnx");
    let out = fusec(&["inspect", path.to_str().unwrap(), "--dim", "batch=2", "--dump"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success());
    assert!(stdout.contains("= Erf(%") && stdout.contains("output \"y\" = %"), "{stdout}");
}

/// Every failure exits non-zero with one `error:` line that names the file, never a panic.
fn assert_clean_failure(args: &[&str], expect: &[&str]) {
    let out = fusec(args);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    for needle in expect {
        assert!(stderr.contains(needle), "{args:?}: '{needle}' not in {stderr}");
    }
    // No cause said twice in a row (an error whose message names its source, then the source).
    let line = stderr.lines().next().unwrap_or_default();
    let parts: Vec<&str> = line.split(": ").collect();
    assert!(parts.windows(2).all(|w| w[0] != w[1]), "{args:?}: a cause repeated in {line}");
}

#[test]
fn bad_files_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.onnx");
    std::fs::write(&empty, b"").unwrap();
    let noise = dir.path().join("noise.onnx");
    std::fs::write(&noise, (0u32..999).map(|i| (i * 7919 % 251) as u8).collect::<Vec<_>>()).unwrap();
    let truncated = dir.path().join("truncated.onnx");
    let bytes = std::fs::read(common::model_path("gpt2_ts.onnx")).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    assert_clean_failure(&["inspect", "missing.onnx"], &["missing.onnx", "cannot read"]);
    assert_clean_failure(&["inspect", empty.to_str().unwrap()], &["empty.onnx", "empty"]);
    assert_clean_failure(&["inspect", noise.to_str().unwrap()], &["noise.onnx"]);
    assert_clean_failure(&["inspect", truncated.to_str().unwrap()], &["truncated.onnx", "protobuf"]);
    // `generate` says what it compiles, then fails reading the model: the error line names the
    // file once, not in its own context and again in the import error's.
    let out = fusec(&["generate", "missing.onnx", "--prompt-ids", "1,2", "--max-new-tokens", "2"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success() && !stderr.contains("panicked"), "{stderr}");
    let error = stderr.lines().find(|l| l.starts_with("error: ")).unwrap_or_default();
    assert!(error.contains("cannot read"), "{stderr}");
    assert_eq!(error.matches("missing.onnx").count(), 1, "{stderr}");
}

/// A bundle for ranges of batch sizes and sequence lengths: compile says so, inspect shows
/// its header (ranges and symbolic shapes) and the symbolic sizes of a model; a range one
/// program cannot serve and a malformed range are clean errors.
#[test]
fn ranges_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("r.bundle");
    let bundle = bundle.to_str().unwrap();
    let bert = common::model_path("bert_ts.onnx");
    let bert = bert.to_str().unwrap();
    let out = fusec(&["compile", bert, "--dim", "batch=1..8", "--dim", "seq=1..32", "-o", bundle]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(
            "runs batch=1..8 seq=1..32 (activation bytes for batch=8,seq=32): input i64[batch, seq]"
        ),
        "{}",
        text(&out.stdout)
    );
    let out = fusec(&["inspect", bundle]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for needle in [
        "range       batch=1..8",
        "range       seq=1..32",
        "input       input i64[batch, seq]",
        "output      last_hidden_state f32[batch, seq, 64]",
    ] {
        assert!(shown.contains(needle), "'{needle}' not in {shown}");
    }
    let out = fusec(&["inspect", bert, "--dim", "batch=1..8", "--dim", "seq=2..16"]);
    assert!(text(&out.stdout).contains("input     input [batch, seq]"), "{}", text(&out.stdout));
    // The TorchScript masked export, whose mask gather import turns into a view, takes a
    // sequence range too.
    let masked = common::model_path("bert_mask_ts.onnx");
    let out =
        fusec(&["compile", masked.to_str().unwrap(), "--dim", "batch=4", "--dim", "seq=1..16", "-o", bundle]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("attention_mask i64[4, seq]"), "{}", text(&out.stdout));
    assert_clean_failure(&["compile", bert, "--dim", "batch=9..2", "-o", bundle], &["over its high end"]);
    assert_clean_failure(
        &["inspect", bundle, "--fused"],
        &["--fused", "for a bundle, inspect shows its header"],
    );
}

#[test]
fn bad_shapes_fail_cleanly() {
    let bert = common::model_path("bert_ts.onnx");
    let bert = bert.to_str().unwrap();
    assert_clean_failure(&["inspect", bert, "--dim", "batch=2"], &["bert_ts.onnx", "'seq'", "--dim seq=N"]);
    assert_clean_failure(&["inspect", bert, "--input", "ids:2x5"], &["'ids'", "inputs are: input"]);
    assert_clean_failure(&["inspect", bert, "--input", "input:2x5x1"], &["rank 3", "rank 2"]);
}

#[test]
fn unsupported_ops_are_listed_with_a_failing_exit() {
    use prost::Message;
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(common::model_path("mlp_block.onnx")).unwrap();
    let mut proto = tract_onnx::pb::ModelProto::decode(bytes.as_slice()).unwrap();
    for node in &mut proto.graph.as_mut().unwrap().node {
        if node.op_type == "Erf" || node.op_type == "LayerNormalization" {
            node.op_type = format!("Custom{}", node.op_type);
        }
    }
    let path = dir.path().join("custom.onnx");
    std::fs::write(&path, proto.encode_to_vec()).unwrap();
    let out = fusec(&["inspect", path.to_str().unwrap(), "--dim", "batch=1"]);
    let stdout = text(&out.stdout);
    assert!(!out.status.success());
    assert!(stdout.contains("unsupported ops: 2"), "{stdout}");
    assert!(stdout.contains("node 'gelu_erf': CustomErf (opset 17)"), "{stdout}");
    assert!(stdout.contains("node 'layer_norm': CustomLayerNormalization (opset 17)"), "{stdout}");
}

#[test]
fn malformed_flags_are_usage_errors() {
    let out = fusec(&["inspect", "x.onnx", "--dim", "seq"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("is not NAME=N"));
    let out = fusec(&["inspect", "x.onnx", "--input", "x:3xq"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("NAME:DIMxDIM"));
    // --check's bound only with --check.
    let out = fusec(&["run", "x.bundle", "--tolerance", "0.1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--check"), "{}", text(&out.stderr));
}

#[test]
fn inspect_fused_lists_kernels_and_totals() {
    let path = common::model_path("bert_ts.onnx");
    let path = path.to_str().unwrap();
    let out = fusec(&["inspect", path, "--dim", "batch=2", "--dim", "seq=9", "--fused"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("fusion      Saturated after"), "{stdout}");
    assert!(
        stdout.contains("kernels     16 (8 cuBLAS GEMMs), 0 graph breaks, for 238 ONNX nodes"),
        "{stdout}"
    );
    assert!(stdout.contains("gemm+bias+gelu") && stdout.contains("attention"), "{stdout}");
    assert!(stdout.contains("/model/encoder/layer.1/attention/self/query/MatMul"), "{stdout}");
    let out = fusec(&["inspect", path, "--dim", "batch=2", "--dim", "seq=9", "--fused", "--no-fuse"]);
    let stdout = text(&out.stdout);
    // The unfused baseline copies the three folded constants kept as views (the masks and
    // the token-type embeddings) as it does every view.
    assert!(stdout.contains("kernels     73 (16 cuBLAS GEMMs)"), "{stdout}");
    // --no-fuse alone changes nothing shown: no program is listed without --fused.
    let out = fusec(&["inspect", path, "--dim", "batch=2", "--dim", "seq=9", "--no-fuse"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("kernels     "), "{}", text(&out.stdout));
}

#[test]
fn compile_then_run_without_a_gpu_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("mlp.bundle");
    let model = common::model_path("mlp_block.onnx");
    let out =
        fusec(&["compile", model.to_str().unwrap(), "-o", bundle.to_str().unwrap(), "--dim", "batch=2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(
            "3 kernels (3 distinct functions), 4 launches per run (2 cuBLAS GEMMs), 0 graph breaks"
        ),
        "{}",
        text(&out.stdout)
    );
    let half = dir.path().join("mlp16.bundle");
    let args = ["compile", model.to_str().unwrap(), "-o", half.to_str().unwrap(), "--dim", "batch=2"];
    let out = fusec(&[&args[..], &["--precision", "fp16"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = fusec(&[&args[..], &["--precision", "fp8"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    if fusec::runtime::driver_available() {
        println!("skipped the no-GPU half: this machine has a CUDA driver");
        return;
    }
    let x = dir.path().join("x.npy");
    let t = fusec::ir::random_tensor(
        &fusec::ir::TensorType::new(fusec::ir::DType::F32, vec![2, 7, 40]),
        1,
        -1.0,
        1.0,
    );
    fusec::tensor_io::write_npy(&x, &t).unwrap();
    let input = format!("x={}", x.display());
    assert_clean_failure(&["run", bundle.to_str().unwrap(), "--input", &input], &["no CUDA driver"]);
    assert_clean_failure(&["run", "missing.bundle", "--input", &input], &["missing.bundle"]);
}

#[test]
fn bench_without_a_gpu_says_so() {
    if fusec::runtime::driver_available() {
        println!("skipped: this machine has a CUDA driver");
        return;
    }
    let model = common::model_path("mlp_block.onnx");
    assert_clean_failure(
        &["bench", model.to_str().unwrap(), "--dim", "batch=2"],
        &["needs an NVIDIA GPU", "no CUDA driver"],
    );
}

/// `bench --in-program` is a part of `--profile`: asked for alone, the command line is refused
/// before anything is loaded, naming the flag it needs.
#[test]
fn in_program_shares_need_the_profile() {
    let model = common::model_path("mlp_block.onnx");
    let out = fusec(&["bench", model.to_str().unwrap(), "--dim", "batch=2", "--in-program"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--profile") && !stderr.contains("panicked"), "{stderr}");
}

/// `fusec cache info` counts the entries fusec writes, by kind; `fusec cache clear` deletes
/// those and leaves every other file of the directory.
#[test]
fn cache_info_and_clear() {
    let dir = tempfile::tempdir().unwrap();
    let run = |action: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_fusec"))
            .args(["cache", action])
            .env("FUSEC_CACHE_DIR", dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    assert!(run("info").contains("entries     none"));
    std::fs::write(dir.path().join("fusec_attention_0123456789ab-00ff.ptx"), "ptx").unwrap();
    std::fs::write(dir.path().join("fusec_pointwise_0123456789ab-00fe.ptx"), "ptx!").unwrap();
    std::fs::write(dir.path().join("cublaslt-130000-program-H100.txt"), "choices").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not ours").unwrap();
    let info = run("info");
    assert!(info.contains("compiled kernels (PTX): 2 files, 7 bytes"), "{info}");
    assert!(info.contains("GEMM algorithm choices: 1 files, 7 bytes"), "{info}");
    assert!(run("clear").contains("deleted 3 files"));
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["notes.txt"]);
}

/// `fusec --version` says which bundle format it reads and writes and which NVRTC and CUDA
/// driver it finds (or that it finds none).
#[test]
fn version_names_the_bundle_format_and_cuda() {
    let out = fusec(&["--version"]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(stdout.contains(&format!("bundle format {}", fusec::bundle::FORMAT_VERSION)), "{stdout}");
    let line = |prefix: &str| stdout.lines().find(|l| l.starts_with(prefix)).map(str::to_string);
    let nvrtc = line("NVRTC ").unwrap_or_else(|| panic!("no NVRTC line: {stdout}"));
    assert_eq!(nvrtc == "NVRTC not found", !fusec::nvrtc::available(), "{nvrtc}");
    assert!(line("CUDA driver ").is_some(), "{stdout}");
}

/// A misspelled `--dim` or `--input` name gets the closest of the model's names suggested.
#[test]
fn misspelled_names_get_a_suggestion() {
    let model = common::model_path("bert_ts.onnx");
    let model = model.to_str().unwrap();
    let out = fusec(&["inspect", model, "--dim", "bacth=2", "--dim", "seq=3"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("; did you mean 'batch'?"), "{}", text(&out.stderr));
    let out = fusec(&["inspect", model, "--input", "inptu:2x3"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("; did you mean 'input'?"), "{}", text(&out.stderr));
    let out = fusec(&["inspect", model, "--dim", "length=2"]);
    assert!(!text(&out.stderr).contains("did you mean"), "{}", text(&out.stderr));
    // No --dim at all: every symbolic dim is named, with flags that would work.
    let out = fusec(&["inspect", model]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("symbolic dims not given: batch, seq; e.g. --dim batch=1 --dim seq=1"),
        "{stderr}"
    );
    assert!(fusec(&["inspect", model, "--dim", "batch=1", "--dim", "seq=1"]).status.success());
}

/// With NVRTC but no CUDA headers, a half-precision compile says which variable to set
/// (rather than passing on NVRTC's "could not open source file").
#[test]
fn missing_cuda_headers_name_the_variable() {
    if !fusec::nvrtc::available() {
        println!("skipped: NVRTC not found");
        return;
    }
    if std::path::Path::new("/usr/local/cuda/include/cuda_fp16.h").exists() {
        println!("skipped: this machine has the CUDA headers in /usr/local/cuda/include");
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let bundle = out_dir.path().join("b.bundle");
    let out = Command::new(env!("CARGO_BIN_EXE_fusec"))
        .args(["compile", common::model_path("mlp_block.onnx").to_str().unwrap(), "-o"])
        .arg(&bundle)
        .args(["--dim", "batch=2", "--precision", "fp16", "--arch", "sm_90"])
        .env_remove("FUSEC_CUDA_INCLUDE")
        .env_remove("CUDA_HOME")
        .env("FUSEC_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("includes cuda_fp16.h") && stderr.contains("set FUSEC_CUDA_INCLUDE"), "{stderr}");
}

/// `fusec ops` lists every op the importer takes and every fusion rule, and the README's list
/// of supported ops names each of them.
#[test]
fn ops_lists_the_importer_and_the_rules() {
    let out = fusec(&["ops"]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme.split("## Supported ONNX ops").nth(1).unwrap().split("\n## ").next().unwrap();
    let words: Vec<&str> = section.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    for op in fusec::import::supported_ops() {
        assert!(stdout.contains(op), "{op} not listed");
        assert!(words.contains(&op), "README's supported ops do not name {op}");
    }
    for rule in fusec::fusion::rules::all() {
        assert!(stdout.contains(&format!("  {}\n", rule.name)), "rule {} not listed", rule.name);
    }
}

/// `fusec` run from the repository root, so that paths in its output are the relative ones given.
fn fusec_at_root(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fusec"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the fusec binary runs")
}

/// `inspect --cache-in-place --fused` shows the program `fusec generate` runs: each
/// `present = Concat(past, new)` an append of the new positions, no concatenation of a cache
/// left; without the flag, the concatenations; a bundle refuses the flag.
#[test]
fn inspect_shows_the_cache_in_place() {
    let path = common::model_path("gpt2_cache_ts.onnx");
    let path = path.to_str().unwrap();
    let dims = dims_for("gpt2_cache_ts.onnx");
    let mut args = vec!["inspect", path, "--fused"];
    args.extend(dims.iter().copied());
    let out = fusec(&args);
    let plain = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let fused_ops =
        |stdout: &str| stdout.lines().find(|l| l.starts_with("fused ops")).unwrap_or("").to_string();
    assert!(fused_ops(&plain).contains("Concat") && !fused_ops(&plain).contains("Append"), "{plain}");
    args.push("--cache-in-place");
    let out = fusec(&args);
    let in_place = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Two layers, a key and a value cache each; a layer's two appends in one kernel.
    assert!(
        fused_ops(&in_place).contains("Append 4") && !fused_ops(&in_place).contains("Concat"),
        "{in_place}"
    );
    assert_eq!(in_place.lines().filter(|l| l.contains(" append ")).count(), 2, "{in_place}");
    let bundle = std::env::temp_dir().join(format!("fusec-inspect-cache-{}.bundle", std::process::id()));
    let mut compile = vec!["compile", path, "-o", bundle.to_str().unwrap()];
    compile.extend(dims.iter().copied());
    assert!(fusec(&compile).status.success());
    let out = fusec(&["inspect", bundle.to_str().unwrap(), "--cache-in-place"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--cache-in-place shows the program made from an ONNX model"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_file(&bundle).ok();
}

#[test]
fn inspect_dot_is_the_golden_picture() {
    let dir = tempfile::tempdir().unwrap();
    let dot = dir.path().join("mlp.dot");
    let out = fusec_at_root(&[
        "inspect",
        "models/mlp_block.onnx",
        "--input",
        "x:4x7x40",
        "--dot",
        dot.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    insta::assert_snapshot!("inspect_mlp_block_dot", std::fs::read_to_string(&dot).unwrap());
    // One layer of the tiny BERT in fp16, the README's picture (launches 2 to 8).
    let out = fusec_at_root(&[
        "inspect",
        "models/bert_ts.onnx",
        "--dim",
        "batch=2",
        "--dim",
        "seq=16",
        "--precision",
        "fp16",
        "--launches",
        "2..8",
        "--dot",
        dot.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let layer = std::fs::read_to_string(&dot).unwrap();
    assert_eq!(layer.matches("subgraph cluster_").count(), 7, "{layer}");
    assert!(layer.contains("#3 attention") && !layer.contains("cluster_9"), "{layer}");
    insta::assert_snapshot!("inspect_bert_ts_layer_fp16_dot", layer);
}

#[test]
fn inspect_json_is_the_golden_document() {
    let out = fusec_at_root(&["inspect", "models/mlp_block.onnx", "--input", "x:4x7x40", "--json", "-"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("--json - prints only JSON");
    assert_eq!(doc["schema"], "fusec-inspect");
    assert_eq!(doc["schema_version"], fusec::picture::JSON_SCHEMA_VERSION);
    let program = &doc["program"];
    assert_eq!(program["launches"], 3);
    assert_eq!(program["kernels"].as_array().unwrap().len(), 3);
    let bytes: u64 =
        program["kernels"].as_array().unwrap().iter().map(|k| k["estimated_bytes"].as_u64().unwrap()).sum();
    assert_eq!(program["estimated_bytes"].as_u64(), Some(bytes), "the kernels' bytes add up to the total");
    insta::assert_snapshot!("inspect_mlp_block_json", stdout);
    // The unfused baseline: one launch per node that computes.
    let out = fusec_at_root(&[
        "inspect",
        "models/mlp_block.onnx",
        "--input",
        "x:4x7x40",
        "--no-fuse",
        "--json",
        "-",
    ]);
    let doc: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(doc["program"]["fused"], false);
    assert!(doc["program"]["launches"].as_u64().unwrap() > 3, "{doc}");
}

#[test]
fn compile_json_describes_the_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("mlp.bundle");
    let out = fusec_at_root(&[
        "compile",
        "models/mlp_block.onnx",
        "--input",
        "x:4x7x40",
        "-o",
        bundle.to_str().unwrap(),
        "--json",
        "-",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&text(&out.stdout)).expect("--json - prints only JSON");
    assert_eq!(doc["schema"], "fusec-compile");
    assert_eq!(doc["schema_version"], fusec::picture::JSON_SCHEMA_VERSION);
    assert_eq!(
        (doc["kernels"].as_u64(), doc["gemm_calls"].as_u64(), doc["graph_breaks"].as_u64()),
        (Some(3), Some(2), Some(0))
    );
    assert_eq!(doc["bundle_format"], fusec::bundle::FORMAT_VERSION);
    let stages: Vec<&str> =
        doc["stages"].as_array().unwrap().iter().map(|s| s["stage"].as_str().unwrap()).collect();
    assert_eq!(stages.first(), Some(&"import"), "{stages:?}");
    assert_eq!(stages.last(), Some(&"save"), "{stages:?}");
    let loaded = fusec::Bundle::load(&bundle).unwrap();
    assert_eq!(doc["weight_bytes"].as_u64(), Some(loaded.weights.len() as u64));
}

#[test]
fn inspect_svg_renders_or_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("mlp.svg");
    let out = fusec_at_root(&[
        "inspect",
        "models/mlp_block.onnx",
        "--input",
        "x:4x7x40",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let has_dot = Command::new("dot").arg("-V").output().is_ok();
    if has_dot {
        assert!(out.status.success(), "{}", text(&out.stderr));
        let image = std::fs::read_to_string(&svg).unwrap();
        assert!(image.contains("<svg") && image.contains("gemm+bias+gelu"), "{image}");
    } else {
        println!("Graphviz's dot is not installed: checking the error that says so");
        assert!(!out.status.success());
        let stderr = text(&out.stderr);
        assert!(stderr.contains("Graphviz") && stderr.contains("--dot"), "{stderr}");
    }
}

#[test]
fn inspect_launches_out_of_range_is_an_error() {
    let out = fusec_at_root(&[
        "inspect",
        "models/mlp_block.onnx",
        "--input",
        "x:4x7x40",
        "--launches",
        "5..9",
        "--dot",
        "-",
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--launches 5..9: the program has 3 launches (0..2)"), "{stderr}");
    let out = fusec_at_root(&["inspect", "models/mlp_block.onnx", "--launches", "4..2", "--dot", "x.dot"]);
    assert!(text(&out.stderr).contains("the first launch is after the last"), "{}", text(&out.stderr));
}

#[test]
fn rust_log_turns_on_the_stage_logs() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("mlp.bundle");
    let args = ["compile", "models/mlp_block.onnx", "--input", "x:4x7x40", "-o", bundle.to_str().unwrap()];
    // fusec at the repository root with `flags` before `args`, RUST_LOG set to `log` or unset.
    let run = |flags: &[&str], log: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fusec"));
        command.args(flags).args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
        match log {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        command.output().unwrap()
    };
    let quiet = run(&[], None);
    assert!(quiet.status.success(), "{}", text(&quiet.stderr));
    assert!(!text(&quiet.stderr).contains("INFO"), "no logs by default: {}", text(&quiet.stderr));
    let logged = run(&[], Some("fusec=info"));
    let stderr = text(&logged.stderr);
    assert!(stderr.contains("imported models/mlp_block.onnx: 12 ONNX nodes, 12 IR nodes"), "{stderr}");
    assert!(stderr.contains("fusion: Saturated") && stderr.contains("plan: 3 launches"), "{stderr}");
    // -v does the same without RUST_LOG (and compile prints its stage times); -vv adds debug.
    for (flag, wanted, unwanted) in [("-v", "INFO", "DEBUG"), ("-vv", "DEBUG", "")] {
        let out = run(&[flag], None);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{flag}: {stderr}");
        assert!(stderr.contains(wanted) && stderr.contains("plan: 3 launches"), "{flag}: {stderr}");
        assert!(unwanted.is_empty() || !stderr.contains(unwanted), "{flag}: {stderr}");
        assert!(stderr.contains("peak memory") || !cfg!(target_os = "linux"), "{flag}: {stderr}");
    }
}

#[test]
fn the_kernel_cache_lives_in_the_platform_cache_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fusec"))
        .args(["cache", "info"])
        .env_remove("FUSEC_CACHE_DIR")
        .env("XDG_CACHE_HOME", dir.path())
        .env("HOME", dir.path().join("home"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let expected = if cfg!(target_os = "linux") {
        dir.path().join("fusec").join("nvrtc")
    } else {
        dirs::cache_dir().unwrap().join("fusec").join("nvrtc")
    };
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with(&format!("cache       {}\n", expected.display())), "{stdout}");
    // FUSEC_CACHE_DIR overrides it.
    let own = dir.path().join("own");
    let out = Command::new(env!("CARGO_BIN_EXE_fusec"))
        .args(["cache", "info"])
        .env("FUSEC_CACHE_DIR", &own)
        .output()
        .unwrap();
    assert!(
        text(&out.stdout).starts_with(&format!("cache       {}\n", own.display())),
        "{}",
        text(&out.stdout)
    );
}

/// A network's convolutions on cuDNN are counted in `compile`'s and `inspect`'s summaries and
/// in their JSON, in a bundle for one batch and in one for a range of batches alike.
#[test]
fn compile_counts_the_cudnn_convolutions() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::model_path("cnn_block.onnx");
    for batch in ["batch=2", "batch=1..8"] {
        let bundle = dir.path().join("cnn.bundle");
        let json = dir.path().join("cnn.json");
        let args = ["compile", model.to_str().unwrap(), "-o", bundle.to_str().unwrap(), "--dim", batch];
        let out = fusec(&[&args[..], &["--json", json.to_str().unwrap()]].concat());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let convs = doc["conv_calls"].as_u64().unwrap_or(0);
        assert!(convs > 0, "{batch}: {doc}");
        let out = fusec(&["inspect", bundle.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        // (Followed, where a GEMM has few rows, by the kernels for a few rows.)
        let summary = format!("cuBLAS GEMMs, {convs} cuDNN convolutions");
        assert!(text(&out.stdout).contains(&summary), "{batch}: {}", text(&out.stdout));
    }
    // A model without convolutions says nothing of them.
    let mlp = dir.path().join("mlp.bundle");
    let model = common::model_path("mlp_block.onnx");
    let out = fusec(&["compile", model.to_str().unwrap(), "-o", mlp.to_str().unwrap(), "--dim", "batch=2"]);
    assert!(out.status.success() && !text(&out.stdout).contains("cuDNN"), "{}", text(&out.stdout));
}
