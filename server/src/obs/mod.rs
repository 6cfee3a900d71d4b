//! Obs: metrics and stage probes. Owns the Prometheus recorder (installed once per
//! process) and the [`Metrics`] handles every stage records into; handles are looked up
//! once here, never per message (names: docs/design.md). Submodules read the
//! allocator (`alloc`), the OS (`process`), compute capacity headroom (`capacity`), keep
//! in-process latency histograms (`latency`), read the tokio runtime and the task monitors
//! of the long-lived tasks (`runtime`) and sample it all each second (`sampler`).
//! The operator's live-diagnosis tools live here too: on-demand CPU profiles
//! (`profile`), per-uid log filters (`logfilter`), the live tail of filtered users' events
//! (`tail`), rolling log files (`logfiles`) and their off-peak compression (`compactor`),
//! the per-user diagnosis rings and refusal counts (`users`), and message traces (`trace`): one message's stage timeline, carried with it when traced.

pub mod alloc;
pub mod capacity;
pub mod capture;
pub mod compactor;
pub mod heap;
pub mod latency;
pub mod logfiles;
pub mod logfilter;
pub mod process;
pub mod profile;
pub mod runtime;
pub mod sampler;
pub mod tail;
pub mod textlog;
pub mod trace;
pub mod users;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// A stage of the message path (label `stage` of `im_stage_duration_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Protobuf decode of one frame.
    Decode,
    /// Session/auth check.
    Auth,
    /// Field validation.
    Validate,
    /// Membership lookup and recipient list.
    Relation,
    /// The before-send hook's call (only when one is configured).
    BeforeSend,
    /// Time in the persistence queue before the batch starts.
    PersistWait,
    /// The batch transaction.
    PersistCommit,
    /// Recipient lookup and enqueue.
    Route,
    /// Encoding the delivery once.
    Encode,
    /// Time in the outbound queue.
    QueueWait,
    /// The socket write.
    Write,
    /// Decode start to the last recipient's socket write.
    EndToEnd,
    /// Multi-region: a request forwarded to its home region, until the home's answer.
    RegionForward,
    /// Multi-region: a forwarded request's ack waiting until this region applied it.
    ApplyWait,
    /// Multi-region: a replication record from the outbox read to JetStream's ack.
    ReplPublish,
    /// Multi-region: applying another region's replication record to this store.
    ReplApply,
}

impl Stage {
    /// Every stage, in path order.
    pub const ALL: [Stage; 16] = [
        Stage::Decode,
        Stage::Auth,
        Stage::Validate,
        Stage::Relation,
        Stage::BeforeSend,
        Stage::PersistWait,
        Stage::PersistCommit,
        Stage::Route,
        Stage::Encode,
        Stage::QueueWait,
        Stage::Write,
        Stage::EndToEnd,
        Stage::RegionForward,
        Stage::ApplyWait,
        Stage::ReplPublish,
        Stage::ReplApply,
    ];

    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Decode => "decode",
            Stage::Auth => "auth",
            Stage::Validate => "validate",
            Stage::Relation => "relation",
            Stage::BeforeSend => "before_send",
            Stage::PersistWait => "persist_wait",
            Stage::PersistCommit => "persist_commit",
            Stage::Route => "route",
            Stage::Encode => "encode",
            Stage::QueueWait => "queue_wait",
            Stage::Write => "write",
            Stage::EndToEnd => "end_to_end",
            Stage::RegionForward => "region_forward",
            Stage::ApplyWait => "apply_wait",
            Stage::ReplPublish => "repl_publish",
            Stage::ReplApply => "repl_apply",
        }
    }
}

/// Buckets of `im_hook_latency_seconds` (seconds): a hook answers in milliseconds, its
/// timeout is at most 10 s.
const HOOK_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 10.0,
];

/// The `outcome` labels of `im_hook_outcomes_total` (the hooks' own list, registered here
/// at zero so dashboards see the series before the first call).
pub const HOOK_OUTCOMES: [&str; 9] = [
    "allow",
    "reject",
    "replace",
    "timeout",
    "error",
    "status",
    "bad_answer",
    "breaker_open",
    "busy",
];

