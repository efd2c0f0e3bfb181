//! The sizes of a bundle's ranges: the point a session runs at, chosen from its inputs or
//! by the caller, and each point's steps (launches scaled, GEMMs at their sizes).

use super::super::dnn::ConvCall;
use super::launch::Loaded;
use super::{driver, lt, RuntimeError, Session};
use crate::ir::Tensor;
use crate::nvrtc;

impl Session {
    /// Checks the inputs against the bundle's ([`crate::bundle::input_point`]); returns the
    /// point of the ranges they are at (empty for a bundle without ranges).
    pub(super) fn check_inputs(&self, inputs: &[(String, Tensor)]) -> Result<Vec<usize>, RuntimeError> {
        crate::bundle::input_point(&self.inputs, &self.ranges, inputs).map_err(RuntimeError::Input)
    }

    /// The size of the bundle's one range the session runs at (the top of the range until
    /// inputs of another size are given; 0 for a bundle without ranges); for a bundle with
    /// several ranges, the first's ([`Session::point`] has them all).
    pub fn size(&self) -> usize {
        self.point.first().copied().unwrap_or(0)
    }

    /// The point of the bundle's ranges the session runs at: the size of each range, in the
    /// order of [`crate::bundle::Header::ranges`] (empty without ranges).
    pub fn point(&self) -> &[usize] {
        &self.point
    }

    /// [`Session::select`] for a bundle with one range.
    pub fn select_size(&mut self, n: usize) -> Result<(), RuntimeError> {
        if self.ranges.len() > 1 {
            return Err(RuntimeError::Input(format!(
                "the bundle has {} ranges ({}): select a point of all of them",
                self.ranges.len(),
                self.ranges.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
            )));
        }
        if self.ranges.is_empty() {
            return if n == 0 {
                Ok(())
            } else {
                Err(RuntimeError::Input(format!("the bundle runs one size, not a range (asked for {n})")))
            };
        }
        self.select(&[n])
    }

    /// Makes the session run at the point `values` of the bundle's ranges (the size of each,
    /// in order): the steps and CUDA graph of that point, set up on its first use (GEMM
    /// descriptors; the graph is captured on its first run) and kept for the
    /// [`super::SessionOptions::sizes_kept`] points used last. `run` does this from its inputs'
    /// shapes; callers that write inputs in device memory (`input_device_ptr`) call it
    /// themselves.
    pub fn select(&mut self, values: &[usize]) -> Result<(), RuntimeError> {
        if values == self.point.as_slice() {
            return Ok(());
        }
        if values.len() != self.ranges.len() {
            return Err(RuntimeError::Input(format!(
                "{} sizes given for the bundle's {} ranges",
                values.len(),
                self.ranges.len()
            )));
        }
        // A sum of others (`total=past+seq`) is its parts' sizes added, whatever was given.
        let summed = crate::ir::with_sums(&self.ranges, values).ok_or_else(|| {
            RuntimeError::Input("the bundle's ranges name a sum of dims it does not have".into())
        })?;
        let values = summed.as_slice();
        if values == self.point.as_slice() {
            return Ok(());
        }
        for (range, &n) in self.ranges.iter().zip(values) {
            if n < range.low || n > range.high {
                return Err(RuntimeError::Input(format!(
                    "{}={n} is outside the bundle's range {}..{}",
                    range.symbol, range.low, range.high
                )));
            }
        }
        let top = crate::ir::tops(&self.ranges);
        // The graphs of the steps parked or dropped here refer to this stream's work.
        self.stream.synchronize().map_err(driver)?;
        let steps = std::mem::take(&mut self.steps);
        let graph = self.graph.take();
        self.sizes.push((std::mem::take(&mut self.point), steps, graph));
        let (steps, graph) = match self.sizes.iter().position(|(s, _, _)| s.as_slice() == values) {
            Some(i) => {
                let (_, steps, graph) = self.sizes.remove(i);
                (steps, graph)
            }
            None => {
                let steps = self.sizes.iter().find(|(s, _, _)| *s == top).map(|(_, steps, _)| steps);
                let steps =
                    steps.ok_or_else(|| RuntimeError::Driver("the top size's steps are missing".into()))?;
                (self.steps_at(steps, values)?, None)
            }
        };
        self.steps = steps;
        self.graph = graph;
        self.point = values.to_vec();
        self.point_runs = 0;
        self.point_tuned = values == top.as_slice() || self.tuned.iter().any(|t| t == values);
        // Least recently used first; the top of the ranges stays.
        while self.sizes.len() + 1 > self.sizes_kept.max(2) {
            let Some(i) = self.sizes.iter().position(|(s, _, _)| *s != top) else { break };
            drop(self.sizes.remove(i));
        }
        Ok(())
    }

    /// Convolution `spec` (whose batch follows the ranges) set up at the point `values`: its
    /// descriptors at that batch and the algorithm chosen for them (measured on first use in
    /// the process, within the session's workspace), with cuDNN's fused bias and activation
    /// where its epilogue is one and cuDNN takes it at that batch.
    fn conv_at(&self, spec: &crate::codegen::ConvSpec, values: &[usize]) -> Result<ConvCall, RuntimeError> {
        let at = spec
            .at(values)
            .ok_or_else(|| RuntimeError::Input(format!("a convolution's batch at {values:?} overflows")))?;
        let dnn = self.dnn.as_ref().ok_or_else(|| RuntimeError::Driver("no cuDNN handle".into()))?;
        let addresses = (self.address(at.x), self.address(at.w), self.address(at.y));
        let fused = at.fused.map(|f| (self.address(f.bias), self.address(f.residual.unwrap_or(at.y))));
        ConvCall::new(dnn, &at, addresses, self.conv_workspace(), &self.device_name, fused)
    }

