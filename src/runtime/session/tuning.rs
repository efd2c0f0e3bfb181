//! Choosing GEMM algorithms by timing the whole program as a CUDA graph, and the cache of
//! those choices.

use cudarc::driver::CudaEvent;

use super::launch::Loaded;
use super::profile::median;
use super::{driver, lt, GemmChoice, RuntimeError, Session};
use crate::nvrtc;

/// What a GEMM step may run as while its algorithm is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Candidate {
    /// The cuBLAS call.
    Cublas,
    /// The cuBLASLt heuristic's algorithm of this rank.
    Lt(usize),
    /// fusec's kernel for a product of a few rows.
    Skinny,
    /// The same with narrower column tiles.
    SkinnyNarrow,
}

impl Candidate {
    /// Whether it is one of fusec's kernels for a few rows.
    fn few_rows(self) -> bool {
        matches!(self, Candidate::Skinny | Candidate::SkinnyNarrow)
    }
}

/// `FUSEC_SKINNY=1`: every GEMM step with fusec's kernel for a few rows runs it, untimed;
/// `0`: none does; unset: chosen by timing like the library's algorithms.
fn skinny_forced() -> Option<bool> {
    match std::env::var("FUSEC_SKINNY").ok()?.trim() {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

/// Runs at a point of a bundle's ranges after which its GEMM algorithms are timed
/// ([`Session::tune_point`]); before, they are the heuristic's first (or cached) choices.
pub const TUNE_AFTER_RUNS: usize = 8;

impl Session {
    /// Times the GEMM algorithms of the current point of the ranges (one that has run
    /// [`TUNE_AFTER_RUNS`] times), as a session does at the top when it loads: each GEMM
    /// prepared with the heuristic's candidates, the program timed with each, the choices
    /// cached on disk (a point set up later, in this session or another, takes them at once).
    pub(super) fn tune_point(&mut self) -> Result<(), RuntimeError> {
        self.point_tuned = true;
        self.tuned.push(self.point.clone());
        let Some(lt) = self.lt.as_ref() else { return Ok(()) };
        let mut prepared = Vec::new();
        for (i, step) in self.steps.iter().enumerate() {
            if let Loaded::Gemm { gemm, .. } = step {
                let bias = gemm.lt_epilogue.and_then(|e| e.bias).map(|b| self.address(b));
                prepared.push((i, lt.prepare(gemm, bias).map(Box::new)));
            }
        }
        for (i, p) in prepared {
            if let (Some(Loaded::Gemm { lt, on_cublas, gemm, .. }), Some(p)) = (self.steps.get_mut(i), p) {
                // A plain GEMM starts on cuBLAS, the reference it is timed against.
                *on_cublas = gemm.lt_epilogue.is_none();
                *lt = Some(p);
            }
        }
        let _one_at_a_time = lt::TUNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut cache = lt::AlgoCache::open(nvrtc::cache_dir(), &self.device_name);
        let runs = self.runs;
        let choices = self.tune_gemms(&mut cache, true)?;
        cache.save();
        self.runs = runs;
        tracing::debug!("GEMMs at {:?} timed: {} choices", self.point, choices.len());
        Ok(())
    }

    /// Chooses each distinct GEMM's algorithm by timing the whole program (a CUDA graph) with
    /// each candidate in turn — the reference (cuBLAS for a GEMM with no epilogue cuBLASLt
    /// runs, else cuBLASLt's first algorithm), then the heuristic's others and fusec's kernels
    /// for a few rows — and keeping one only when it makes the program faster by more than the
    /// noise margin; then the second pass ([`Session::second_pass`]). A GEMM alone, called back
    /// to back, is a poor guide: in a model its weights come from HBM and its neighbours share
    /// the GPU. Choices in `cache` are applied without timing; without `time`, only they are.
    /// The load runs the passes apart, choosing programmatic launch between them.
    pub(super) fn tune_gemms(
        &mut self,
        cache: &mut lt::AlgoCache,
        time: bool,
    ) -> Result<Vec<GemmChoice>, RuntimeError> {
        let (mut choices, mut timed) = self.first_pass(cache, time)?;
        self.second_pass(&mut timed)?;
        choices.extend(self.finish(cache, timed));
        Ok(choices)
    }

    /// [`Session::tune_gemms`]'s first pass: the cached choices applied (returned), every
    /// other distinct GEMM timed in program order against the program as it stands, each left
    /// on its choice (returned as [`Timed`], for [`Session::second_pass`] and
    /// [`Session::finish`]).
    pub(super) fn first_pass(
        &mut self,
        cache: &mut lt::AlgoCache,
        time: bool,
    ) -> Result<(Vec<GemmChoice>, Vec<Timed>), RuntimeError> {
        let forced_skinny = skinny_forced();
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, step) in self.steps.iter().enumerate() {
            if let Loaded::Gemm { gemm, lt: Some(_), skinny, skinny_narrow, absorbs, .. } = step {
                // Choices with fusec's kernel among the candidates (or forced; with the norm
                // before it taken in; in two tilings) kept apart.
                let norm = if absorbs.is_some() { "+norm" } else { "" };
                let two = if skinny_narrow.is_some() { "2" } else { "" };
                let key = lt::gemm_key(gemm)
                    + &match (skinny.is_some(), forced_skinny) {
                        (false, _) | (true, Some(false)) => String::new(),
                        (true, None) => format!(" skinny{two}{norm}"),
                        (true, Some(true)) => format!(" skinny{two}{norm}-forced"),
                    };
                match groups.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, members)) => members.push(i),
                    None => groups.push((key, vec![i])),
                }
            }
        }
        let mut choices = Vec::new();
        let mut untimed = Vec::new();
        for (key, members) in groups {
            match cache.get(&key).cloned() {
                Some(cached) if self.restore(&members, &cached) => {
                    choices.push(GemmChoice {
                        cached: true,
                        config: self.gemm_config(members[0]),
                        ..cached.choice
                    });
                }
                _ => untimed.push((key, members)),
            }
        }
        if untimed.is_empty() || !time {
            return Ok((choices, Vec::new()));
        }
        let mut best = self.time_program()?;
        let mut timed = Vec::new();
        for (key, members) in untimed {
            let Some(Loaded::Gemm { gemm, lt: Some(prepared), skinny, skinny_narrow, .. }) =
                self.steps.get(members[0])
            else {
                continue;
            };
            // Plain cuBLAS runs no epilogue: a candidate only where there is none (a group's
            // members share one, `lt::gemm_key` naming every step of it).
            let plain = gemm.lt_epilogue.is_none();
            let options: Vec<Candidate> = plain
                .then_some(Candidate::Cublas)
                .into_iter()
                .chain((0..lt::Lt::candidates(prepared)).map(Candidate::Lt))
                .chain(skinny.is_some().then_some(Candidate::Skinny))
                .chain(skinny_narrow.is_some().then_some(Candidate::SkinnyNarrow))
                .collect();
            let heuristic = lt::Lt::heuristic(prepared);
            let reference_ms = best;
            let mut kept = 0;
            // The library's fastest candidate (the reference's time to start with).
            let mut library = (0, best);
            let skinny_here = options.contains(&Candidate::Skinny);
            // Forced, the kernels for a few rows are timed against each other only.
            let mut forced_best = f64::INFINITY;
            for (i, &option) in options.iter().enumerate().skip(1) {
                match forced_skinny {
                    Some(true) if skinny_here && !option.few_rows() => continue,
                    Some(false) if option.few_rows() => continue,
                    _ => {}
                }
                self.apply(&members, option);
                let ms = self.time_program()?;
                tracing::debug!(gemm = %key, candidate = i, config = %self.gemm_config(members[0]), ms, "GEMM candidate timed");
                if !option.few_rows() && ms < library.1 {
                    library = (i, ms);
                }
                let forced = forced_skinny == Some(true) && option.few_rows();
                if (forced && ms < lt::MARGIN * forced_best) || (!forced && ms < lt::MARGIN * best) {
                    best = ms;
                    kept = i;
                    if forced {
                        forced_best = ms;
                    }
                }
            }
            self.apply(&members, options[kept]);
            let choice = GemmChoice {
                gemm: key.clone(),
                reference: if plain { lt::Reference::Cublas } else { lt::Reference::HeuristicFirst },
                candidates: options.len(),
                heuristic: usize::from(plain) + heuristic,
                chosen: kept,
                first_us: 1e3 * reference_ms,
                chosen_us: 1e3 * best,
                cached: false,
                revised: false,
                config: String::new(),
                skinny: false,
                narrow: false,
            };
            timed.push(Timed { key, members, options, library: library.0, choice });
        }
        Ok((choices, timed))
    }

    /// The timed choices as they stand after the passes, described and written into `cache`.
    pub(super) fn finish(&mut self, cache: &mut lt::AlgoCache, timed: Vec<Timed>) -> Vec<GemmChoice> {
        if timed.is_empty() {
            return Vec::new();
        }
        let mut choices = Vec::new();
        for Timed { key, members, options, choice, .. } in timed {
            let kept = options[choice.chosen];
            let choice = GemmChoice {
                config: self.gemm_config(members[0]),
                skinny: kept.few_rows(),
                narrow: kept == Candidate::SkinnyNarrow,
                ..choice
            };
            if let Some(Loaded::Gemm { lt: Some(prepared), .. }) = self.steps.get(members[0]) {
                cache.insert(key, lt::CachedAlgo::new(prepared, choice.clone()));
            }
            choices.push(choice);
        }
        // The next run captures the graph of the chosen algorithms.
        self.graph = None;
        self.runs = 0;
        choices
    }

    /// The choices of one pass in program order are each made against the GEMMs after it as
    /// they stood (a plain product on cuBLAS): a product on fusec's kernel for a few rows, with
    /// the next on a library call, is timed without the overlap programmatic launch gives two
    /// such kernels in a row (GPT-2 small's MLP-up at 32 rows lost its timing by 12 µs with the
    /// MLP-down after it on cuBLAS, and won it by 3 µs once that one was on fusec's kernel:
    /// `benches/NOTES.md`, forty-eighth session). So each product that has a kernel for a few
    /// rows is timed once more with every other product chosen: against the other kind (its
    /// kernels for a few rows, or the library's fastest candidate of the first pass), kept only
    /// where it beats the program as it stands by the noise margin. At load it runs once
    /// programmatic launch is chosen, under the launches the session keeps. Not where the
    /// few-row kernels are forced (`FUSEC_SKINNY`); `FUSEC_TUNE_SECOND_PASS=0` leaves the first
    /// pass's choices, for measuring.
    pub(super) fn second_pass(&mut self, timed: &mut [Timed]) -> Result<(), RuntimeError> {
        if skinny_forced().is_some() || crate::knobs::off("FUSEC_TUNE_SECOND_PASS") {
            return Ok(());
        }
        let revisited: Vec<usize> =
            (0..timed.len()).filter(|&g| timed[g].options.iter().any(|o| o.few_rows())).collect();
        if revisited.is_empty() {
            return Ok(());
        }
        let mut best = self.time_program()?;
        for _ in 0..sweeps() {
            let mut changed = false;
            for &g in &revisited {
                let Timed { key, members, options, library, choice } = &mut timed[g];
                let current = choice.chosen;
                let others = timed_again(options, current, *library);
                let mut kept = current;
                for i in others {
                    self.apply(members, options[i]);
                    let ms = self.time_program()?;
                    tracing::debug!(gemm = %key, candidate = i, ms, "GEMM candidate timed again");
                    if ms < lt::MARGIN * best {
                        best = ms;
                        kept = i;
                    }
                }
                self.apply(members, options[kept]);
                if kept != current {
                    changed = true;
                    choice.chosen = kept;
                    choice.chosen_us = 1e3 * best;
                    choice.revised = true;
                }
            }
            if !changed {
                break;
            }
        }
        Ok(())
    }

    /// The configuration GEMM step `i` runs with: `cuBLAS`, or its cuBLASLt algorithm's.
    pub(super) fn gemm_config(&self, i: usize) -> String {
        match self.steps.get(i) {
            Some(Loaded::Gemm { on_skinny: true, on_narrow: false, .. }) => "fusec skinny kernel".to_string(),
            Some(Loaded::Gemm { on_skinny: true, on_narrow: true, .. }) => {
                "fusec skinny kernel, its second form (narrow tiles; a vocabulary's: A staged)".to_string()
            }
            Some(Loaded::Gemm { on_cublas: true, .. }) => "cuBLAS".to_string(),
            Some(Loaded::Gemm { lt: Some(prepared), .. }) => lt::Lt::config(prepared),
            _ => String::new(),
        }
    }

    /// Runs the GEMM steps `members` as `option` says.
    pub(super) fn apply(&mut self, members: &[usize], option: Candidate) {
        for &i in members {
            if let Some(Loaded::Gemm {
                lt: Some(prepared),
                on_cublas,
                on_skinny,
                on_narrow,
                skinny,
                skinny_narrow,
                absorbs,
                ..
            }) = self.steps.get_mut(i)
            {
                *on_cublas = option == Candidate::Cublas;
                *on_narrow = option == Candidate::SkinnyNarrow && skinny_narrow.is_some();
                *on_skinny = *on_narrow || (option == Candidate::Skinny && skinny.is_some());
                if let Candidate::Lt(rank) = option {
                    lt::Lt::select(prepared, rank);
                }
                let (absorbs, skinny) = (*absorbs, *on_skinny);
                if let Some(j) = absorbs {
                    absorb(&mut self.steps, j, skinny);
                }
            }
        }
    }

    /// Applies a cached choice to `members`; false when it no longer fits.
    pub(super) fn restore(&mut self, members: &[usize], cached: &lt::CachedAlgo) -> bool {
        if cached.choice.skinny {
            let narrow = cached.choice.narrow;
            let all = members.iter().all(|&i| match self.steps.get(i) {
                Some(Loaded::Gemm { skinny_narrow: Some(_), .. }) if narrow => true,
                Some(Loaded::Gemm { skinny: Some(_), .. }) => !narrow,
                _ => false,
            });
            if all {
                self.apply(members, if narrow { Candidate::SkinnyNarrow } else { Candidate::Skinny });
            }
            return all;
        }
        let Some(lt) = self.lt.as_ref() else { return false };
        for &i in members {
            if let Some(Loaded::Gemm { gemm, lt: Some(prepared), on_cublas, .. }) = self.steps.get_mut(i) {
                // Plain cuBLAS runs no epilogue: never the choice of a GEMM with one.
                if cached.choice.cublas() && gemm.lt_epilogue.is_some() {
                    return false;
                }
                *on_cublas = cached.choice.cublas();
                if !*on_cublas && !lt.restore(prepared, cached) {
                    return false;
                }
            }
        }
        true
    }

    /// One run (the graph's replay, or the steps one by one) between `start` and `end`, in
    /// milliseconds, waited for.
    pub(super) fn timed_run(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f64, RuntimeError> {
        start.record(&self.stream).map_err(driver)?;
        match &self.graph {
            Some(graph) => graph.launch().map_err(driver)?,
            None => self.execute()?,
        }
        end.record(&self.stream).map_err(driver)?;
        end.synchronize().map_err(driver)?;
        Ok(f64::from(start.elapsed_ms(end).map_err(driver)?))
    }

    /// Median milliseconds of the program as a CUDA graph (captured anew), over
    /// `lt::TIMED_RUNS` replays after three untimed ones.
    pub(super) fn time_program(&mut self) -> Result<f64, RuntimeError> {
        self.time_replays(|_| Ok(()))
    }

    /// [`Session::time_program`] with `before` done ahead of the capture and of every replay
    /// (outside the timed span).
    pub(super) fn time_replays(
        &mut self,
        mut before: impl FnMut(&mut Self) -> Result<(), RuntimeError>,
    ) -> Result<f64, RuntimeError> {
        self.graph = None;
        before(self)?;
        self.execute_all()?;
        let events = self.timing_events(2)?;
        let mut times = Vec::with_capacity(lt::TIMED_RUNS);
        for i in 0..3 + lt::TIMED_RUNS {
            before(self)?;
            let ms = self.timed_run(&events[0], &events[1])?;
            if i >= 3 {
                times.push(ms);
            }
        }
        Ok(median(times))
    }
}