/// Buckets for batch sizes.
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// Buckets for webhook request durations, seconds.
const WEBHOOK_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (idempotent) and returns its handle.
pub fn install_recorder() -> Option<PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            // `im_stage_duration_seconds` is not the recorder's: [`MetricHandles::render_stages`]
            // writes it from the probes' own histograms.
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("im_persist_batch_size".into()),
                    BATCH_BUCKETS,
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("im_hook_latency_seconds".into()),
                        HOOK_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("im_webhook_delivery_seconds".into()),
                        WEBHOOK_BUCKETS,
                    )
                });
            match builder.and_then(|b| b.install_recorder()) {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed");
                    None
                }
            }
        })
        .clone()
}

/// Running totals the sampler turns into rates and the admin API reads.
#[derive(Default)]
pub struct Totals {
    /// Sends accepted into the pipeline.
    pub messages_in: AtomicU64,
    /// Message copies queued to recipients.
    pub messages_out: AtomicU64,
    /// Connections closed as slow consumers.
    pub slow_disconnects: AtomicU64,
    /// Connections marked slow, ever.
    pub slow_marked: AtomicU64,
    /// Connections refused before the upgrade: node full, per address cap, draining.
    pub refused: [AtomicU64; 3],
}

/// The `reason` labels of `im_connections_refused_total`, in [`Totals::refused`] order.
pub const REFUSED_REASONS: [&str; 3] = ["node_full", "per_ip", "draining"];

/// The `frame` labels of `im_flood_disconnects_total`, in the order of the gateway's
/// flood kinds (ping, send, deliver_ack, sync, group_op).
pub const FLOOD_FRAMES: [&str; 9] = [
    "ping",
    "send",
    "deliver_ack",
    "sync",
    "group_op",
    "mark_read",
    "conversations",
    "presence",
    "typing",
];

/// The `reason` labels of `im_http_rejected_total`: why `listen` closed a socket in the
/// HTTP layer.
pub const REJECT_REASONS: [&str; 4] = [
    "header_timeout",
    "header_too_large",
    "bad_request",
    "admin_full",
];

/// Cheap, cloneable metric handles for the hot path: one shared set per node, so a copy
/// (each connection's outbound side holds one) is a pointer, not every handle.
#[derive(Clone)]
pub struct Metrics(Arc<MetricHandles>);

impl std::ops::Deref for Metrics {
    type Target = MetricHandles;

    fn deref(&self) -> &MetricHandles {
        &self.0
    }
}

impl Metrics {
    /// Registers every handle with the installed recorder (no-ops when none is).
    /// With `probes` false, stage timings are not recorded (for overhead comparisons).
    pub fn new(probes: bool) -> Self {
        Metrics(Arc::new(MetricHandles::new(probes)))
    }
}

/// The handles behind [`Metrics`].
pub struct MetricHandles {
    hists: Arc<[latency::LatencyHist; Stage::ALL.len()]>,
    probes: Arc<AtomicBool>,
    /// Running totals.
    pub totals: Arc<Totals>,
    /// `im_connections`
    pub connections: Gauge,
    /// `im_connections_opened_total`
    pub connections_opened: Counter,
    /// `im_messages_received_total{type}` by MessageType value.
    pub received: [Counter; 4],
    /// `im_messages_delivered_total`
    pub delivered: Counter,
    /// `im_messages_dropped_total{reason="slow_consumer"}`
    pub dropped_slow: Counter,
    /// `im_messages_encoded_total`: deliveries encoded (once per message, not per recipient).
    pub encoded: Counter,
    /// `im_syncs_from_window_total`: syncs answered from a large group's recent window.
    pub syncs_from_window: Counter,
    /// `im_persist_queue_depth`
    pub persist_queue_depth: Gauge,
    /// `im_persist_batch_size`
    pub persist_batch_size: Histogram,
    /// `im_persist_overloaded_total`: sends refused with OVERLOADED.
    pub persist_overloaded: Counter,
    /// `im_outbound_queued_bytes`
    pub outbound_queued_bytes: Gauge,
    /// `im_slow_consumers`
    pub slow_consumers: Gauge,
    /// `im_slow_consumer_disconnects_total`
    pub slow_consumer_disconnects: Counter,
    /// Message traces: the decision, the settings and the store of finished parts.
    pub tracer: Arc<trace::Tracer>,
}

