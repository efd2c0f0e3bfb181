//! Where a generation's steps spend their time: host-side laps of each phase, and, with
//! `FUSEC_GENERATE_GPU_TIMES=1`, the GPU's own clock between the same laps (CUDA events on
//! the session's stream), which counts what the GPU did or waited for in each phase rather
//! than how long the host took to issue it.

use std::time::Instant;

use super::GenerateError;
use crate::runtime::TimingEvent;

/// What a step's time goes to: writing its inputs, running the model, reading the logits
/// (or, greedy on the GPU, choosing there and reading the ids), choosing tokens on the host,
/// copying the new keys and values into the cache.
pub const PHASES: [&str; 5] = ["inputs", "model", "logits", "choice", "cache copies"];

/// Whether generations time their phases on the GPU as well (`FUSEC_GENERATE_GPU_TIMES=1`).
pub fn gpu_times() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FUSEC_GENERATE_GPU_TIMES").is_ok_and(|v| v.trim() == "1"))
}

/// GPU events recorded at each lap of a generation: (the phase the lap ends, whether the
/// step counts, the event).
#[derive(Default)]
pub(super) struct Marks(Vec<(usize, bool, TimingEvent)>);

impl Marks {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each counted phase's GPU time in ms: from the event before each of its laps to the
    /// lap's own (waits for the last event).
    pub(super) fn phase_ms(&self) -> Result<[f64; 5], GenerateError> {
        let mut phases = [0.0; 5];
        for pair in self.0.windows(2) {
            let ((_, _, start), (phase, on, end)) = (&pair[0], &pair[1]);
            if *on {
                phases[*phase] += start.elapsed_ms(end)?;
            }
        }
        Ok(phases)
    }
}

/// Adds the time since the last lap to a phase, for the steps after the first tokens, and
/// records a GPU event at each lap where marks are kept.
pub(super) struct Clock<'a> {
    on: bool,
    last: Instant,
    phases: &'a mut [f64; 5],
    marks: Option<&'a mut Marks>,
}

impl<'a> Clock<'a> {
    pub(super) fn new(on: bool, phases: &'a mut [f64; 5], marks: Option<&'a mut Marks>) -> Self {
        Clock { on, last: Instant::now(), phases, marks }
    }

    /// Ends `phase`: its host time added, and a GPU event recorded by `steps` where they can.
    pub(super) fn lap<S: super::Steps>(&mut self, phase: usize, steps: &mut S) -> Result<(), GenerateError> {
        let now = Instant::now();
        if self.on {
            self.phases[phase] += (now - self.last).as_secs_f64() * 1e3;
        }
        self.last = now;
        if let Some(marks) = self.marks.as_deref_mut() {
            if let Some(event) = steps.timing_event()? {
                marks.0.push((phase, self.on, event));
            }
        }
        Ok(())
    }
}
