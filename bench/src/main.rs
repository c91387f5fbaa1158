//! The `tributary-bench` binary: parses the command line and runs the benchmark on the
//! runtime `tributary` itself uses.

use std::process::ExitCode;

use clap::Parser;
use tributary_bench::BenchArgs;

fn main() -> ExitCode {
    let args = BenchArgs::parse();
    let filter = args.log.clone().unwrap_or_else(|| "warn".to_string());
    tributary::cli::run_tool(&filter, async {
        match tributary_bench::run(args).await {
            Ok(code) => code,
            Err(error) => {
                eprintln!("error: {error:#}");
                ExitCode::FAILURE
            }
        }
    })
}
