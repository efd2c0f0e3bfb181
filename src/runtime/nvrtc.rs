//! Compiling generated kernels to PTX with NVRTC.

use std::path::PathBuf;

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use super::RuntimeError;
use crate::codegen::{KernelSource, DEVICE_HEADER};

/// Whether libnvrtc can be loaded (cudarc would panic on first use otherwise).
pub fn available() -> bool {
    // SAFETY: only tries to dlopen the library; no NVRTC call is made.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The kernel's source as NVRTC compiles it: the shared header inlined (NVRTC has no file
/// system access to `kernels/`).
pub fn full_source(kernel: &KernelSource) -> String {
    kernel.source.replace("#include \"fusec.cuh\"", DEVICE_HEADER)
}

/// A `'static` arch string for NVRTC's options (`sm_90`, …).
fn arch_name(arch: &str) -> &'static str {
    const KNOWN: &[&str] = &["sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120"];
    KNOWN
        .iter()
        .find(|&&a| a == arch)
        .copied()
        .unwrap_or_else(|| Box::leak(arch.to_string().into_boxed_str()))
}

/// Compiles `kernel` to PTX for `arch`. On failure the error holds NVRTC's log and the path
/// where the source was written.
pub fn compile(kernel: &KernelSource, arch: &str) -> Result<String, RuntimeError> {
    if !available() {
        return Err(RuntimeError::NoNvrtc);
    }
    let source = full_source(kernel);
    let options = CompileOptions {
        arch: Some(arch_name(arch)),
        options: vec!["--std=c++17".into(), "-default-device".into()],
        ..Default::default()
    };
    compile_ptx_with_opts(&source, options).map(|ptx| ptx.to_src()).map_err(|e| {
        let path: PathBuf = std::env::temp_dir().join(format!("{}.cu", kernel.name));
        let written = std::fs::write(&path, &source).map(|_| path.display().to_string());
        let log = match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        RuntimeError::Compile {
            kernel: kernel.name.clone(),
            source_path: written.unwrap_or_else(|e| format!("<could not write: {e}>")),
            log,
        }
    })
}
