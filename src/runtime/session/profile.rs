//! Timing: runs with CUDA events, and each step's GPU time alone and repeated in a graph.

use cudarc::driver::CudaEvent;

use super::launch::Loaded;
use super::{driver, RuntimeError, Session};
use crate::ir::Tensor;

/// How many times [`Session::profile`] repeats a step in a graph to time it without launches.
pub const PROFILE_REPEAT: usize = 20;

/// One step's GPU time from [`Session::profile`], medians in milliseconds.
#[derive(Clone, Debug)]
pub struct StepProfile {
    /// The kernel's name, or the GEMM's description.
    pub name: String,
    /// Issued alone between two events, no graph: its launch included.
    pub alone_ms: f64,
    /// Repeated back to back in a CUDA graph, per repeat (sessions with graphs only): the
    /// step's GPU time without its launch.
    pub repeated_ms: Option<f64>,
    /// For a library call with an epilogue kernel (a GEMM or convolution), the call alone,
    /// repeated in a graph the same way: the rest of `repeated_ms` is the epilogue.
    pub library_ms: Option<f64>,
    /// What the step adds to the program where it runs among the others
    /// ([`Session::profile_in_program`]; `None` until that is run): the program's GPU time up
    /// to and including it less that up to the step before. Its weights come from memory, not
    /// L2 (once the steps before it read more than L2 holds: a shorter prefix finds its bytes
    /// there on its next repeat), and its launch overlaps the kernel before it as in the program.
    pub in_program_ms: Option<f64>,
}

/// A point on the GPU's clock ([`Session::record_timing_event`]).
pub struct TimingEvent(CudaEvent);

impl TimingEvent {
    /// Milliseconds from this event to `end` (waits for both).
    pub fn elapsed_ms(&self, end: &TimingEvent) -> Result<f64, RuntimeError> {
        self.0.elapsed_ms(&end.0).map(f64::from).map_err(driver)
    }
}

/// The middle value of `times` (0 when empty).
pub(super) fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(0.0)
}

impl Session {
    /// GPU time of `iterations` runs in milliseconds, measured with CUDA events around each
    /// run after `warmup` untimed ones; the input sets rotate (uploaded outside the timing).
    pub fn time_runs(
        &mut self,
        input_sets: &[Vec<(String, Tensor)>],
        warmup: usize,
        iterations: usize,
    ) -> Result<Vec<f64>, RuntimeError> {
        if input_sets.is_empty() {
            return Err(RuntimeError::Input("no input sets to time".into()));
        }
        let events = self.timing_events(2)?;
        let (start, end) = (&events[0], &events[1]);
        let mut times = Vec::with_capacity(iterations);
        for i in 0..warmup.max(1) + iterations {
            if i < input_sets.len() || input_sets.len() > 1 {
                self.upload(&input_sets[i % input_sets.len()])?;
            }
            if self.graph.is_none() && self.use_graph {
                // The first run captures the graph; it is not timed.
                self.execute_all()?;
                continue;
            }
            let ms = self.timed_run(start, end)?;
            if i >= warmup.max(1) {
                times.push(ms);
            }
        }
        Ok(times)
    }

    /// GPU time of each step (a kernel, or a GEMM with its epilogue) on `inputs`, median of
    /// `iterations` runs after one warm-up, in program order. Each step is timed two ways:
    /// alone (issued step by step with CUDA events between the steps, no graph: its launch
    /// included) and, where the session uses CUDA graphs, repeated back to back in a graph
    /// (its GPU time without the launch; see `profile_repeated`). Event record nodes between
    /// the steps of the program's graph were tried: each added ~2.5 µs to every step.
    pub fn profile(
        &mut self,
        inputs: &[(String, Tensor)],
        iterations: usize,
    ) -> Result<Vec<StepProfile>, RuntimeError> {
        self.upload(inputs)?;
        let events = self.timing_events(self.steps.len() + 1)?;
        let mut times = vec![Vec::with_capacity(iterations); self.steps.len()];
        // The first pass warms up.
        for i in 0..iterations + 1 {
            events[0].record(&self.stream).map_err(driver)?;
            for (s, step) in self.steps.iter().enumerate() {
                self.execute_step(step)?;
                events[s + 1].record(&self.stream).map_err(driver)?;
            }
            self.stream.synchronize().map_err(driver)?;
            for (s, t) in times.iter_mut().enumerate().filter(|_| i > 0) {
                t.push(f64::from(events[s].elapsed_ms(&events[s + 1]).map_err(driver)?));
            }
        }
        let (repeated, library) = match self.use_graph {
            true => {
                let (r, l) = self.profile_repeated(iterations)?;
                (Some(r), Some(l))
            }
            false => (None, None),
        };
        Ok(self
            .steps
            .iter()
            .zip(times)
            .enumerate()
            .map(|(s, (step, t))| StepProfile {
                name: step.name(),
                alone_ms: median(t),
                repeated_ms: repeated.as_ref().map(|r| r[s]),
                library_ms: library.as_ref().and_then(|l| l[s]),
                in_program_ms: None,
            })
            .collect())
    }