/// Leaves out every step a merged launch also runs (`Launch::merges`: pointwise kernels
/// launched as one; the decoding attention's projection and the norm before it).
pub(super) fn leave_out_merged(steps: &mut [Loaded]) {
    let merged: Vec<usize> = steps
        .iter()
        .flat_map(|s| match s {
            Loaded::Kernel(launch) => launch.merges.clone(),
            _ => Vec::new(),
        })
        .collect();
    for j in merged {
        if let Some(step @ Loaded::Gemm { .. }) = steps.get_mut(j) {
            *step = Loaded::Merged(step.name());
        }
        absorb(steps, j, true);
    }
}

/// Leaves norm step `j` of `steps` out (`absorbed`: the GEMM after it computes it) or puts it
/// back.
pub(super) fn absorb(steps: &mut [Loaded], j: usize, absorbed: bool) {
    let Some(step) = steps.get_mut(j) else { return };
    let next = match (&*step, absorbed) {
        (Loaded::Kernel(launch), true) => Loaded::Absorbed(launch.clone()),
        (Loaded::Absorbed(launch), false) => Loaded::Kernel(launch.clone()),
        _ => return,
    };
    *step = next;
}

/// `FUSEC_TUNE_SECOND_PASS=before`: the load runs the second pass before it chooses
/// programmatic launch (as first built), not after, for measuring.
pub(super) fn second_pass_before_launch() -> bool {
    std::env::var("FUSEC_TUNE_SECOND_PASS").is_ok_and(|v| v.trim() == "before")
}

