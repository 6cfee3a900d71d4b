//! Scenarios, one module per traffic shape, the command line that picks one
//! ([`Scenario`]) and the macros they are wired with (`counters!` for run-wide counters,
//! `scenario!` for the entry point). What every run shares (how long to measure, the
//! report skeleton, `finish`) is the run skeleton, [`crate::run`], below the scenarios;
//! the scenarios' shared parts are modules beside them: [`sender`] (the one-to-one
//! sending loop), [`follow`] (a member following a conversation), [`ledger`] (the
//! delivery ledger of idle and mix).
//!
//! - [`chat`]: one-to-one durable chat, N sender/receiver pairs (closed loop or `--rate`).
//! - [`idle`]: a connect ramp to N idle connections with heartbeats; memory per
//!   connection from the server's admin API.
//! - [`broadcast`]: G groups of M members, R messages/s per group, push or notify-and-pull.
//! - [`mix`]: one-to-one traffic with a message size mix over zipf-hot conversations.
//! - [`roundtrip`]: send, SendAck, deliver, DeliverAck and the reply, timed end to end.
//! - [`abuse`]: chat alone, then under hostile clients (slowloris, Batch floods of every
//!   frame kind, a giant sync backlog, bad logins, never-reading connections); fails when
//!   the honest P99 under attack passes a multiple of the baseline.
//! - [`chaos`]: chat under disconnect injection (kill, reconnect, sync), a one-off
//!   reconnect storm, and malformed frames (each must get BAD_FRAME and leave the
//!   connection working).
//! - [`soak`]: a long chaos run (size mix, reconnects, slow receivers) sampled every
//!   window: server RSS, P99 per window, a CPU and a heap profile in the middle.
//!
//! Every scenario checks delivery while it loads ([`crate::check`]) and fails (exit 1)
//! on any loss, duplicate, reordering, or a server that exited during the run.

