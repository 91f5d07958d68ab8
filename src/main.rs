//! The herald binary: take what systemd passed out of the environment, parse, run, map errors
//! to exit codes (0 ok, 64 bad usage or config, 1 failure).

use clap::Parser;

fn main() {
    // SAFETY: first thing in main, before any thread exists (clap, rustls and the runtime come
    // later): nothing else reads the environment or owns the descriptors systemd passed.
    let systemd = unsafe { herald::app::systemd::Systemd::take_from_env() };
    // One crypto provider for the whole process: rustls on ring (reqwest and friends use the
    // process default; herald's own TLS passes ring explicitly).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match herald::cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => herald::cli::EXIT_USAGE,
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let log_format = cli.log_format;
    if let Err(exit) = herald::cli::run(cli, systemd) {
        herald::cli::report(&exit, log_format);
        std::process::exit(exit.code);
    }
}
