//! What `fusec bench` prints besides its table: how each GEMM's algorithm was chosen (also
//! printed by `generate -v`) and where the fused program's time goes (`--profile`).

use fusec::runtime::StepProfile;

/// How each distinct GEMM's algorithm was chosen, and what that did to the whole program: a
/// heading and a line a GEMM (none where nothing was chosen). `generate -v` prints them too.
pub(super) fn gemm_choice_lines(choices: &[fusec::runtime::GemmChoice]) -> Vec<String> {
    use fusec::runtime::GemmReference;
    if choices.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![format!(
        "GEMM algorithms (the fused program timed as a CUDA graph with the reference, each of the cuBLASLt heuristic's top {} and up to {} variants of its first ones, and fusec's kernel for a product of a few rows):",
        fusec::runtime::gemm_candidates(),
        fusec::runtime::gemm_variants()
    )];
    for c in choices {
        let reference = match c.reference {
            GemmReference::Cublas => "cuBLAS",
            GemmReference::HeuristicFirst => "cuBLASLt's first",
        };
        let kept = match (c.chosen, c.reference) {
            _ if c.narrow => {
                "fusec's kernel for a few rows, its second form (narrow tiles; a vocabulary's: A staged)"
                    .to_string()
            }
            _ if c.skinny => "fusec's kernel for a few rows".to_string(),
            (0, _) => format!("{reference} kept"),
            (n, _) if n >= c.heuristic => {
                format!("cuBLASLt variant {} of {}", n - c.heuristic + 1, c.candidates - c.heuristic)
            }
            (n, GemmReference::Cublas) => format!("cuBLASLt algorithm {n} of {}", c.heuristic - 1),
            (n, GemmReference::HeuristicFirst) => format!("cuBLASLt algorithm {} of {}", n + 1, c.heuristic),
        };
        let how = if c.cached {
            "cached".to_string()
        } else {
            let again = if c.revised { ", this on a second pass with the other GEMMs chosen" } else { "" };
            format!("program {:.4} -> {:.4} ms{again}", c.first_us / 1e3, c.chosen_us / 1e3)
        };
        lines.push(format!("  {:<36} {kept} ({how}): {}", c.gemm, c.config));
    }
    lines
}

/// The sixteen steps that take longest (`FUSEC_PROFILE_STEPS=N`: `N` of them), their GPU time
/// repeated in a graph where the session has graphs, else alone, with their share of that
/// total, and each step's time alone.
pub(super) fn print_profile(steps: &[StepProfile]) {
    let key = |s: &StepProfile| s.repeated_ms.unwrap_or(s.alone_ms);
    let total: f64 = steps.iter().map(key).sum();
    let alone: f64 = steps.iter().map(|s| s.alone_ms).sum();
    let mut sorted: Vec<&StepProfile> = steps.iter().collect();
    sorted.sort_by(|a, b| key(b).total_cmp(&key(a)));
    let graph = steps.first().is_some_and(|s| s.repeated_ms.is_some());
    println!(
        "profile: fused program, {} steps; {}; issued alone one by one, launches included: {alone:.4} ms in all. Top steps:",
        steps.len(),
        match graph {
            true => format!(
                "GPU time without launches (each step repeated {} times in a CUDA graph): {total:.4} ms in all",
                fusec::runtime::PROFILE_REPEAT
            ),
            false => "no CUDA graph".to_string(),
        }
    );
    let in_program = steps.iter().any(|s| s.in_program_ms.is_some());
    if in_program {
        let sum: f64 = steps.iter().filter_map(|s| s.in_program_ms).sum();
        println!("  (in program: what each step adds where it runs among the others, {sum:.4} ms in all)");
    }
    println!(
        "  {:>12} {:>6} {:>12} {:>12}{}",
        if graph { "GPU ms" } else { "alone ms" },
        "share",
        "alone ms",
        "library ms",
        if in_program { format!(" {:>13}", "in program ms") } else { String::new() }
    );
    let shown = std::env::var("FUSEC_PROFILE_STEPS").ok().and_then(|v| v.trim().parse().ok());
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |ms| format!("{ms:.4}"));
    for s in sorted.iter().take(shown.unwrap_or(16)) {
        let library = ms(s.library_ms);
        println!(
            "  {:>12.4} {:>5.1}% {:>12.4} {library:>12}{}  {}",
            key(s),
            100.0 * key(s) / total.max(f64::MIN_POSITIVE),
            s.alone_ms,
            if in_program { format!(" {:>13}", ms(s.in_program_ms)) } else { String::new() },
            s.name
        );
    }
}

/// The steps of a bundle for ranges beside those of one for the point `at` alone (GPU time
/// of each, repeated in a CUDA graph where there is one), the largest differences first.
pub(super) fn print_profile_pair(at: &str, ranged: &[StepProfile], alone: &[StepProfile]) {
    let key = |s: &StepProfile| s.repeated_ms.unwrap_or(s.alone_ms);
    let total = |steps: &[StepProfile]| steps.iter().map(key).sum::<f64>();
    println!(
        "profile at {at}: {} steps for the ranges, {:.4} ms; {} alone, {:.4} ms",
        ranged.len(),
        total(ranged),
        alone.len(),
        total(alone)
    );
    if ranged.len() != alone.len() {
        print_profile(ranged);
        print_profile(alone);
        return;
    }
    let mut pairs: Vec<(&StepProfile, &StepProfile)> = ranged.iter().zip(alone).collect();
    pairs.sort_by(|a, b| (key(b.0) - key(b.1)).total_cmp(&(key(a.0) - key(a.1))));
    println!("  {:>12} {:>12}  step", "ranges ms", "alone ms");
    for (r, a) in pairs.iter().take(12) {
        println!("  {:>12.4} {:>12.4}  {} / {}", key(r), key(a), r.name, a.name);
    }
}