impl MetricHandles {
    fn new(probes: bool) -> Self {
        describe();
        // Labelled series that dashboards expect exist from the start, at zero.
        for reason in BAD_FRAME_REASONS {
            counter!("im_bad_frames_total", "reason" => *reason).absolute(0);
        }
        counter!("im_connections_closed_total", "reason" => "client closed").absolute(0);
        counter!("im_admin_unauthorized_total").absolute(0);
        for reason in REFUSED_REASONS {
            counter!("im_connections_refused_total", "reason" => reason).absolute(0);
        }
        for frame in FLOOD_FRAMES {
            counter!("im_flood_disconnects_total", "frame" => frame).absolute(0);
        }
        for listener in ["client", "admin"] {
            for reason in REJECT_REASONS {
                counter!("im_http_rejected_total", "listener" => listener, "reason" => reason)
                    .absolute(0);
            }
        }
        // Fed by the log and profiling tools; present (at zero) from the start.
        gauge!("im_log_filters_active").set(0.0);
        gauge!("im_log_tail_subscribers").set(0.0);
        counter!("im_log_tail_events_total").absolute(0);
        counter!("im_log_tail_dropped_total").absolute(0);
        counter!("im_log_bytes_written_total").absolute(0);
        counter!("im_log_compressed_bytes_total").absolute(0);
        counter!("im_profiles_captured_total").absolute(0);
        counter!("im_heap_profiles_captured_total").absolute(0);
        // Store health (set by the persistence writer and the sampler).
        for reason in STORE_FAULTS {
            counter!("im_store_faults_total", "reason" => *reason).absolute(0);
            counter!("im_store_refused_sends_total", "reason" => *reason).absolute(0);
        }
        counter!("im_store_refused_sends_total", "reason" => "disk_low").absolute(0);
        counter!("im_store_connection_resets_total").absolute(0);
        counter!("im_store_checkpoint_failures_total").absolute(0);
        counter!("im_trace_bad_replies_total").absolute(0);
        // The before-send hook's series (0 and closed while no hook is configured).
        let hook = "before_send";
        gauge!("im_hook_configured", "hook" => hook).set(0.0);
        gauge!("im_hook_breaker_state", "hook" => hook).set(0.0);
        gauge!("im_hook_in_flight", "hook" => hook).set(0.0);
        counter!("im_hook_calls_total", "hook" => hook).absolute(0);
        counter!("im_hook_breaker_opened_total", "hook" => hook).absolute(0);
        for outcome in HOOK_OUTCOMES {
            counter!("im_hook_outcomes_total", "hook" => hook, "outcome" => outcome).absolute(0);
        }
        let _ = histogram!("im_hook_latency_seconds", "hook" => hook);
        MetricHandles {
            hists: Arc::new(std::array::from_fn(|_| latency::LatencyHist::default())),
            probes: Arc::new(AtomicBool::new(probes)),
            totals: Arc::new(Totals::default()),
            connections: gauge!("im_connections"),
            connections_opened: counter!("im_connections_opened_total"),
            received: ["text", "image", "file", "system"]
                .map(|t| counter!("im_messages_received_total", "type" => t)),
            delivered: counter!("im_messages_delivered_total"),
            dropped_slow: counter!("im_messages_dropped_total", "reason" => "slow_consumer"),
            encoded: counter!("im_messages_encoded_total"),
            syncs_from_window: counter!("im_syncs_from_window_total"),
            persist_queue_depth: gauge!("im_persist_queue_depth"),
            persist_batch_size: histogram!("im_persist_batch_size"),
            persist_overloaded: counter!("im_persist_overloaded_total"),
            outbound_queued_bytes: gauge!("im_outbound_queued_bytes"),
            slow_consumers: gauge!("im_slow_consumers"),
            slow_consumer_disconnects: counter!("im_slow_consumer_disconnects_total"),
            tracer: Arc::new(trace::Tracer::default()),
        }
    }

