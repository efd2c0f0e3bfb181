//! The `fusec` command line: thin wrappers over the library, one file per subcommand.

// Input- and device-dependent paths return errors: no unwrap or expect outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod cli;

use std::process::ExitCode;

/// `fusec --version`: the crate's version, the bundle format it reads and writes, and the
/// NVRTC and CUDA driver it finds on this machine.
fn long_version() -> String {
    let found =
        |v: Option<(i32, i32)>| v.map_or_else(|| "not found".to_string(), |(a, b)| format!("{a}.{b}"));
    format!(
        "{}\nbundle format {}\nNVRTC {}\nCUDA driver {}",
        env!("CARGO_PKG_VERSION"),
        fusec::bundle::FORMAT_VERSION,
        found(fusec::nvrtc::version()),
        found(fusec::runtime::driver_version()),
    )
}

/// Logs on standard error: `RUST_LOG` when set, else warnings, fusec's stages with `-v`, and
/// every kernel compiled or cached with `-vv`.
fn init_logs(verbose: u8) {
    let fallback = match verbose {
        0 => "warn",
        1 => "warn,fusec=info",
        _ => "warn,fusec=debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(fallback));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}

fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    // Rust ignores SIGPIPE, so writing to a closed pipe (`fusec inspect … | head`) is an error
    // that `println!` turns into a panic. A command-line tool should end quietly instead, as
    // the signal's default action does.
    #[cfg(unix)]
    // SAFETY: sets a signal's disposition to its default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // glibc's allocator raises its threshold for serving a block from its own mapping each
    // time such a block is freed (up to 32 MB), after which freed weights stay in the heap
    // and count against the process: a compile converting a model's weights layer by layer
    // then peaks at both copies. A fixed threshold gives every block of 1 MB or more its own
    // mapping, returned to the system when freed.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: sets an allocator parameter before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
    // tract panics on some inputs of a `--check` (an index past a Gather's table): the
    // reference run turns that into an error, which is printed; the panic's own message is not.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !fusec::import::in_reference_run() {
            default_hook(info);
        }
    }));
    // The long version names the NVRTC and driver versions, which loads both libraries
    // (~30 MB of the process, before a compile has read anything): only when it is asked for.
    // Computed once per process, so leaking it costs nothing.
    let mut command = cli::Cli::command();
    if std::env::args_os().skip(1).any(|a| a == "--version") {
        let version: &'static str = Box::leak(long_version().into_boxed_str());
        command = command.long_version(version);
    }
    let matches = command.get_matches();
    let cli = match cli::Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    init_logs(cli.verbose());
    match cli.execute() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", fusec::error_chain::text(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