/// Declares a scenario's run-wide counters: a `#[derive(Default)]` struct of
/// [`crate::stats::Counter`]s that every task bumps, and a plain `Copy` struct of the
/// same names holding their totals (serializable, e.g. flattened into a report), taken
/// with `snapshot()`.
///
/// ```ignore
/// counters! {
///     /// What chat's tasks count.
///     struct Counts => Totals {
///         /// Messages received by receivers.
///         delivered,
///     }
/// }
/// ```
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident => $totals:ident {
            $( $(#[$fmeta:meta])* $field:ident ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[$fmeta])* pub $field: $crate::stats::Counter, )*
        }

        /// Totals of the counters, at one instant.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
        $vis struct $totals {
            $( $(#[$fmeta])* pub $field: u64, )*
        }

        impl $name {
            /// Every counter's total now.
            #[allow(dead_code)]
            pub fn snapshot(&self) -> $totals {
                $totals { $( $field: self.$field.get(), )* }
            }
        }
    };
}

/// Wires a scenario module: its [`ReportBody`] (which parts of the shared tail its report
/// carries; the text form is the module's `render`) and its entry point `run` (open the
/// target, the module's `run_against`, then [`finish`]). `target` and `json` name where in
/// the module's args the target options and the `--json` flag are; without them, the
/// usual ones (a [`crate::check::Verdict`], the server's figures, `server`, `run.json`).
macro_rules! scenario {
    // The usual scenario: a delivery verdict, the server's figures, `server` and `run.json`.
    ($what:literal, $args:ty => $body:ty $(,)?) => {
        scenario! {
            $what, $args => $body,
            correctness: $crate::check::Verdict, server: Option<$crate::admin::ServerFigures>,
            target: server, json: run.json,
        }
    };
    (
        $what:literal, $args:ty => $body:ty,
        correctness: $correctness:ty, server: $server:ty,
        target: $($target:ident).+, json: $($json:ident).+ $(,)?
    ) => {
        impl $crate::run::ReportBody for $body {
            type Correctness = $correctness;
            type Server = $server;
            fn render(r: &$crate::run::Report<Self>) -> String {
                render(r)
            }
        }

        #[doc = concat!("Runs the ", $what, " scenario.")]
        pub async fn run(args: $args) -> anyhow::Result<$crate::Outcome> {
            let mut target = $crate::target::Target::open(&args.$($target).+).await?;
            let result = run_against(&args, &mut target).await;
            $crate::run::finish(target, result, args.$($json).+).await
        }
    };
}

pub mod abuse;
pub mod broadcast;
pub mod chaos;
pub mod chat;
pub mod follow;
pub mod idle;
pub mod ledger;
pub mod mix;
pub mod roundtrip;
pub mod sender;
pub mod soak;

use clap::Subcommand;

use crate::Outcome;

/// The scenarios `im-bench` can run. A flag given twice keeps its last value (so the
/// command line overrides a `--config` file); repeatable flags accumulate.
#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// One-to-one durable chat: sender s{i} sends to receiver r{i}; measures
    /// send-to-SendAck and send-to-deliver latency and checks exactly-once delivery.
    #[command(args_override_self = true)]
    Chat(chat::ChatArgs),
    /// N connections ramped over T seconds, logged in and heartbeating; connect/login
    /// latency, heartbeat round trips and the server's memory per connection.
    #[command(args_override_self = true)]
    Idle(idle::IdleArgs),
    /// G groups of M members, R messages/s per group, full fan-out (push, or
    /// notify-and-pull with --pull); delivery latency and deliveries/s.
    #[command(args_override_self = true)]
    Broadcast(broadcast::BroadcastArgs),
    /// One-to-one traffic with a message size mix (text/image/file) over zipf-hot
    /// conversations, at a total rate.
    #[command(args_override_self = true)]
    Mix(mix::MixArgs),
    /// Pairs exchanging messages: send, SendAck, deliver, DeliverAck and the reply,
    /// timed end to end; stored cursors checked after the run.
    #[command(args_override_self = true)]
    Roundtrip(roundtrip::RoundtripArgs),
    /// Chat under fire: x% of connections killed at random (reconnect + sync timed as
    /// time to recover), an optional reconnect storm (a fraction of all connections
    /// reset at once), y% malformed frames (each must get BAD_FRAME).
    #[command(args_override_self = true)]
    Chaos(chaos::ChaosArgs),
    /// Honest chat alone, then under attack (slowloris, DeliverAck/Sync/GroupOp floods in
    /// Batch frames, a giant sync backlog, expired and forged logins, never-reading
    /// connections); fails on any lost acked message or an honest P99 above
    /// --max-p99-ratio times the baseline.
    #[command(args_override_self = true)]
    Abuse(abuse::AbuseArgs),
    /// A long chaos run (size mix, reconnects each window, slow receivers) sampled every
    /// --sample-every: server RSS, send->ack and delivery P99 per window, counts; a CPU
    /// and a heap profile in the middle; RSS growth and P99 drift at the end.
    #[command(args_override_self = true)]
    Soak(soak::SoakArgs),
    /// The same idle, broadcast and pairs loads against im-server, an MQTT broker
    /// (`--protocol mqtt-ws`) or nats-server (`--protocol nats-ws`), with the server's
    /// CPU and RSS from /proc (`--server-pid`), for side-by-side comparisons.
    #[command(subcommand)]
    Peer(crate::peer::PeerScenario),
}

/// Runs one scenario.
pub async fn run(scenario: Scenario) -> anyhow::Result<Outcome> {
    match scenario {
        Scenario::Chat(args) => chat::run(args).await,
        Scenario::Idle(args) => idle::run(args).await,
        Scenario::Broadcast(args) => broadcast::run(args).await,
        Scenario::Mix(args) => mix::run(args).await,
        Scenario::Roundtrip(args) => roundtrip::run(args).await,
        Scenario::Chaos(args) => chaos::run(args).await,
        Scenario::Abuse(args) => abuse::run(args).await,
        Scenario::Soak(args) => soak::run(args).await,
        Scenario::Peer(scenario) => crate::peer::run(crate::peer::PeerArgs { scenario }).await,
    }
}

/// A message of `conv` at `seq`, the rest default (for the scenarios' tests).
#[cfg(test)]
pub(crate) fn test_message(conv: &str, seq: u64) -> im_proto::ChatMessage {
    im_proto::ChatMessage {
        conversation_id: conv.into(),
        seq,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    counters! {
        /// Test counters.
        struct Counts => Totals {
            /// One.
            a,
            /// Two.
            b,
        }
    }

    #[test]
    fn counters_snapshot_their_totals() {
        let c = Counts::default();
        c.a.inc();
        c.b.add(5);
        c.b.sub(2);
        assert_eq!(c.snapshot(), Totals { a: 1, b: 3 });
    }
}
