//! The `tributary` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = tributary::cli::Cli::parse();
    tributary::cli::run(cli)
}
