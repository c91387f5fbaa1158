//! The `tributary` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = tributary::cli::Cli::parse_args();
    tributary::cli::run(cli)
}
