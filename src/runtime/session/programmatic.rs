//! Programmatic dependent launch chosen by timing: with it, each generated kernel may be
//! scheduled while the one before it finishes (it waits for it itself, `fusec::grid_begin`).
//! Replayed as a CUDA graph, that saves ConvNeXt-T 3–7 % at batch 8 and costs the Llama-style
//! decoder 6 % at 8×128 (H100, `benches/NOTES.md`), so a session whose choice is not settled
//! ([`super::launch::programmatic_launch_forced`]) times its program both ways at load.

use super::{lt, RuntimeError, Session};
use crate::ir::DType;

/// How a session's generated kernels came to be launched as they are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaunchChoice {
    /// With programmatic dependent launch.
    pub programmatic: bool,
    /// The program's median milliseconds (best of two timings) without it and with it.
    pub plain_ms: f64,
    pub programmatic_ms: f64,
}

impl Session {
    /// Launches the generated kernels (but a GEMM's kernel for a few rows, see
    /// [`super::launch::Loaded::kernels_mut`]) with programmatic dependent launch or not.
    pub(super) fn set_programmatic(&mut self, on: bool) {
        for step in &mut self.steps {
            for launch in step.kernels_mut() {
                launch.set_programmatic(on);
            }
        }
        // The next run captures the graph anew.
        self.graph = None;
    }

    /// Times the program (a CUDA graph) with and without programmatic dependent launch, twice
    /// each, alternately, and keeps it only where it makes the program faster by more than the
    /// noise margin. Nothing is timed where the choice is settled or no kernel can wait. At
    /// load only (it writes the tuning values into the inputs), which holds [`lt::TUNING`]
    /// meanwhile: the other points of a range bundle take the top's choice.
    pub(super) fn choose_programmatic(&mut self) -> Result<Option<LaunchChoice>, RuntimeError> {
        let waits = self.steps.iter_mut().any(|s| s.kernels_mut().iter().any(|l| l.waits));
        if self.programmatic_forced.is_some() || !self.use_graph || !waits {
            return Ok(None);
        }
        let runs = self.runs;
        let (mut plain, mut programmatic) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..2 {
            self.set_programmatic(false);
            plain = plain.min(self.time_as_runs()?);
            self.set_programmatic(true);
            programmatic = programmatic.min(self.time_as_runs()?);
        }
        let on = programmatic < lt::MARGIN * plain;
        self.set_programmatic(on);
        self.runs = runs;
        tracing::debug!(plain, programmatic, on, "programmatic dependent launch timed");
        Ok(Some(LaunchChoice { programmatic: on, plain_ms: plain, programmatic_ms: programmatic }))
    }

    /// Median milliseconds of the program as runs replay it: each input written into its
    /// page-locked buffer (the values the load times the program on,
    /// [`Session::stage_tuning_inputs`]) and copied in first, then the graph (captured anew),
    /// timed with CUDA events, over `lt::TIMED_RUNS` runs after three untimed ones
    /// ([`Session::time_replays`]). The plain program's time depends on the process's state
    /// more than programmatic launch's does: on ViT-B/16 at batch 8 the plain replays ran
    /// 0.817 ms before another build's session was loaded and 0.835–0.845 after, with
    /// programmatic launch 0.82 in both (`benches/NOTES.md`). The choice holds for the state
    /// it was made in.
    fn time_as_runs(&mut self) -> Result<f64, RuntimeError> {
        self.time_replays(Self::stage_tuning_inputs)
    }

    /// Writes the values the load times the program on into every input's page-locked buffer
    /// (but a cache laid out inside its output) and copies it in, whole (the top of any range:
    /// the buffers are sized for it): floats zero; integers and booleans one — a padding mask's
    /// "attend", a valid token id and position — so that a decoder's attention reads every
    /// cached position as a full cache does, rather than skipping them all as a mask of zeros
    /// does; zero where the input indexes a table of a single entry
    /// ([`crate::bundle::Header::index_limits`]). `FUSEC_TUNE_INPUTS=zeros` writes zeros
    /// everywhere, as before.
    pub(super) fn stage_tuning_inputs(&mut self) -> Result<(), RuntimeError> {
        for k in 0..self.inputs.len() {
            if self.inputs[k].inside.is_some() {
                continue;
            }
            let Some(ty) = self.inputs[k].tensor_type() else { continue };
            let one = self.tuning_ones.get(k).copied().unwrap_or(false);
            let width = ty.dtype.size_bytes().max(1);
            self.stage_input(k, ty.size_bytes(), |host| {
                host.fill(0);
                if one {
                    // Little-endian one of the element's width: its first byte.
                    host.chunks_mut(width).for_each(|e| e[0] = 1);
                }
            })?;
        }
        Ok(())
    }

    /// Zeros in every input but a cache laid out inside its output ([`Session::zero_input`]),
    /// as a session holds them before its first run: what the load leaves once it has timed
    /// its choices.
    pub(super) fn zero_tuning_inputs(&mut self) -> Result<(), RuntimeError> {
        let names: Vec<String> =
            self.inputs.iter().filter(|s| s.inside.is_none()).map(|s| s.name.clone()).collect();
        names.iter().try_for_each(|name| self.zero_input(name))
    }
}

/// For each of the bundle's inputs, whether the load times the program with ones in it (the
/// session's tuning inputs): integer and boolean inputs, but one that indexes a table
/// of a single entry; none with `FUSEC_TUNE_INPUTS=zeros`.
pub fn tuning_ones(header: &crate::bundle::Header) -> Vec<bool> {
    let zeros = std::env::var("FUSEC_TUNE_INPUTS").is_ok_and(|v| v.trim() == "zeros");
    header
        .inputs
        .iter()
        .map(|spec| {
            let Some(ty) = spec.tensor_type() else { return false };
            let counts = matches!(ty.dtype, DType::I64 | DType::I32 | DType::Bool);
            let table = header.index_limits.get(&spec.name).copied();
            !zeros && counts && table.is_none_or(|rows| rows >= 2)
        })
        .collect()
}
