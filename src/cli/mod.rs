//! Subcommands of `fusec`.

mod bench;
mod cache;
mod compile;
mod inspect;
mod ops;
mod run;
mod shapes;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Compile ONNX models into a few fused CUDA kernels plus cuBLAS calls.
#[derive(Debug, Parser)]
#[command(name = "fusec", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Compile(compile::Compile),
    Bench(bench::Bench),
    Run(run::Run),
    Inspect(inspect::Inspect),
    Cache(cache::Cache),
    Ops(ops::Ops),
}

impl Cli {
    pub fn execute(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Compile(cmd) => cmd.execute(),
            Command::Bench(cmd) => cmd.execute(),
            Command::Run(cmd) => cmd.execute(),
            Command::Inspect(cmd) => cmd.execute(),
            Command::Cache(cmd) => cmd.execute(),
            Command::Ops(cmd) => cmd.execute(),
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
