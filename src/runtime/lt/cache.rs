//! The cuBLASLt algorithms chosen for GEMMs, kept for the process and in a text file beside the
//! NVRTC cache (keyed by GPU, cuBLASLt version and how they were timed), so that a later session
//! of the same shapes times nothing; and the key a GEMM is known by there.

use cudarc::cublaslt::sys;

use super::{candidates_wanted, variants_wanted, GemmChoice, Lt, LtGemm, Reference, TIMING};
use crate::codegen::GemmSpec;

/// What identifies a GEMM for its algorithm: shape, type, operand layouts, epilogue — every
/// step of it (a uniform scale, the bias, a residual, the activation), so that a GEMM with a
/// residual never shares a choice with one without: plain cuBLAS, a choice only where there is
/// no epilogue, would drop it.
pub(in crate::runtime) fn gemm_key(g: &GemmSpec) -> String {
    let epilogue = g.lt_epilogue.map(|e| e.describe()).filter(|d| !d.is_empty());
    let epilogue = epilogue.map(|d| format!(" +{d}")).unwrap_or_default();
    let t = |transposed: bool| if transposed { "T" } else { "N" };
    let out = g.out.map(|d| format!(" to {d}")).unwrap_or_default();
    format!("{}x{}x{} {}{out} {}{}{epilogue}", g.m, g.n, g.k, g.dtype, t(g.a.transposed), t(g.b.transposed))
}

/// A kept algorithm and how it was chosen.
#[derive(Clone)]
pub(in crate::runtime) struct CachedAlgo {
    pub(super) algo: sys::cublasLtMatmulAlgo_t,
    pub(in crate::runtime) choice: GemmChoice,
}

impl CachedAlgo {
    pub(in crate::runtime) fn new(gemm: &LtGemm, choice: GemmChoice) -> CachedAlgo {
        CachedAlgo { algo: gemm.algo, choice }
    }
}

/// The algorithms chosen for GEMMs on one GPU with one cuBLASLt version (and one way of
/// timing them: the file name carries [`TIMING`]), in memory and in a text file. One GEMM a
/// line: key, reference, kept index, candidates, program µs with the reference and with the
/// kept one, the kept algorithm's 64 opaque bytes in hex. A file that cannot be read or
/// written is skipped: the GEMMs are timed again.
pub(in crate::runtime) struct AlgoCache {
    path: Option<std::path::PathBuf>,
    entries: std::collections::BTreeMap<String, CachedAlgo>,
    changed: bool,
}

/// Choices made or read in this process, by cache file (`None`: no cache directory). Sessions
/// of one process always agree with each other, so that two sessions of one bundle compute
/// the same bits, also when the cache file cannot be written.
type InProcess =
    std::collections::BTreeMap<Option<std::path::PathBuf>, std::collections::BTreeMap<String, CachedAlgo>>;
static IN_PROCESS: std::sync::Mutex<InProcess> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Held from opening the cache to saving it: one session of the process times GEMMs at a
/// time (its timings undisturbed by another's), and each sees the choices of those before it.
pub(in crate::runtime) static TUNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn read_entries(path: Option<&std::path::PathBuf>) -> std::collections::BTreeMap<String, CachedAlgo> {
    let text = path.and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
    text.lines().filter_map(parse_line).collect()
}

