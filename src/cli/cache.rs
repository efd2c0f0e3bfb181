//! `fusec cache`: where compiled kernels and GEMM algorithm choices are kept, and clearing it.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

/// Show or clear the cache of compiled kernels (PTX) and GEMM algorithm choices.
#[derive(Debug, Args)]
#[command(
    after_help = "The cache is $FUSEC_CACHE_DIR, else fusec/nvrtc in the platform's cache directory (Linux: $XDG_CACHE_HOME, else ~/.cache; macOS: ~/Library/Caches; Windows: %LOCALAPPDATA%).\n\nExamples:\n  fusec cache info\n  FUSEC_CACHE_DIR=/tmp/k fusec cache clear"
)]
pub struct Cache {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Print the cache's directory, and its entries' count and size by kind.
    Info,
    /// Delete the cache's entries (only the files fusec writes there).
    Clear,
}

/// The kind of a file fusec writes to the cache, from its name; `None` for anything else.
fn kind(name: &str) -> Option<&'static str> {
    if name.ends_with(".ptx") {
        Some("compiled kernels (PTX)")
    } else if name.starts_with("cublaslt-") && name.ends_with(".txt") {
        Some("GEMM algorithm choices")
    } else if name.contains(".tmp") {
        Some("unfinished writes")
    } else {
        None
    }
}

/// (kind, files, bytes) of the cache entries in `dir`, by kind.
fn entries(dir: &Path) -> anyhow::Result<Vec<(&'static str, std::path::PathBuf, u64)>> {
    let mut out = Vec::new();
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in listing {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(kind) = kind(&name) {
            let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
            out.push((kind, entry.path(), bytes));
        }
    }
    Ok(out)
}

impl Cache {
    pub fn execute(self) -> anyhow::Result<ExitCode> {
        let dir = fusec::nvrtc::cache_dir().context(
            "no cache directory: set FUSEC_CACHE_DIR (this platform's cache directory was not found)",
        )?;
        let found = entries(&dir)?;
        match self.action {
            Action::Info => {
                println!("cache       {}", dir.display());
                if found.is_empty() {
                    println!("entries     none");
                }
                let mut kinds: Vec<&str> = found.iter().map(|(k, _, _)| *k).collect();
                kinds.sort_unstable();
                kinds.dedup();
                for k in kinds {
                    let (count, bytes) = found
                        .iter()
                        .filter(|(kind, _, _)| *kind == k)
                        .fold((0, 0), |(n, b), (_, _, size)| (n + 1, b + size));
                    println!("{k}: {count} files, {bytes} bytes");
                }
            }
            Action::Clear => {
                for (_, path, _) in &found {
                    std::fs::remove_file(path).with_context(|| format!("deleting {}", path.display()))?;
                }
                println!("deleted {} files from {}", found.len(), dir.display());
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
