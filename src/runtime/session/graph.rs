//! Running the steps: one by one on the first run, then captured as one CUDA graph and
//! replayed.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use super::launch::Loaded;
use super::tuning::TUNE_AFTER_RUNS;
use super::{driver, RuntimeError, Session};

/// Captures of a CUDA graph tried before a failure is an error ([`Session::capture`]).
pub(super) const CAPTURE_TRIES: usize = 5;

impl Session {
    /// Runs every step on the data in device memory — the first time one by one, then (with
    /// CUDA graphs on) as a captured graph — and waits for the GPU.
    pub fn execute_all(&mut self) -> Result<(), RuntimeError> {
        // A size of a range first run after the session's first run (its kernels loaded): its
        // graph is captured straight away and launched, without a run step by step first. If
        // the capture fails, the run goes step by step and captures after, as a first run does.
        if self.use_graph && self.graph.is_none() && self.runs > 0 && !self.ranges.is_empty() {
            match self.capture(|session| session.execute()) {
                Ok(graph) => {
                    graph.upload().map_err(driver)?;
                    self.graph = Some(graph);
                }
                Err(e) => tracing::debug!("capturing {:?} before its first run failed: {e}", self.point),
            }
        }
        match &self.graph {
            Some(graph) => graph.launch().map_err(driver)?,
            None => self.execute()?,
        }
        self.stream.synchronize().map_err(driver)?;
        self.state.queued = false;
        self.check_indices()?;
        self.runs += 1;
        self.point_runs += 1;
        if !self.point_tuned && self.point_runs >= TUNE_AFTER_RUNS {
            self.tune_point()?;
            // The timing left the outputs of the last candidate timed: this run's are those of
            // the algorithms chosen, as the next runs' will be.
            self.execute_all()?;
        }
        if self.use_graph && self.graph.is_none() {
            let graph = self.capture(|session| session.execute())?;
            graph.upload().map_err(driver)?;
            self.graph = Some(graph);
        }
        Ok(())
    }

    /// Sets every input to zeros and runs the program once, so that the one-time work of a
    /// first run — loading its kernels, capturing its CUDA graph, loading the argmax and
    /// sampling kernels a decoding loop chooses tokens with — is done now rather than in the first run that
    /// counts (a generation's time to its first token). The inputs are left zero and the
    /// outputs are those of zeros.
    pub fn warm_up(&mut self) -> Result<(), RuntimeError> {
        let names: Vec<String> = self.inputs.iter().map(|s| s.name.clone()).collect();
        for name in &names {
            self.zero_input(name)?;
        }
        self.execute_all()?;
        self.argmax_kernels()?;
        self.sample_kernels().map(|_| ())
    }

    /// Issues a run on the data in device memory without waiting for it where the run replays
    /// the captured graph with nothing left to set up (its size's GEMMs chosen); otherwise as
    /// [`Session::execute_all`], which waits. What is issued after it on the session's stream
    /// (reading its outputs, writing the next run's inputs) follows it in stream order; a
    /// failure of the run itself shows at the next wait.
    pub fn execute_queued(&mut self) -> Result<(), RuntimeError> {
        let Some(graph) = self.graph.as_ref().filter(|_| self.point_tuned) else {
            return self.execute_all();
        };
        graph.launch().map_err(driver)?;
        self.state.queued = true;
        self.runs += 1;
        self.point_runs += 1;
        Ok(())
    }

    /// The CUDA graph of what `record` launches on the session's stream. Another thread's
    /// call can invalidate a capture in flight (a module unloaded, a context synchronized, by
    /// another session or by the program embedding this one): the capture is then made
    /// again, up to [`CAPTURE_TRIES`] times, before its error is returned.
    pub(super) fn capture(
        &self,
        record: impl Fn(&Self) -> Result<(), RuntimeError>,
    ) -> Result<CudaGraph, RuntimeError> {
        let mut tries = 0;
        loop {
            tries += 1;
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(driver)?;
            let recorded = record(self);
            let captured = self.stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver);
            let failure = match (recorded, captured) {
                (Ok(()), Ok(Some(graph))) => return Ok(graph),
                (Ok(()), Ok(None)) => RuntimeError::Driver("the capture gave no graph".into()),
                (Err(e), _) | (_, Err(e)) => e,
            };
            if tries >= CAPTURE_TRIES {
                return Err(failure);
            }
            tracing::warn!(
                "CUDA graph capture failed (try {tries} of {CAPTURE_TRIES}), trying again: {failure}"
            );
            self.stream.synchronize().map_err(driver)?;
            std::thread::sleep(std::time::Duration::from_millis(tries as u64));
        }
    }

    /// Issues every step, one by one, on the session's stream.
    pub(super) fn execute(&self) -> Result<(), RuntimeError> {
        for step in &self.steps {
            self.execute_step(step)?;
        }
        Ok(())
    }

    /// Kernel launches and library calls per run as loaded (a GEMM whose epilogue cuBLASLt
    /// could not take runs as two).
    pub fn launches(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match s {
                Loaded::Kernel(_) => 1,
                Loaded::Absorbed(_) | Loaded::Merged(_) => 0,
                Loaded::Gemm { epilogue, .. } | Loaded::Conv { epilogue, .. } => {
                    1 + usize::from(epilogue.is_some())
                }
            })
            .sum()
    }

    /// Whether later runs replay a captured CUDA graph.
    pub fn replays_graph(&self) -> bool {
        self.graph.is_some()
    }
}
