//! ONNX import, then the whole compile (passes, fusion, plan, code generation) of whatever
//! imports: bytes of a model file, with the fixtures' dims (batch=2, seq=3).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = fusec_fuzz_path("model.onnx");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let import = fusec::import::ImportOptions::default().dim("batch", 2).dim("seq", 3);
    if fusec::import::import(&path, &import).is_ok() {
        let options = fusec::CompileOptions { import, ..Default::default() };
        let _ = fusec::compile(&path, &options);
    }
});

/// A file of this process's own in a directory of its own (external data resolves beside it).
fn fusec_fuzz_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fusec-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir.join(name)
}
