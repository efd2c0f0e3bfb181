//! `fusec ops`: what the importer takes and what fusion recognises, from the code itself.

use std::process::ExitCode;

use clap::Args;

/// List the supported ONNX ops and the fusion rules (the patterns recognised and fused).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  fusec ops\n  fusec ops | grep -i attention")]
pub struct Ops {}

impl Ops {
    pub fn execute(self) -> anyhow::Result<ExitCode> {
        use std::io::Write;
        let ops = fusec::import::supported_ops();
        let rules = fusec::fusion::rules::all();
        let mut text = format!("ONNX ops (default domain, opsets 9 to 20), {}:\n", ops.len());
        for line in ops.chunks(10) {
            text.push_str(&format!("  {}\n", line.join(" ")));
        }
        text.push_str(&format!("fusion rules (e-graph rewrites), {}:\n", rules.len()));
        for rule in &rules {
            text.push_str(&format!("  {}\n", rule.name));
        }
        // A reader that stops early (`| head`) is not an error.
        match std::io::stdout().lock().write_all(text.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
            _ => Ok(ExitCode::SUCCESS),
        }
    }
}
