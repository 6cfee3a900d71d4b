//! Scenarios, one module per traffic shape, and the flags they share: where the server
//! is ([`ServerArgs`]) and how long to measure ([`RunArgs`]).
//!
//! - [`chat`]: one-to-one durable chat, N sender/receiver pairs.

pub mod chat;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::util::{parse_duration, parse_key_val};
use crate::Outcome;

/// JWT secret a spawned server is given, and the default `--secret`.
pub const DEFAULT_SECRET: &str = "im-bench-secret";

/// The scenarios `im-bench` can run.
#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// One-to-one durable chat: sender s{i} sends to receiver r{i}; measures
    /// send-to-SendAck and send-to-deliver latency and checks exactly-once delivery.
    Chat(chat::ChatArgs),
}

/// Where the server under test is.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Client WebSocket endpoint of a running server.
    #[arg(long, default_value = "ws://127.0.0.1:7070/ws")]
    pub url: String,
    /// Start this im-server binary instead (loopback, ephemeral ports, temp data dir),
    /// and kill it at the end.
    #[arg(long, value_name = "PATH_TO_IM_SERVER", conflicts_with = "url")]
    pub spawn: Option<PathBuf>,
    /// JWT secret used to mint client tokens (a spawned server gets the same one).
    #[arg(long, env = "IM_BENCH_SECRET", default_value = DEFAULT_SECRET, hide_env_values = true)]
    pub secret: String,
    /// Extra environment for the spawned server, e.g. IM_PERSIST_BATCH_MAX=64 (repeatable).
    #[arg(long = "server-env", value_name = "KEY=VALUE", value_parser = parse_key_val)]
    pub server_env: Vec<(String, String)>,
}

/// How long to run and how to report.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Measured time, after the warmup (e.g. 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before measuring starts; nothing sent or acked in it is counted.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// After the run, how long to wait for outstanding acks and, then, deliveries.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Print the final report as JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs one scenario.
pub async fn run(scenario: Scenario) -> anyhow::Result<Outcome> {
    match scenario {
        Scenario::Chat(args) => chat::run(args).await,
    }
}
