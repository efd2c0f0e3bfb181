//! Subcommands of `fusec`.

mod bench;
mod bench_decode;
mod bench_report;
mod cache;
mod compile;
mod generate;
mod inspect;
mod ops;
mod progress;
mod run;
mod shapes;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Compile ONNX models into a few fused CUDA kernels plus cuBLAS calls.
#[derive(Debug, Parser)]
#[command(
    name = "fusec",
    version,
    about,
    propagate_version = true,
    after_help = "Start here (models/ ships small exported models):\n  fusec inspect models/bert_ts.onnx --dim batch=2 --dim seq=16 --fused\n  fusec compile models/bert_ts.onnx -o bert.bundle --dim batch=2 --dim seq=16\n  fusec run bert.bundle --input input=ids.npy --check\n  fusec bench models/bert_ts.onnx --dim batch=8 --dim seq=64\n\nEach subcommand's --help has more examples."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More on standard error: -v logs each stage (and `compile` prints its stage times and
    /// peak memory), -vv every kernel compiled or found cached. `RUST_LOG` overrides the log
    /// filter.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
}

#[derive(Debug, Subcommand)]
enum Command {
    Compile(compile::Compile),
    Bench(bench::Bench),
    Run(run::Run),
    Inspect(inspect::Inspect),
    Cache(cache::Cache),
    Ops(ops::Ops),
    Generate(generate::Generate),
}

impl Cli {
    /// How many `-v` were given.
    pub fn verbose(&self) -> u8 {
        self.verbose
    }

    pub fn execute(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Compile(cmd) => cmd.execute(self.verbose > 0),
            Command::Bench(cmd) => cmd.execute(),
            Command::Run(cmd) => cmd.execute(),
            Command::Inspect(cmd) => cmd.execute(),
            Command::Cache(cmd) => cmd.execute(),
            Command::Ops(cmd) => cmd.execute(),
            Command::Generate(cmd) => cmd.execute(self.verbose > 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