    /// The steps at the point `values` of the bundle's ranges, from the top's: launches
    /// scaled, GEMMs at their sizes (cuBLASLt's heuristic choice where it runs an epilogue,
    /// cuBLAS for the others: algorithm timing is for the top).
    pub(super) fn steps_at(&self, top: &[Loaded], values: &[usize]) -> Result<Vec<Loaded>, RuntimeError> {
        // GEMM algorithms timed before at these shapes, on this GPU ([`Session::tune_point`]).
        let cache = self.tune.then(|| lt::AlgoCache::open(nvrtc::cache_dir(), &self.device_name));
        let mut steps = top
            .iter()
            .map(|step| {
                Ok(match step {
                    // A norm a GEMM after it may take in: left out below where it does.
                    Loaded::Kernel(launch) | Loaded::Absorbed(launch) => Loaded::Kernel(launch.at(values)?),
                    Loaded::Merged(name) => Loaded::Merged(name.clone()),
                    // A product of the same sizes at every point: the top's choices (its
                    // algorithm, or the kernel for a few rows with the norm it takes in).
                    Loaded::Gemm {
                        gemm,
                        epilogue,
                        on_cublas,
                        lt,
                        skinny,
                        skinny_narrow,
                        on_skinny,
                        on_narrow,
                        absorbs,
                    } if gemm.dims.is_none() => {
                        let prepared = match (lt, self.lt.as_ref()) {
                            (Some(top), Some(handle)) => {
                                let bias = gemm.lt_epilogue.and_then(|e| e.bias).map(|b| self.address(b));
                                let mut p = handle.prepare(gemm, bias).ok_or_else(|| {
                                    RuntimeError::Driver(format!(
                                        "cuBLASLt has no algorithm for the {}x{}x{} GEMM",
                                        gemm.m, gemm.n, gemm.k
                                    ))
                                })?;
                                lt::Lt::same_algo(&mut p, top);
                                Some(Box::new(p))
                            }
                            _ => None,
                        };
                        Loaded::Gemm {
                            gemm: gemm.clone(),
                            epilogue: epilogue.clone(),
                            on_cublas: *on_cublas,
                            lt: prepared,
                            skinny: skinny.clone(),
                            skinny_narrow: skinny_narrow.clone(),
                            on_skinny: *on_skinny,
                            on_narrow: *on_narrow,
                            absorbs: *absorbs,
                        }
                    }
                    Loaded::Conv { spec, call, epilogue, spare } => {
                        let call = match spec.batch {
                            Some(_) => std::sync::Arc::new(self.conv_at(spec, values)?),
                            None => call.clone(),
                        };
                        // The epilogue kernel where cuDNN does not fuse it at this batch.
                        let kernel = if call.fused() { None } else { epilogue.as_ref().or(spare.as_deref()) };
                        Loaded::Conv {
                            epilogue: kernel.map(|l| l.at(values)).transpose()?,
                            call,
                            spec: spec.clone(),
                            spare: None,
                        }
                    }
                    Loaded::Gemm { gemm, epilogue, lt, .. } => {
                        let gemm = gemm.at(values).ok_or_else(|| {
                            RuntimeError::Input(format!("a GEMM's sizes at {values:?} overflow"))
                        })?;
                        let epilogue = epilogue.as_ref().map(|l| l.at(values)).transpose()?;
                        let cached = cache.as_ref().and_then(|c| c.get(&lt::gemm_key(&gemm)));
                        let mut prepared = match (lt, gemm.lt_epilogue) {
                            // A plain GEMM whose algorithm was timed at this size before (by
                            // this bundle at this point, or another at that shape): cuBLASLt's.
                            (Some(_), None) if cached.is_some_and(|c| !c.choice.cublas()) => {
                                self.lt.as_ref().and_then(|l| l.prepare_first(&gemm, None)).map(Box::new)
                            }
                            (Some(_), Some(e)) => {
                                let lt = self
                                    .lt
                                    .as_ref()
                                    .ok_or_else(|| RuntimeError::Driver("no cuBLASLt handle".into()))?;
                                let prepared = lt
                                    .prepare_first(&gemm, e.bias.map(|b| self.address(b)))
                                    .ok_or_else(|| {
                                        RuntimeError::Driver(format!(
                                        "cuBLASLt has no algorithm for the {}x{}x{} GEMM with its epilogue",
                                        gemm.m, gemm.n, gemm.k
                                    ))
                                    })?;
                                Some(Box::new(prepared))
                            }
                            _ => None,
                        };
                        if let (Some(p), Some(c), Some(l)) = (prepared.as_mut(), cached, self.lt.as_ref()) {
                            if !l.restore(p, c) {
                                tracing::debug!(
                                    "a cached GEMM algorithm does not fit {}",
                                    lt::gemm_key(&gemm)
                                );
                            }
                        }
                        // Sizes that vary have no kernel for a few rows.
                        Loaded::Gemm {
                            gemm,
                            epilogue,
                            on_cublas: prepared.is_none(),
                            lt: prepared,
                            skinny: None,
                            skinny_narrow: None,
                            on_skinny: false,
                            on_narrow: false,
                            absorbs: None,
                        }
                    }
                })
            })
            .collect::<Result<Vec<Loaded>, RuntimeError>>()?;
        // Each norm a GEMM's kernel for a few rows runs is left out, as at the top.
        let absorbed: Vec<usize> = steps
            .iter()
            .filter_map(|s| match s {
                Loaded::Gemm { on_skinny: true, absorbs: Some(j), .. } => Some(*j),
                _ => None,
            })
            .collect();
        for j in absorbed {
            super::tuning::absorb(&mut steps, j, true);
        }
        super::tuning::leave_out_merged(&mut steps);
        Ok(steps)
    }
}
