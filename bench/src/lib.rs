//! im-bench: the load generator and scenario runner for im-server.
//!
//! `im-bench SCENARIO [flags]` drives real WebSocket clients speaking `im.v1` against a
//! running node (`--url`) or one it starts itself (`--spawn PATH`), and reports
//! throughput, latency percentiles (HdrHistogram, microseconds), errors by code and a
//! delivery-correctness verdict. A correctness failure makes the process exit non-zero.
//!
//! `im-bench --config scenario.toml` (or `im-bench SCENARIO --config FILE`) takes the
//! scenario and its flags from a TOML file ([`config`]).
//!
//! Module map: [`scenarios`] (one module per traffic shape, and the command line that
//! picks one), [`run`] (the run skeleton every scenario shares: run flags, the report's
//! tail, `finish`), [`clock`] (a run's timeline), [`groups`] (group set-up before a run),
//! [`target`] (the server under test: resolve, mint tokens, spawn, open sessions from
//! spread loopback source addresses, as `im_client::RawConn`s with small buffers),
//! [`spawn`] (running an `im-server` child process), [`hookrecv`] (a webhook receiver
//! with a set delay, for `--webhook-receiver-delay-ms`), [`admin`] (the server's own figures
//! from its admin API), [`outbox`] (un-acked sends, retries, pacing), [`wire`]
//! (allocation-light frame encoding for the hot path, malformed frames), [`stats`]
//! (sharded histograms, counters, summaries), [`check`] (the exactly-once, in-order
//! delivery checker), [`report`] (text report pieces and the progress line),
//! [`config`] (TOML scenario files), [`util`] (flag parsers and formatting), [`peer`]
//! (the same loads against Mosquitto and nats-server over WebSocket, for comparison).

pub mod admin;
pub mod check;
pub mod clock;
pub mod config;
pub mod groups;
pub mod hookrecv;
pub mod outbox;
pub mod peer;
pub mod report;
pub mod run;
pub mod scenarios;
pub mod spawn;
pub mod stats;
pub mod target;
pub mod util;
pub mod wire;

use clap::Parser;

/// Command line: `im-bench [--threads N] SCENARIO [flags]` (after [`config::expand_args`]
/// has turned a `--config FILE` into flags).
#[derive(Debug, Parser)]
#[command(
    name = "im-bench",
    version,
    about = "Load generator and scenario runner for im-server"
)]
pub struct Cli {
    /// Worker threads of the bench's tokio runtime (default: one per CPU).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// The scenario to run.
    #[command(subcommand)]
    pub scenario: scenarios::Scenario,
}

/// How a finished run went, mapped to the process exit code by the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The run completed and every correctness check passed (exit 0).
    Pass,
    /// The run completed but a correctness check failed (exit 1).
    Fail,
}

/// The scenario of the command line `im-bench ARGS...` (for the scenarios' flag tests).
#[cfg(test)]
pub(crate) fn parse_scenario(args: &[&str]) -> Result<scenarios::Scenario, clap::Error> {
    let argv = std::iter::once("im-bench").chain(args.iter().copied());
    Cli::try_parse_from(argv).map(|cli| cli.scenario)
}

/// Runs the scenario chosen on the command line to completion.
pub async fn run(cli: Cli) -> anyhow::Result<Outcome> {
    scenarios::run(cli.scenario).await
}
