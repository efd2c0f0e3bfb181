//! Progress on a terminal: one spinner line on standard error naming the step under way, with
//! the elapsed time; nothing when standard error is not a terminal or `-q` was given.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A spinner showing `first`, unless `quiet` or standard error is not a terminal.
    pub fn new(quiet: bool, first: &str) -> Progress {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = ProgressBar::new_spinner();
        let style = ProgressStyle::with_template("{spinner} [{elapsed}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(120));
        bar.set_message(first.to_string());
        Progress(Some(bar))
    }

    /// Names the step now under way.
    pub fn set(&self, message: impl Into<String>) {
        if let Some(bar) = &self.0 {
            bar.set_message(message.into());
        }
    }

    /// Prints `line` above the spinner (or plainly when there is none).
    pub fn println(&self, line: &str) {
        match &self.0 {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// What `fusec compile` does after each stage `compile_reporting` names.
pub fn next_stage(done: &str) -> &'static str {
    match done {
        "import" => "running the graph passes",
        "passes" => "fusing (e-graph saturation and extraction)",
        "fuse" => "lowering the precision",
        "lower" => "partitioning and planning memory",
        "plan" => "generating CUDA kernels",
        "codegen" => "compiling the kernels with NVRTC where it is installed (cached ones are reused)",
        _ => "writing the bundle (weights included)",
    }
}
