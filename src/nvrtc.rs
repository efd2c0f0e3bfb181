//! Compiling generated kernels to PTX with NVRTC, and the cache of what it compiled. A
//! compiler, on the compile side: `compile` puts PTX in bundles with it, and the runtime
//! compiles a bundle's sources at load with it where the bundle has no PTX for the GPU.

use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
use thiserror::Error;

use crate::codegen::{KernelSource, DEVICE_HEADER};
use crate::knobs;

/// Why NVRTC did not give a kernel's PTX.
#[derive(Debug, Error)]
pub enum NvrtcError {
    /// libnvrtc could not be loaded (a bundle without PTX for this GPU needs it).
    #[error("NVRTC is not available: libnvrtc.so.13 was not found (install CUDA 13 or the nvidia-cuda-nvrtc wheel and add its lib/ to LD_LIBRARY_PATH)")]
    NoNvrtc,
    /// A kernel's source includes a CUDA header that no include directory has.
    #[error("kernel {kernel} includes {header}, but no CUDA include directory has it: set FUSEC_CUDA_INCLUDE to one (e.g. /usr/local/cuda/include, or the include/ of the nvidia-cuda-runtime wheel), or CUDA_HOME")]
    NoCudaHeaders {
        /// The kernel's name.
        kernel: String,
        /// The header it includes (`cuda_fp16.h`).
        header: String,
    },
    /// NVRTC rejected a kernel.
    #[error("NVRTC failed on kernel {kernel} (source written to {source_path}):\n{log}")]
    Compile {
        /// The kernel's name.
        kernel: String,
        /// Where its source was written, to read beside the log.
        source_path: String,
        /// NVRTC's log.
        log: String,
    },
}

/// Whether libnvrtc can be loaded (cudarc would panic on first use otherwise), asked once
/// per process: cudarc's check opens and closes the library each time.
pub fn available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: cudarc's presence check only tries to dlopen the library; no call is made.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// The kernel's source as NVRTC compiles it: the shared header inlined (NVRTC has no file
/// system access to `kernels/`). `FUSEC_PDL_EARLY_TRIGGER=0` (at compile time) has each
/// kernel let the next be scheduled only after its own wait ([`source_with_header`]).
pub fn full_source(kernel: &KernelSource) -> String {
    source_with_header(kernel, knobs::off("FUSEC_PDL_EARLY_TRIGGER"))
}

/// [`full_source`], with `fusec::grid_begin` letting the next kernel be scheduled after its
/// wait for the kernel before (`trigger_after_wait`) or, as by default, before it.
pub fn source_with_header(kernel: &KernelSource, trigger_after_wait: bool) -> String {
    let header: std::borrow::Cow<'_, str> = if trigger_after_wait {
        format!("#define FUSEC_TRIGGER_AFTER_WAIT\n{DEVICE_HEADER}").into()
    } else {
        DEVICE_HEADER.into()
    };
    kernel.source.replace("#include \"fusec.cuh\"", &header)
}

/// The CUDA headers (cuda_fp16.h, cuda_bf16.h) kernels on half types include:
/// `$FUSEC_CUDA_INCLUDE`, `$CUDA_HOME/include`, or /usr/local/cuda/include.
pub fn cuda_include_dir() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("FUSEC_CUDA_INCLUDE").map(PathBuf::from),
        std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("include")),
        Some(PathBuf::from("/usr/local/cuda/include")),
    ];
    candidates.into_iter().flatten().find(|d| d.join("cuda_fp16.h").exists())
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
pub fn compile(kernel: &KernelSource, arch: &str) -> Result<String, NvrtcError> {
    if !available() {
        return Err(NvrtcError::NoNvrtc);
    }
    let source = full_source(kernel);
    let include_dir = cuda_include_dir();
    if include_dir.is_none() {
        let needed =
            ["cuda_fp16.h", "cuda_bf16.h"].into_iter().find(|h| source.contains(&format!("#include <{h}>")));
        if let Some(header) = needed {
            return Err(NvrtcError::NoCudaHeaders { kernel: kernel.function.clone(), header: header.into() });
        }
    }
    let options = CompileOptions {
        arch: Some(arch_name(arch)),
        options: vec!["--std=c++17".into(), "-default-device".into()],
        include_paths: include_dir.map(|d| d.display().to_string()).into_iter().collect(),
        ..Default::default()
    };
    compile_ptx_with_opts(&source, options).map(|ptx| ptx.to_src()).map_err(|e| {
        let path: PathBuf = std::env::temp_dir().join(format!("{}.cu", kernel.function));
        let written = std::fs::write(&path, &source).map(|_| path.display().to_string());
        let log = match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        NvrtcError::Compile {
            kernel: format!("{} ({})", kernel.function, kernel.name),
            source_path: written.unwrap_or_else(|e| format!("<could not write: {e}>")),
            log,
        }
    })
}