    /// Each step's share of the program's time where it runs among the others (`bench
    /// --profile --in-program`): for each `k`, the program's first `k` steps captured
    /// [`PROFILE_REPEAT`] times back to back in a CUDA graph and timed (median of `iterations`
    /// replays after one, per repeat); a step's share is the time up to and including it less
    /// the time up to the step before it. Unlike [`Session::profile`]'s repeats of one step,
    /// which find its weights in L2 from the repeat before, each step reads what the steps
    /// before it left, as in the program, and starts as early as it does there. None without
    /// graphs. Costs `steps × iterations` replays of up to the whole program.
    pub fn profile_in_program(
        &mut self,
        inputs: &[(String, Tensor)],
        iterations: usize,
    ) -> Result<Option<Vec<f64>>, RuntimeError> {
        if !self.use_graph {
            return Ok(None);
        }
        self.upload(inputs)?;
        self.execute_all()?;
        let mut shares = Vec::with_capacity(self.steps.len());
        let mut before = 0.0;
        for k in 1..=self.steps.len() {
            if let Loaded::Absorbed(_) | Loaded::Merged(_) = &self.steps[k - 1] {
                shares.push(0.0);
                continue;
            }
            let upto = self.repeated(iterations, |session| {
                session.steps[..k].iter().try_for_each(|step| session.execute_step(step))
            })?;
            shares.push(upto - before);
            before = upto;
        }
        Ok(Some(shares))
    }

    /// `count` events that record timing.
    /// A CUDA event that times, recorded on the session's stream now: the GPU's clock when
    /// the work issued before it is done (a decoding loop's phases, `FUSEC_GENERATE_GPU_TIMES`).
    pub fn record_timing_event(&self) -> Result<TimingEvent, RuntimeError> {
        let event = self.timing_events(1)?.pop().ok_or_else(|| RuntimeError::Driver("no event".into()))?;
        event.record(&self.stream).map_err(driver)?;
        Ok(TimingEvent(event))
    }

    pub(super) fn timing_events(&self, count: usize) -> Result<Vec<CudaEvent>, RuntimeError> {
        use cudarc::driver::sys::CUevent_flags;
        let ctx = self.stream.context().clone();
        (0..count)
            .map(|_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(driver)
    }

    /// Each step's GPU time without its launch: the step captured [`PROFILE_REPEAT`] times back
    /// to back in a CUDA graph, the graph's median time over `iterations` replays (after one)
    /// divided by the repeat count; and the same for the library call of a step that has an
    /// epilogue kernel, alone. Inputs are warm in L2, as in the program, where each step's
    /// inputs were just written; a GEMM's weights are too, unlike in the program.
    pub(super) fn profile_repeated(
        &mut self,
        iterations: usize,
    ) -> Result<(Vec<f64>, Vec<Option<f64>>), RuntimeError> {
        let mut times = Vec::with_capacity(self.steps.len());
        let mut library = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            if let Loaded::Absorbed(_) | Loaded::Merged(_) = step {
                // Not run: the GEMM after it computes it.
                times.push(0.0);
                library.push(None);
                continue;
            }
            times.push(self.repeated(iterations, |session| session.execute_step(step))?);
            library.push(match step.has_epilogue() {
                true => Some(self.repeated(iterations, |session| session.execute_library(step))?),
                false => None,
            });
        }
        Ok((times, library))
    }

    /// The whole program's GPU time a run, run [`PROFILE_REPEAT`] times back to back on
    /// `inputs` (medians over `iterations` rounds after one, ms a run), two ways: its graph
    /// launched that many times in a row (as a decoding loop queues its steps), and the
    /// program captured that many times in one graph. What the first takes over the second
    /// is what the GPU spends between one launch's graph and the next. None without graphs.
    pub fn chained(
        &mut self,
        inputs: &[(String, Tensor)],
        iterations: usize,
    ) -> Result<Option<(f64, f64)>, RuntimeError> {
        self.upload(inputs)?;
        self.execute_all()?;
        let Some(graph) = self.graph.as_ref().filter(|_| self.use_graph) else { return Ok(None) };
        let events = self.timing_events(2)?;
        let mut queued = Vec::with_capacity(iterations);
        for i in 0..iterations + 1 {
            events[0].record(&self.stream).map_err(driver)?;
            for _ in 0..PROFILE_REPEAT {
                graph.launch().map_err(driver)?;
            }
            events[1].record(&self.stream).map_err(driver)?;
            let ms = f64::from(events[0].elapsed_ms(&events[1]).map_err(driver)?);
            if i > 0 {
                queued.push(ms / PROFILE_REPEAT as f64);
            }
        }
        let one = self.repeated(iterations, |session| session.execute())?;
        Ok(Some((median(queued), one)))
    }

    /// Median GPU time of `issue`, captured [`PROFILE_REPEAT`] times in a graph, per repeat.
    fn repeated(
        &self,
        iterations: usize,
        issue: impl Fn(&Session) -> Result<(), RuntimeError>,
    ) -> Result<f64, RuntimeError> {
        let events = self.timing_events(2)?;
        let graph = self.capture(|session| (0..PROFILE_REPEAT).try_for_each(|_| issue(session)))?;
        let mut runs = Vec::with_capacity(iterations);
        for i in 0..iterations + 1 {
            events[0].record(&self.stream).map_err(driver)?;
            graph.launch().map_err(driver)?;
            events[1].record(&self.stream).map_err(driver)?;
            let ms = f64::from(events[0].elapsed_ms(&events[1]).map_err(driver)?);
            if i > 0 {
                runs.push(ms / PROFILE_REPEAT as f64);
            }
        }
        Ok(median(runs))
    }
}