impl AlgoCache {
    /// The cache for `device` (its name) in `dir`, or one in memory only when `dir` is `None`:
    /// the file's choices, those this process made overriding them.
    pub(in crate::runtime) fn open(dir: Option<std::path::PathBuf>, device: &str) -> AlgoCache {
        let device: String =
            device.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let path = dir.map(|d| {
            let (candidates, variants) = (candidates_wanted(), variants_wanted());
            d.join(format!("cublaslt-{}-{TIMING}-c{candidates}-v{variants}-{device}.txt", Lt::version()))
        });
        let mut entries = read_entries(path.as_ref());
        let in_process = IN_PROCESS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(made) = in_process.get(&path) {
            entries.extend(made.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        AlgoCache { path, entries, changed: false }
    }

    pub(in crate::runtime) fn get(&self, key: &str) -> Option<&CachedAlgo> {
        self.entries.get(key)
    }

    pub(in crate::runtime) fn insert(&mut self, key: String, value: CachedAlgo) {
        self.entries.insert(key, value);
        self.changed = true;
    }

    /// Keeps the choices for the rest of the process and, when something was added, writes
    /// the file: merged with what other processes wrote meanwhile (the first choice written
    /// for a GEMM stays), to a temporary, then renamed.
    pub(in crate::runtime) fn save(&mut self) {
        let mut in_process = IN_PROCESS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let made = in_process.entry(self.path.clone()).or_default();
        made.extend(self.entries.iter().map(|(k, v)| (k.clone(), v.clone())));
        drop(in_process);
        let Some(path) = self.path.as_ref().filter(|_| self.changed) else { return };
        let mut merged = read_entries(Some(path));
        for (key, entry) in &self.entries {
            merged.entry(key.clone()).or_insert_with(|| entry.clone());
        }
        let text: String = merged.iter().map(|(key, entry)| format_line(key, entry)).collect();
        let temporary = path.with_extension(format!("tmp{}", std::process::id()));
        let written = path.parent().map(std::fs::create_dir_all).transpose().is_ok()
            && std::fs::write(&temporary, text).is_ok()
            && std::fs::rename(&temporary, path).is_ok();
        if written {
            self.changed = false;
        } else {
            let _ = std::fs::remove_file(&temporary);
        }
    }
}

fn format_line(key: &str, entry: &CachedAlgo) -> String {
    let c = &entry.choice;
    let hex: String = entry.algo.data.iter().map(|w| format!("{w:016x}")).collect();
    let reference = match (c.reference, c.skinny, c.narrow) {
        (Reference::Cublas, false, _) => "cublas",
        (Reference::HeuristicFirst, false, _) => "first",
        (Reference::Cublas, true, false) => "cublas+skinny",
        (Reference::HeuristicFirst, true, false) => "first+skinny",
        (Reference::Cublas, true, true) => "cublas+skinny-narrow",
        (Reference::HeuristicFirst, true, true) => "first+skinny-narrow",
    };
    format!(
        "{key}\t{reference}\t{}\t{}\t{}\t{:.3}\t{:.3}\t{hex}\n",
        c.chosen, c.candidates, c.heuristic, c.first_us, c.chosen_us
    )
}

fn parse_line(line: &str) -> Option<(String, CachedAlgo)> {
    let fields: Vec<&str> = line.split('\t').collect();
    let [key, reference, chosen, candidates, heuristic, first, kept, hex] = fields[..] else { return None };
    let (reference, skinny, narrow) = match reference {
        "cublas" => (Reference::Cublas, false, false),
        "first" => (Reference::HeuristicFirst, false, false),
        "cublas+skinny" => (Reference::Cublas, true, false),
        "first+skinny" => (Reference::HeuristicFirst, true, false),
        "cublas+skinny-narrow" => (Reference::Cublas, true, true),
        "first+skinny-narrow" => (Reference::HeuristicFirst, true, true),
        _ => return None,
    };
    if hex.len() != 8 * 16 || !hex.is_ascii() {
        return None;
    }
    let mut data = [0u64; 8];
    for (i, word) in data.iter_mut().enumerate() {
        *word = u64::from_str_radix(&hex[16 * i..16 * (i + 1)], 16).ok()?;
    }
    let algo = sys::cublasLtMatmulAlgo_t { data };
    // The configuration is described once the algorithm is restored (cuBLASLt loaded).
    let choice = GemmChoice {
        gemm: key.to_string(),
        reference,
        candidates: candidates.parse().ok()?,
        heuristic: heuristic.parse().ok()?,
        chosen: chosen.parse().ok()?,
        first_us: first.parse().ok()?,
        chosen_us: kept.parse().ok()?,
        revised: false,
        cached: true,
        config: String::new(),
        skinny,
        narrow,
    };
    Some((key.to_string(), CachedAlgo { algo, choice }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::{GemmOperand, LtActivation, LtEpilogue};
    use crate::ir::DType;
    use crate::plan::Location;

    #[test]
    fn gemm_keys_tell_every_epilogue_step_apart() {
        let operand =
            |offset| GemmOperand { location: Location::Arena(offset), transposed: false, batch_stride: 0 };
        let spec = |lt_epilogue| GemmSpec {
            a: operand(0),
            b: operand(256),
            c: Location::Arena(4096),
            m: 26,
            n: 64,
            k: 128,
            batch: 1,
            alpha: 1.0,
            dtype: DType::F16,
            out: None,
            lt_epilogue,
            dims: None,
        };
        let epilogue = |bias, residual, activation, scale: f32| LtEpilogue {
            bias,
            activation,
            residual,
            scale_bits: scale.to_bits(),
        };
        let weights = Some(Location::Weights(0));
        let plain = gemm_key(&spec(None));
        let residual =
            gemm_key(&spec(Some(epilogue(None, Some(Location::Arena(8192)), LtActivation::None, 1.0))));
        let scaled = gemm_key(&spec(Some(epilogue(None, None, LtActivation::None, 0.5))));
        let biased = gemm_key(&spec(Some(epilogue(weights, None, LtActivation::GeluTanh, 1.0))));
        assert_eq!(plain, "26x64x128 f16 NN");
        assert_eq!(residual, "26x64x128 f16 NN +residual");
        assert_eq!(scaled, "26x64x128 f16 NN +scale");
        // As the cache files before residuals were keyed: their lines still apply.
        assert_eq!(biased, "26x64x128 f16 NN +bias+gelutanh");
    }

    #[test]
    fn cache_lines_round_trip_and_bad_lines_are_skipped() {
        let choice = GemmChoice {
            gemm: "1024x3072x768 f16 N N +bias".into(),
            reference: Reference::Cublas,
            candidates: 12,
            heuristic: 9,
            chosen: 3,
            first_us: 16.25,
            chosen_us: 14.5,
            revised: false,
            cached: false,
            config: String::new(),
            skinny: false,
            narrow: false,
        };
        let data = [1, 2, 3, u64::MAX, 0, 0x0123_4567_89ab_cdef, 7, 8];
        let entry = CachedAlgo { algo: sys::cublasLtMatmulAlgo_t { data }, choice: choice.clone() };
        let line = format_line(&choice.gemm, &entry);
        let (key, back) = parse_line(line.trim_end()).expect("a line it wrote");
        assert_eq!(key, choice.gemm);
        assert_eq!(back.algo.data, data);
        assert_eq!(back.choice, GemmChoice { cached: true, ..choice.clone() });
        // fusec's kernel for a few rows kept: the reference's field says so.
        let skinny = GemmChoice { skinny: true, chosen: 12, ..choice.clone() };
        let kept =
            format_line("1x2304x768 f16 N N +bias skinny", &CachedAlgo { algo: entry.algo, choice: skinny });
        let (_, back) = parse_line(kept.trim_end()).expect("a line it wrote");
        assert!(back.choice.skinny && !back.choice.cublas(), "{kept}");
        let narrow = GemmChoice { skinny: true, narrow: true, chosen: 13, ..choice.clone() };
        let kept =
            format_line("1x2304x768 f16 N N +bias skinny2", &CachedAlgo { algo: entry.algo, choice: narrow });
        let (_, back) = parse_line(kept.trim_end()).unwrap();
        assert!(back.choice.skinny && back.choice.narrow && !back.choice.cublas(), "{kept}");
        for bad in
            ["", "a\tb", &line.trim_end().replace("\t3\t", "\tx\t"), &line.trim_end()[..line.len() - 3]]
        {
            assert!(parse_line(bad).is_none(), "{bad:?}");
        }
    }
}
