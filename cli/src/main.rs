//! `im`: a command-line client for im-server on the im-client SDK. Send a message,
//! listen, read history and conversations, and administer groups from a shell; errors
//! are sentences on stderr with the exit codes listed in `im --help`.

mod args;
mod cmd;
mod failure;
mod output;
mod session;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("im: error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cmd::run(&cli.global, cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if failure::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Server text can be in the message: print it escaped like everything else.
            eprintln!("im: error: {}", output::escape(&format!("{e:#}")));
            ExitCode::from(failure::exit_code(&e) as u8)
        }
    }
}
