//! The `im-bench` binary: parses `im-bench SCENARIO [flags]` (a `--config FILE` is
//! expanded into flags first), builds a multi-threaded tokio runtime and runs the
//! scenario. Exit code 0: pass; 1: a correctness check
//! failed (lost, duplicated or reordered messages); 2: the run could not be carried out.

use std::process::ExitCode;

use clap::Parser;
use im_bench::{Cli, Outcome};

fn main() -> ExitCode {
    let argv = match im_bench::config::expand_args(std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("im-bench: error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(argv);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = cli.threads {
        builder.worker_threads(n.max(1));
    }
    let rt = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("im-bench: error: starting the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(im_bench::run(cli)) {
        Ok(Outcome::Pass) => ExitCode::SUCCESS,
        Ok(Outcome::Fail) => ExitCode::from(1),
        Err(e) => {
            eprintln!("im-bench: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
