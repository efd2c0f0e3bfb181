//! The `fusec` binary, run as a user runs it, for the command-line tests.

use std::process::{Command, Output};

/// `fusec ARGS`, its output captured. `FUSEC_TEST_BIN` names another `fusec` binary to run:
/// a test binary staged on a machine without cargo runs the release binary staged beside it.
pub fn fusec(args: &[&str]) -> Output {
    let binary = std::env::var_os("FUSEC_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_fusec").into());
    Command::new(binary).args(args).output().expect("the fusec binary runs")
}

/// A stream's bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
