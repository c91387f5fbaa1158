//! The `tributary-bench` binary: parses the command line and runs the benchmark on the
//! runtime `tributary` itself uses.

use std::process::ExitCode;

use clap::Parser;
use tributary::cli::LogFormat;
use tributary_bench::BenchArgs;

fn main() -> ExitCode {
    let args = BenchArgs::parse();
    tributary::cli::init_tracing(LogFormat::Text, args.log.as_deref().unwrap_or("warn"));
    let runtime = match tributary::cli::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(tributary_bench::run(args)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