/// NVRTC's version (major, minor), or `None` where libnvrtc cannot be loaded.
pub fn version() -> Option<(i32, i32)> {
    available().then(nvrtc_version)
}

/// NVRTC's version, part of the cache key (a newer NVRTC may emit different PTX).
fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints; only called after `available()` said the library loads.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// Where compiled PTX is cached: `$FUSEC_CACHE_DIR`, else `fusec/nvrtc` in the platform's
/// cache directory (Linux: `$XDG_CACHE_HOME`, else `~/.cache`; macOS: `~/Library/Caches`;
/// Windows: `%LOCALAPPDATA%`).
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("FUSEC_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    Some(dirs::cache_dir()?.join("fusec").join("nvrtc"))
}

/// Every cache entry ends with this line and the FNV-1a checksum of the PTX before it
/// ([`crate::checksum::checksum`], 16 hex digits): an entry cut short, changed in any byte, or not
/// written by fusec is compiled again, never loaded.
const CACHE_END: &str = "// fusec nvrtc cache entry, checksum ";

/// A cache entry's text: the PTX and its end line.
fn cache_text(ptx: &str) -> String {
    format!("{ptx}{CACHE_END}{:016x}\n", crate::checksum::checksum(ptx.as_bytes()))
}

/// The PTX of a cache entry, if it is whole, unchanged and defines `function`.
fn cache_entry(text: String, function: &str) -> Option<String> {
    let (ptx, sum) = text.strip_suffix('\n')?.rsplit_once(CACHE_END)?;
    let whole = u64::from_str_radix(sum, 16).ok() == Some(crate::checksum::checksum(ptx.as_bytes()));
    (whole && ptx.contains(&format!(".entry {function}("))).then(|| ptx.to_string())
}

/// [`compile`] with a cache on disk keyed by the source's hash, the arch and NVRTC's
/// version. A cache that cannot be read or written is skipped, never an error. Entries are
/// written to a file of their own (unique to the process, thread and write) and renamed into
/// place, so a reader never sees one half written.
pub fn compile_cached(kernel: &KernelSource, arch: &str) -> Result<String, NvrtcError> {
    static WRITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if !available() {
        return Err(NvrtcError::NoNvrtc);
    }
    let (major, minor) = nvrtc_version();
    let key = crate::checksum::checksum(
        format!("{arch}\0nvrtc {major}.{minor}\0{}", full_source(kernel)).as_bytes(),
    );
    let path = cache_dir().map(|d| d.join(format!("{}-{key:016x}.ptx", kernel.function)));
    let cached = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
    if let Some(ptx) = cached.and_then(|text| cache_entry(text, &kernel.function)) {
        tracing::debug!(function = %kernel.function, "NVRTC cache hit");
        return Ok(ptx);
    }
    let clock = std::time::Instant::now();
    let ptx = compile(kernel, arch)?;
    tracing::debug!(function = %kernel.function, ms = clock.elapsed().as_secs_f64() * 1e3, "compiled with NVRTC");
    if let Some(path) = path {
        let written = path.parent().map(std::fs::create_dir_all).transpose().ok().and_then(|_| {
            let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
            std::fs::write(&tmp, cache_text(&ptx)).and_then(|_| std::fs::rename(&tmp, &path)).ok()
        });
        let _ = written;
    }
    Ok(ptx)
}

/// [`compile_cached`] for many kernels at once, each function once, on as many threads as
/// the machine has cores: PTX by function. The first failure is returned.
pub fn compile_all_cached(
    kernels: &[&KernelSource],
    arch: &str,
) -> Result<std::collections::HashMap<String, String>, NvrtcError> {
    let mut seen = std::collections::HashSet::new();
    let distinct: Vec<&KernelSource> = kernels.iter().copied().filter(|k| seen.insert(&k.function)).collect();
    tracing::info!("NVRTC: {} kernels, {} distinct functions, for {arch}", kernels.len(), distinct.len());
    let results = crate::parallel::map_on(crate::parallel::COMPILERS, &distinct, |kernel| {
        compile_cached(kernel, arch).map(|ptx| (kernel.function.clone(), ptx))
    });
    results.into_iter().collect()
}
