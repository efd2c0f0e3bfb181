//! The crate's architecture, written down once: the layers of `src/`, bottom first.
//!
//! A module may import the modules of the layers below its own, and nothing of its own layer
//! or above: so the modules' imports have no cycle, and the compile side (`import` to
//! `pipeline`) never reaches the runtime or the command line. This test reads every file of
//! `src/` and fails on an import that runs up or sideways, on cudarc outside the modules that
//! drive CUDA, and on a file longer than the style allows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, bottom first, and the top-level modules of each. A newcomer reads the
/// architecture here.
const LAYERS: &[(&str, &[&str])] = &[
    // Small utilities anyone may use: a hash, an error's one-line report, a worker pool, "did
    // you mean" suggestions, the measuring knobs read from the environment.
    ("utilities", &["checksum", "error_chain", "knobs", "parallel", "suggest"]),
    // The IR: graphs, tensors and their byte codecs, sizes that follow ranges (`ir::sym`),
    // the CPU reference evaluator.
    ("ir", &["ir"]),
    // ONNX to IR through tract-onnx.
    ("import", &["import"]),
    // Graph passes on the IR.
    ("passes", &["passes"]),
    // The e-graph, the cost model, the partition into kernels.
    ("fusion", &["fusion"]),
    // Ordered steps, buffers and the weights.
    ("plan", &["plan"]),
    // CUDA C for each kernel, GEMM specs.
    ("codegen", &["codegen"]),
    // The CUDA C compiler (NVRTC), its cache.
    ("nvrtc", &["nvrtc"]),
    // The bundle file format.
    ("bundle", &["bundle"]),
    // The stages in order, the planner for ranges of sizes.
    ("pipeline", &["pipeline"]),
    // Drawings of programs; tensors in files (`.npy`, TensorProto).
    ("presentation", &["picture", "tensor_io"]),
    // Everything that talks to a GPU: sessions, launches, cuBLAS/cuBLASLt, cuDNN.
    ("runtime", &["runtime"]),
    // Text generation over a session: the key/value cache, sampling, the decoding loop.
    ("generate", &["generate"]),
    // The binary: `main.rs` and one file per subcommand; `lib.rs` names every module.
    ("binary", &["cli", "main", "lib"]),
];

/// Top-level modules that may name `cudarc`: the CUDA C compiler and the runtime.
const CUDA_MODULES: &[&str] = &["nvrtc", "runtime"];

