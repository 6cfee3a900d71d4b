//! `im-bench peer <idle|broadcast|pairs> --protocol im|mqtt-ws|nats-ws`: the same three
//! traffic shapes against im-server, an MQTT 3.1.1 broker (Mosquitto) or nats-server,
//! each over WebSocket, so one machine can compare them side by side
//! (`bench/scripts/peers.sh`).
//!
//! - `idle`: N connections opened and authenticated (im: logged in; MQTT: CONNACK;
//!   NATS: CONNECT answered), each subscribed to its own topic, held; the server's RSS
//!   growth divided by N.
//! - `broadcast`: one topic/subject (im: one group) with M subscribers, one sender at R
//!   msg/s (MQTT QoS 0, NATS PUB, im group Send); delivery latency from the payload's
//!   timestamp, deliveries/s, and an exactly-once check by the payload's sequence
//!   number (losses are a failure only for im; QoS 0 and NATS core may drop, and their
//!   losses are reported).
//! - `pairs`: P senders each at R msg/s to its own receiver (MQTT QoS 1 with PUBACK;
//!   NATS PUB then PING, its PONG as the ack; im one-to-one Send and SendAck, receivers
//!   DeliverAck); send-to-ack and send-to-deliver latency.
//!
//! The server's CPU (utime + stime over the measured window) and RSS (at the end) come
//! from `/proc/<pid>/stat` and `/proc/<pid>/status` of `--server-pid` (or the `--spawn`ed
//! im-server), giving server CPU per delivery and per message. Module map: one module per mode
//! ([`idle`], [`broadcast`], [`pairs`]), [`traffic`] (what the modes share: payloads,
//! the sequence check, opening connections, the receiving and sending loops), [`proc`]
//! (the server's CPU and RSS), [`mqtt`] and [`nats`] (the packets, by hand), [`conn`]
//! (one connection of any protocol).

pub mod broadcast;
pub mod conn;
pub mod idle;
pub mod mqtt;
pub mod nats;
pub mod pairs;
pub mod proc;
pub mod traffic;

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use crate::run::{finish, RunArgs};
use crate::target::{ServerArgs, Target};
use crate::Outcome;

/// The protocol the peer scenarios speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// im-server's protobuf protocol (`im.v1`).
    Im,
    /// MQTT 3.1.1 over WebSocket (subprotocol `mqtt`), e.g. Mosquitto.
    MqttWs,
    /// The NATS client protocol over WebSocket, e.g. nats-server's `websocket` block.
    NatsWs,
}

impl Protocol {
    /// The fan-out topic/subject of run `tag` (im: a group id).
    fn fanout(self, tag: &str) -> String {
        match self {
            Protocol::Im => format!("pb{tag}"),
            Protocol::MqttWs => format!("bench/{tag}/b"),
            Protocol::NatsWs => format!("bench.{tag}.b"),
        }
    }

    /// The topic/subject of receiver `name`, connection `i` (im: the user id).
    fn own(self, tag: &str, name: &str, i: usize) -> String {
        match self {
            Protocol::Im => name.to_owned(),
            Protocol::MqttWs => format!("bench/{tag}/p/{i}"),
            Protocol::NatsWs => format!("bench.{tag}.p.{i}"),
        }
    }

    /// Whether the fan-out path may drop messages by design (QoS 0, NATS core).
    fn lossy_fanout(self) -> bool {
        self != Protocol::Im
    }

    /// Whether the pairs path may drop messages by design (NATS core).
    fn lossy_pairs(self) -> bool {
        self == Protocol::NatsWs
    }
}

/// `im-bench peer ...`.
#[derive(Debug, Args)]
pub struct PeerArgs {
    /// The scenario.
    #[command(subcommand)]
    pub scenario: PeerScenario,
}

/// The peer scenarios.
#[derive(Debug, Subcommand)]
pub enum PeerScenario {
    /// N idle authenticated connections; the server's RSS per connection.
    #[command(args_override_self = true)]
    Idle(idle::IdleArgs),
    /// One topic with M subscribers and a sender at R msg/s; delivery latency,
    /// deliveries/s, server CPU per delivery.
    #[command(args_override_self = true)]
    Broadcast(broadcast::BroadcastArgs),
    /// P pairs, each sender at R msg/s to its receiver; send-to-ack latency, server CPU
    /// per message.
    #[command(args_override_self = true)]
    Pairs(pairs::PairsArgs),
}

/// What every peer scenario takes.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// The server's protocol.
    #[arg(long, value_enum, default_value_t = Protocol::Im)]
    pub protocol: Protocol,
    /// The server process to read CPU and RSS from (`/proc/PID`); automatic with --spawn.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Payload bytes (at least the 20-byte header).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(20..=65536))]
    pub size: u32,
    /// Where the server is.
    #[command(flatten)]
    pub server: ServerArgs,
    /// How long to run.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Runs a peer scenario.
pub async fn run(args: PeerArgs) -> anyhow::Result<Outcome> {
    let common = match &args.scenario {
        PeerScenario::Idle(a) => &a.common,
        PeerScenario::Broadcast(a) => &a.common,
        PeerScenario::Pairs(a) => &a.common,
    };
    let mut target = Target::open(&common.server).await?;
    let json = common.run.json;
    match args.scenario {
        PeerScenario::Idle(a) => {
            let r = idle::run(&a, &mut target).await;
            finish(target, r, json).await
        }
        PeerScenario::Broadcast(a) => {
            let r = broadcast::run(&a, &mut target).await;
            finish(target, r, json).await
        }
        PeerScenario::Pairs(a) => {
            let r = pairs::run(&a, &mut target).await;
            finish(target, r, json).await
        }
    }
}
