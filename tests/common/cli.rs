//! The `fusec` binary, run as a user runs it, for the command-line tests.

use std::process::{Command, Output};

/// `fusec ARGS`, its output captured.
pub fn fusec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fusec")).args(args).output().expect("the fusec binary runs")
}

/// A stream's bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