/// No file of `src/` is longer than this (the style's "~800 lines").
const MAX_LINES: usize = 800;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/ir/sym.rs` → `ir`).
fn module_of(file: &Path) -> String {
    let relative = file.strip_prefix(src()).unwrap();
    let first = relative.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_string()
}

/// The code of a line without its comment (doc links are not imports).
fn code(line: &str) -> &str {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") {
        return "";
    }
    match line.find(" //") {
        Some(i) if !line[..i].contains('"') => &line[..i],
        _ => line,
    }
}

/// The top-level library modules `text` names through `prefix` (`crate::`, `fusec::`), also in
/// grouped imports (`use crate::{ir::Graph, plan::Plan}`).
fn named_modules(text: &str, prefix: &str) -> Vec<String> {
    let ident =
        |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item = true,
                    c if item && depth == 1 && !c.is_whitespace() => {
                        found.push(ident(&group[j..]));
                        item = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.push(ident(rest));
        }
    }
    found.retain(|m| !m.is_empty() && m != "self");
    found
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, modules)| modules.contains(&module))
}

/// Every import of a file of `src/`: (file, line, the module it names).
fn imports() -> Vec<(PathBuf, usize, String, String)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let module = module_of(&file);
        let binary = module == "cli" || module == "main";
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let line = code(line);
            // In the binary, `crate::` is the binary and `fusec::` the library.
            let prefix = if binary { "fusec::" } else { "crate::" };
            for named in named_modules(line, prefix) {
                out.push((file.clone(), n + 1, module.clone(), named));
            }
        }
    }
    out
}

#[test]
fn every_module_of_src_is_in_one_layer() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut unplaced: Vec<String> =
        files.iter().map(|f| module_of(f)).filter(|m| layer_of(m).is_none()).collect();
    unplaced.sort();
    unplaced.dedup();
    assert!(unplaced.is_empty(), "modules in no layer of tests/layers.rs: {unplaced:?}");
}

#[test]
fn imports_only_run_down_the_layers() {
    let mut wrong = Vec::new();
    let binary = LAYERS.len() - 1;
    for (file, line, from, to) in imports() {
        // The binary is the top: it may name anything the library exports, at its root too.
        if from == to || layer_of(&from) == Some(binary) {
            continue;
        }
        let (Some(a), Some(b)) = (layer_of(&from), layer_of(&to)) else {
            wrong.push(format!("{}:{line}: {from} imports {to}, which is in no layer", file.display()));
            continue;
        };
        if b >= a {
            wrong.push(format!(
                "{}:{line}: {from} ({}) imports {to} ({}), a layer {}",
                file.display(),
                LAYERS[a].0,
                LAYERS[b].0,
                if a == b { "of its own" } else { "above it" }
            ));
        }
    }
    assert!(wrong.is_empty(), "imports that run up or sideways:\n{}", wrong.join("\n"));
}

#[test]
fn the_compile_side_never_imports_the_runtime_or_the_cli() {
    let runtime = layer_of("runtime").unwrap();
    let compile_side: Vec<&str> =
        LAYERS[..runtime].iter().flat_map(|(_, modules)| modules.iter().copied()).collect();
    for side in ["import", "passes", "fusion", "plan", "codegen", "bundle", "pipeline"] {
        assert!(compile_side.contains(&side), "{side} is below the runtime");
    }
    let wrong: Vec<String> = imports()
        .into_iter()
        .filter(|(_, _, from, to)| compile_side.contains(&from.as_str()) && (to == "runtime" || to == "cli"))
        .map(|(file, line, from, to)| format!("{}:{line}: {from} imports {to}", file.display()))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_module_graph_has_no_cycle() {
    let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, _, from, to) in imports() {
        if from != to {
            edges.entry(from).or_default().push(to);
        }
    }
    // Depth-first search for a back edge; the path to it is the cycle.
    fn visit(
        node: &str,
        edges: &BTreeMap<String, Vec<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(node) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|p| p == node).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(node.to_string(), 1);
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, state, path) {
                return Some(cycle);
            }
        }
        path.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        let cycle = visit(node, &edges, &mut state, &mut Vec::new());
        assert!(cycle.is_none(), "modules import each other in a circle: {}", cycle.unwrap().join(" → "));
    }
}

#[test]
fn only_the_cuda_modules_name_cudarc() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let module = module_of(&file);
        if CUDA_MODULES.contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if code(line).contains("cudarc::") {
                wrong.push(format!("{}:{}", file.display(), n + 1));
            }
        }
    }
    assert!(wrong.is_empty(), "cudarc outside {CUDA_MODULES:?}: {}", wrong.join(", "));
}

#[test]
fn no_file_of_src_is_over_the_style_length() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let long: Vec<String> = files
        .iter()
        .map(|f| (f, std::fs::read_to_string(f).unwrap().lines().count()))
        .filter(|(_, n)| *n > MAX_LINES)
        .map(|(f, n)| format!("{} ({n} lines)", f.display()))
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {}", long.join(", "));
}

#[test]
fn the_import_reader_sees_plain_grouped_and_nested_paths() {
    assert_eq!(named_modules("use crate::ir::Graph;", "crate::"), ["ir"]);
    assert_eq!(
        named_modules("use crate::{ir::{Graph, Tensor}, plan::Plan, self};", "crate::"),
        ["ir", "plan"]
    );
    assert_eq!(named_modules("let x = fusec::runtime::Session::new(b, 0);", "fusec::"), ["runtime"]);
    assert_eq!(named_modules("my_crate::ir::Graph", "crate::"), Vec::<String>::new());
    assert_eq!(code("    /// [`crate::runtime::Session`]"), "");
    assert_eq!(code("let a = 1; // crate::runtime"), "let a = 1;");
}