    /// Records one stage duration, once: the overview's percentiles and the scrape both
    /// read this histogram (one relaxed load when probes are off).
    #[inline]
    pub fn stage(&self, stage: Stage, d: Duration) {
        if !self.probes.load(Ordering::Relaxed) {
            return;
        }
        self.hists[stage as usize].record_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Appends `im_stage_duration_seconds` (every stage, its Prometheus buckets, sum and
    /// count) to a scrape in the text exposition format.
    pub fn render_stages(&self, out: &mut String) {
        use std::fmt::Write as _;
        out.push_str(
            "# HELP im_stage_duration_seconds Latency of each stage of the message path.\n\
             # TYPE im_stage_duration_seconds histogram\n",
        );
        for (stage, hist) in Stage::ALL.iter().zip(self.hists.iter()) {
            let p = hist.prometheus();
            let name = stage.name();
            for (le, count) in latency::PROM_BUCKETS.iter().zip(p.le) {
                let _ = writeln!(
                    out,
                    "im_stage_duration_seconds_bucket{{stage=\"{name}\",le=\"{le}\"}} {count}"
                );
            }
            let _ = writeln!(
                out,
                "im_stage_duration_seconds_bucket{{stage=\"{name}\",le=\"+Inf\"}} {}\n\
                 im_stage_duration_seconds_sum{{stage=\"{name}\"}} {}\n\
                 im_stage_duration_seconds_count{{stage=\"{name}\"}} {}",
                p.count,
                p.sum_ns as f64 / 1e9,
                p.count
            );
        }
        out.push('\n');
    }

    /// Whether stage probes are on.
    pub fn probes_enabled(&self) -> bool {
        self.probes.load(Ordering::Relaxed)
    }

    /// Cumulative in-process histogram counts per stage (path order of [`Stage::ALL`]).
    pub fn stage_counts(&self) -> Vec<latency::Counts> {
        self.hists.iter().map(|h| h.snapshot()).collect()
    }

    /// Records the time since `since` for a stage.
    #[inline]
    pub fn stage_since(&self, stage: Stage, since: Instant) {
        self.stage(stage, since.elapsed());
    }

    /// Counts a bad frame by reason (rare path: looks the handle up).
    pub fn bad_frame(&self, reason: &'static str) {
        counter!("im_bad_frames_total", "reason" => reason).increment(1);
    }

    /// Counts a connection refused before the upgrade (rare path: looks the handle up).
    pub fn connection_refused(&self, reason: &'static str) {
        counter!("im_connections_refused_total", "reason" => reason).increment(1);
        if let Some(i) = REFUSED_REASONS.iter().position(|r| *r == reason) {
            self.totals.refused[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a closed connection by reason.
    pub fn connection_closed(&self, reason: &'static str) {
        counter!("im_connections_closed_total", "reason" => reason).increment(1);
        self.connections.decrement(1.0);
    }

    /// Counts a received message by its wire type.
    #[inline]
    pub fn message_received(&self, msg_type: i32) {
        self.totals.messages_in.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.received.get(msg_type as usize) {
            c.increment(1);
        }
    }
}

/// Every `reason` label of `im_bad_frames_total`.
pub const BAD_FRAME_REASONS: &[&str] = &[
    "text",
    "decode",
    "too_large",
    "unauthenticated",
    "login_timeout",
    "protocol",
    "not_member",
    "rate_limited",
    "forbidden",
    "batch_too_large",
    "session_limit",
];

/// Reasons of `im_store_faults_total` and `im_store_fault` (the store's `Fault` names).
pub const STORE_FAULTS: &[&str] = &["disk_full", "io_error", "read_only", "store_down"];

/// What kind of metric a [`Help`] row describes.
#[derive(Clone, Copy)]
enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric's HELP text: kind, name, unit, text.
struct Help(MetricKind, &'static str, Option<Unit>, &'static str);

const fn help_counter(name: &'static str, text: &'static str) -> Help {
    Help(MetricKind::Counter, name, None, text)
}

const fn help_gauge(name: &'static str, text: &'static str) -> Help {
    Help(MetricKind::Gauge, name, None, text)
}

/// HELP text and units for every metric (promtool lints a metric without HELP).
const HELP: &[Help] = &[
    help_gauge("im_hook_configured", "1 when the hook is configured on this node, by hook (before_send)."),
    help_counter("im_hook_calls_total", "Calls made to the hook, by hook."),
    Help(MetricKind::Histogram, "im_hook_latency_seconds", Some(Unit::Seconds), "Duration of each call to the hook (to its answer, its timeout or its failure), by hook."),
    help_counter("im_hook_outcomes_total", "Sends the hook decided or could not decide, by hook and outcome (allow, reject, replace; timeout, error, status, bad_answer for failed calls; breaker_open, busy for Sends not asked)."),
    help_gauge("im_hook_breaker_state", "The hook's circuit breaker: 0 closed (called), 1 half-open (one probe call), 2 open (not called), by hook."),
    help_counter("im_hook_breaker_opened_total", "Times the hook's circuit breaker opened, by hook."),
    help_gauge("im_hook_in_flight", "Calls to the hook in flight now, by hook."),
    help_counter("im_traces_recorded_total", "Message trace parts filed in this node's trace store."),
    help_counter("im_trace_bad_replies_total", "Trace replies from other nodes dropped: too large, undecodable, badly signed or not the asked message."),
    help_gauge("im_region_config_mismatch", "1 while region `from` announces a regions list different from this region's (nothing applied from it or forwarded to it), by from."),
    help_counter("im_receipts_sent_total", "ReadReceipt pushes sent (per member, or one counted receipt for a large group)."),
    help_counter("im_receipts_dropped_total", "Committed reads whose receipt was dropped because the receipt queue was full."),
    help_counter("im_presence_pushes_total", "Presence pushes queued to subscribed connections."),
    help_gauge("im_presence_subscriptions", "Presence subscriptions held by connections on this node."),
    help_counter("im_typing_skipped_slow_total", "Typing signals not queued to a connection above its low mark (a slow consumer)."),
    help_counter("im_admin_messages_total", "Messages sent through POST /admin/v1/messages, by kind and target."),
    help_counter("im_admin_message_refusals_total", "POST /admin/v1/messages requests refused, by HTTP status."),
    help_gauge("im_store_writable", "1 while the store takes commits; 0 while a store fault holds and Sends are refused."),
    help_gauge("im_store_fault", "1 for the store fault in force, by reason (disk_full, io_error, read_only, store_down)."),
    help_counter("im_store_faults_total", "Store faults begun (a commit failed for a reason that fails the next one too), by reason."),
    help_counter("im_store_refused_sends_total", "Sends answered OVERLOADED because the store cannot take them, by reason (a store fault, or disk_low)."),
    help_counter("im_store_connection_resets_total", "Store writer connections closed because their state was in doubt (after a failed write, or found inside a transaction)."),
    help_counter("im_store_checkpoints_total", "SQLite write-ahead log checkpoints run by the store's checkpointer (PASSIVE, every 250 ms)."),
    help_counter("im_store_checkpoint_restarts_total", "RESTART checkpoints the store's checkpointer ran because the SQLite write-ahead log passed 4,096 pages (commits wait while it finishes; the log then starts again from its beginning)."),
    help_counter("im_store_checkpoint_failures_total", "SQLite checkpoints that failed (the log grows until one works)."),
    help_gauge("im_store_wal_frames", "Frames in the SQLite write-ahead log at the last checkpoint."),
    help_gauge("im_store_wal_frames_behind", "Frames of the SQLite write-ahead log not yet copied into the database file at the last checkpoint (readers still using them)."),
    help_gauge("im_store_disk_free_bytes", "Free bytes on the file system of the SQLite data dir."),
    help_gauge("im_connections", "Live client connections."),
    help_counter("im_connections_opened_total", "Client connections accepted."),
    help_counter("im_connections_refused_total", "Client connections refused before the WebSocket upgrade (HTTP 503), by reason (draining, node_full, per_ip)."),
    help_counter("im_flood_disconnects_total", "Connections closed for too many RATE_LIMITED refusals, by frame kind (ping, send, deliver_ack, sync, group_op, mark_read, conversations, presence, typing)."),
    help_counter("im_http_rejected_total", "Sockets the HTTP layer closed before a request was served, by listener and reason (header_timeout, header_too_large, bad_request, admin_full)."),
    help_counter("im_connections_closed_total", "Client connections closed, by reason."),
    help_counter("im_messages_received_total", "Sends accepted into the pipeline, by message type."),
    help_counter("im_messages_delivered_total", "Message copies queued to recipient connections."),
    help_counter("im_messages_dropped_total", "Message copies not queued, by reason (slow consumers fetch them by sync)."),
    help_counter("im_messages_encoded_total", "Deliveries encoded (once per message, whatever the recipient count)."),
    help_counter("im_bad_frames_total", "Bad client input, by reason."),
    help_counter("im_sync_hints_total", "Sync hints sent: notify-and-pull to members of large groups, and to every session after a cluster resync."),
    help_counter("im_syncs_from_window_total", "Syncs answered from a large group's window of newest messages, without a store read."),
    help_counter("im_sync_window_misses_total", "Syncs of one large group the window could not answer (read from the store), by reason (no_window, membership, changed, before_window, ahead_of_window)."),
    help_gauge("im_persist_queue_depth", "Requests waiting in the persistence queue."),
    Help(MetricKind::Histogram, "im_persist_batch_size", None, "Messages per commit batch."),
    Help(MetricKind::Histogram, "im_persist_cursor_commit_seconds", Some(Unit::Seconds), "Seconds a share of delivery cursors took to commit beside the messages (Postgres), failed ones included."),
    help_counter("im_persist_overloaded_total", "Sends refused with OVERLOADED because the persistence queue was full."),
    Help(MetricKind::Gauge, "im_outbound_queued_bytes", Some(Unit::Bytes), "Bytes queued for writing across all connections."),
    help_gauge("im_slow_consumers", "Connections above the soft mark."),
    help_counter("im_slow_consumer_disconnects_total", "Connections closed for the hard mark or a write timeout."),
    help_counter("im_admin_unauthorized_total", "Admin API requests refused for a missing or wrong token."),
    Help(MetricKind::Gauge, "im_alloc_bytes", Some(Unit::Bytes), "jemalloc statistics, by kind."),
    help_gauge("im_capacity_headroom_connections", "More connections this node can take before its first resource runs out."),
    help_gauge("im_capacity_headroom_ratio", "Free share of each resource (1 - used/limit)."),
    help_gauge("im_capacity_headroom_msgs_per_second", "More messages per second this node can take, from CPU (absent while idle)."),
    Help(MetricKind::Gauge, "im_memory_per_connection_bytes", Some(Unit::Bytes), "Measured memory per connection."),
    help_gauge("im_users_online", "Distinct users with a connection on this node."),
    help_gauge("im_log_filters_active", "Per-uid log level overrides in force."),
    help_gauge("im_log_tail_subscribers", "Live log tails (GET /admin/v1/logs/tail) open now."),
    help_counter("im_log_tail_events_total", "Events of filtered users filed in the live tail's ring."),
    help_counter("im_log_tail_dropped_total", "Live tail events dropped because a tail's reader fell behind."),
    Help(MetricKind::Counter, "im_log_bytes_written_total", Some(Unit::Bytes), "Bytes written to log files."),
    Help(MetricKind::Counter, "im_log_compressed_bytes_total", Some(Unit::Bytes), "Bytes of rotated log files compressed."),
    help_counter("im_profiles_captured_total", "CPU profiles captured."),
    help_counter("im_heap_profiles_captured_total", "Heap profiles captured (GET /admin/v1/profile/heap)."),
    help_gauge("im_cluster_link_up", "1 while this node's cluster link works (NATS connected, KV buckets usable), else 0."),
    help_counter("im_cluster_reconnects_total", "Times the NATS connection came back after a loss."),
    help_counter("im_cluster_resyncs_total", "Cluster state rebuilds after a reconnect or a KV failure (each ends with a resync notice)."),
    help_counter("im_cluster_kv_recreated_total", "Cluster KV buckets recreated because NATS had lost them."),
    help_gauge("im_cluster_nodes_live", "Nodes whose load report is recent (within 2.5 report intervals): routable."),
    help_gauge("im_cluster_nodes_healthy", "Nodes whose load report is within the TTL: still sent pushes."),
    help_counter("im_cluster_nodes_lost_total", "Times another node missed its load reports and left rotation."),
    help_counter("im_cluster_nodes_returned_total", "Times a lost node reported again."),
    help_counter("im_cluster_forwarded_total", "Envelopes published to other nodes (pushes and group notices)."),
    help_counter("im_cluster_received_total", "Envelopes received from other nodes."),
    help_counter("im_cluster_bad_envelopes_total", "Undecodable envelopes received from other nodes."),
    help_counter("im_cluster_bad_queries_total", "Cluster admin queries and replies dropped: undecodable, unsigned, badly signed or oversized."),
    help_counter("im_cluster_publish_errors_total", "Publishes to other nodes that failed or were skipped while NATS was down."),
    help_counter("im_cluster_presence_errors_total", "Presence writes to the KV bucket that failed (written again after a resync)."),
    help_counter("im_region_reconciled_total", "Messages this region acked above a home move's fence, set aside and committed again at the new home with their msg_id."),
    help_counter("im_region_fenced_total", "Replicated records of an older home epoch above the next epoch's fence, dropped (their region re-sends them), by from and to."),
    help_counter("im_region_home_moves_total", "Home moves made at this node (POST /admin/v1/homes...), by forced."),
    help_gauge("im_runtime_workers", "Worker threads of the tokio runtime."),
    help_gauge("im_runtime_alive_tasks", "Tasks alive on the tokio runtime (spawned, not yet finished)."),
    help_gauge("im_runtime_global_queue_depth", "Tasks waiting in the tokio runtime's global (injection) queue."),
    help_gauge("im_runtime_busy_ratio", "Share of the last sampler interval the runtime's workers spent polling tasks, over all workers (0..1)."),
    help_gauge("im_runtime_worker_busy_ratio", "Share of the last sampler interval each runtime worker spent polling tasks (0..1)."),
    Help(MetricKind::Counter, "im_runtime_worker_busy_seconds_total", Some(Unit::Seconds), "Time each runtime worker spent polling tasks (whole seconds)."),
    help_counter("im_runtime_worker_parks_total", "Times each runtime worker parked (ran out of work and went to sleep)."),
    help_counter("im_task_instrumented_total", "Long-lived tasks started under a task monitor, by task (writer, router, receipts, cluster_inbound, cluster)."),
    help_gauge("im_task_alive", "Monitored long-lived tasks running now, by task."),
    help_counter("im_task_polls_total", "Polls of the monitored tasks, by task."),
    Help(MetricKind::Counter, "im_task_poll_seconds_total", Some(Unit::Seconds), "Time spent polling the monitored tasks, by task (whole seconds)."),
    help_counter("im_task_slow_polls_total", "Polls of the monitored tasks that took 1 ms or more (held a worker), by task."),
    Help(MetricKind::Counter, "im_task_slow_poll_seconds_total", Some(Unit::Seconds), "Time spent in slow polls of the monitored tasks, by task (whole seconds)."),
    help_counter("im_task_scheduled_total", "Times a monitored task was woken and waited for a worker, by task."),
    Help(MetricKind::Counter, "im_task_scheduled_delay_seconds_total", Some(Unit::Seconds), "Time the monitored tasks waited between a wake and their next poll, by task (whole seconds)."),
    Help(MetricKind::Gauge, "im_task_mean_poll_seconds", Some(Unit::Seconds), "Mean poll duration of each monitored task over the last sampler interval (0: not polled)."),
    Help(MetricKind::Gauge, "im_task_mean_scheduled_delay_seconds", Some(Unit::Seconds), "Mean scheduled delay (wake to poll) of each monitored task over the last sampler interval."),
    Help(MetricKind::Gauge, "process_resident_memory_bytes", Some(Unit::Bytes), "Resident set size."),
    Help(MetricKind::Counter, "process_cpu_seconds_total", Some(Unit::Seconds), "User and system CPU time."),
    help_gauge("process_open_fds", "Open file descriptors."),
    help_gauge("process_max_fds", "RLIMIT_NOFILE soft limit."),
    Help(MetricKind::Gauge, "process_start_time_seconds", Some(Unit::Seconds), "Start time since the Unix epoch."),
];

/// Registers the HELP text and unit of every metric in [`HELP`].
fn describe() {
    for Help(kind, name, unit, text) in HELP {
        let (name, text) = (*name, *text);
        match (kind, *unit) {
            (MetricKind::Counter, Some(u)) => describe_counter!(name, u, text),
            (MetricKind::Counter, None) => describe_counter!(name, text),
            (MetricKind::Gauge, Some(u)) => describe_gauge!(name, u, text),
            (MetricKind::Gauge, None) => describe_gauge!(name, text),
            (MetricKind::Histogram, Some(u)) => describe_histogram!(name, u, text),
            (MetricKind::Histogram, None) => describe_histogram!(name, text),
        }
    }
}

/// The end-to-end probe of one message: decode start to the last recipient's socket
/// write. Each queued copy holds one count; the write that drops it to zero records.
pub struct EndToEnd {
    started: Instant,
    pending: AtomicUsize,
}

impl EndToEnd {
    /// A probe started at `started`, holding one count for its creator.
    pub fn new(started: Instant) -> Arc<Self> {
        Arc::new(EndToEnd {
            started,
            pending: AtomicUsize::new(1),
        })
    }

    /// Adds a pending copy.
    pub fn add(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks one copy written (or the creator finished); the last records the stage.
    pub fn done(&self, metrics: &Metrics) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            metrics.stage_since(Stage::EndToEnd, self.started);
        }
    }
}