/// How many sweeps the second pass makes at most, each over every GEMM with a few-row kernel,
/// stopping after one that changes nothing: 3, or `FUSEC_TUNE_SWEEPS` (1 to 4) for measuring.
/// A sweep judges each GEMM against those after it as the sweep found them: with the norms'
/// scales folded into the weights, GPT-2 small's generator at 32 rows on an H200 kept fusec's
/// kernel for the out-projection after one sweep (0.417–0.420 ms a token) and moved it to
/// cuBLASLt in a second (0.410–0.411) (`benches/NOTES.md`, forty-ninth session).
fn sweeps() -> usize {
    crate::knobs::one_of("FUSEC_TUNE_SWEEPS", &[1, 2, 3, 4]).unwrap_or(3)
}

/// The candidates (indices into `options`) a GEMM is timed against once more in the second
/// pass, after the first chose `current`: the other kind — the library's fastest candidate
/// `library` where it chose a kernel for a few rows, else its kernels for a few rows.
fn timed_again(options: &[Candidate], current: usize, library: usize) -> Vec<usize> {
    if options[current].few_rows() {
        vec![library]
    } else {
        (0..options.len()).filter(|&i| options[i].few_rows()).collect()
    }
}

/// A GEMM choice timed in the first pass ([`Session::tune_gemms`]): its members, its
/// candidates, the library's fastest of them and the choice as it stands.
pub(super) struct Timed {
    key: String,
    members: Vec<usize>,
    options: Vec<Candidate>,
    library: usize,
    choice: GemmChoice,
}

#[cfg(test)]
mod tests {
    use super::{timed_again, Candidate};

    #[test]
    fn the_second_pass_times_the_other_kind() {
        use Candidate::*;
        let options = [Cublas, Lt(0), Lt(1), Skinny, SkinnyNarrow];
        // A library choice: timed against the few-row kernels.
        assert_eq!(timed_again(&options, 0, 2), vec![3, 4]);
        assert_eq!(timed_again(&options, 2, 2), vec![3, 4]);
        // A few-row kernel: timed against the library's fastest of the first pass.
        assert_eq!(timed_again(&options, 3, 2), vec![2]);
        assert_eq!(timed_again(&options, 4, 0), vec![0]);
        let wide_only = [Lt(0), Lt(1), Skinny];
        assert_eq!(timed_again(&wide_only, 1, 1), vec![2]);
    }
}
