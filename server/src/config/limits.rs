//! `[limits]`: protocol limits and timers (frame size, heartbeats and timeouts, rate
//! limits and their flood closes, connection and session caps, trusted proxies), with
//! their defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::{invalid, range};
use super::ConfigError;

/// Protocol limits and timers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted WebSocket message, in bytes.
    pub max_frame_bytes: u32,
    /// Heartbeat interval advertised in LoginOk.
    pub heartbeat_secs: u32,
    /// A connection with no frame for this long is closed.
    pub idle_timeout_secs: u32,
    /// A connection must log in within this time.
    pub login_timeout_secs: u32,
    /// Undecodable frames tolerated on one connection before it is closed.
    pub max_bad_frames: u32,
    /// Largest `SyncRequest.limit` honoured (and the default when 0).
    pub sync_limit_max: u32,
    /// Most members a group may have.
    pub max_group_members: u32,
    /// Sends per second one connection may sustain (0: unlimited); over it: RATE_LIMITED.
    pub send_rate_per_sec: u32,
    /// Sends one connection may burst above the sustained rate.
    pub send_burst: u32,
    /// Pings per second one connection may sustain (0: unlimited); over it: RATE_LIMITED.
    pub ping_rate_per_sec: u32,
    /// Pings one connection may burst above the sustained rate.
    pub ping_burst: u32,
    /// RATE_LIMITED refusals (of Sends, and apart of Pings) one connection may collect
    /// within `rate_limited_window_secs`; the next closes it (1008; 0: never).
    pub max_rate_limited: u32,
    /// The window `max_rate_limited` is counted in.
    pub rate_limited_window_secs: u32,
    /// Most client connections at once; more get HTTP 503 before the upgrade. 0: the
    /// RLIMIT_NOFILE soft limit less [`FD_RESERVE`] (store, logs, admin, cluster).
    pub max_connections: u32,
    /// Most client connections from one source address (0: no cap; mind NAT gateways).
    /// The address is the socket peer, or the client named by `X-Forwarded-For` when
    /// the peer is one of `trusted_proxies`.
    pub max_connections_per_ip: u32,
    /// Proxies (IP addresses) whose `X-Forwarded-For` names the client; from any other
    /// peer the header is ignored. A trusted proxy's own address has no per-IP cap.
    pub trusted_proxies: Vec<String>,
    /// Most logged-in connections one user may hold on this node; the next login is
    /// refused (`RESOURCE_EXHAUSTED`-style error, close 1008; 0: no cap).
    pub max_sessions_per_user: u32,
    /// DeliverAcks per second one connection may sustain (0: unlimited).
    pub deliver_ack_rate_per_sec: u32,
    /// DeliverAcks one connection may burst above the sustained rate.
    pub deliver_ack_burst: u32,
    /// SyncRequests per second one connection may sustain (0: unlimited).
    pub sync_rate_per_sec: u32,
    /// SyncRequests one connection may burst above the sustained rate.
    pub sync_burst: u32,
    /// GroupOps per second one connection, and one user on this node, may sustain (0:
    /// unlimited); over it: RATE_LIMITED with retry_after_ms.
    pub group_op_rate_per_sec: u32,
    /// GroupOps one connection (and one user) may burst above the sustained rate.
    pub group_op_burst: u32,
    /// Most frames one `Batch` frame may carry; more is a bad frame and nothing of it
    /// is handled.
    pub max_batch_frames: u32,
    /// Most live groups one user may have created (0: no limit).
    pub max_groups_per_user: u32,
    /// A session ends this many seconds after its token's `exp` (close 4003 "token
    /// expired"); also the clock skew allowed when a token is verified.
    pub token_leeway_secs: u32,
    /// MarkReads per second one connection may sustain (0: unlimited).
    pub mark_read_rate_per_sec: u32,
    /// MarkReads one connection may burst above the sustained rate.
    pub mark_read_burst: u32,
    /// ListConversations per second one connection may sustain (0: unlimited).
    pub list_conversations_rate_per_sec: u32,
    /// ListConversations one connection may burst above the sustained rate.
    pub list_conversations_burst: u32,
    /// SetConversationFlags per second one connection may sustain (0: unlimited).
    pub set_flags_rate_per_sec: u32,
    /// SetConversationFlags one connection may burst above the sustained rate.
    pub set_flags_burst: u32,
    /// Largest `ListConversations.limit` honoured (0 asks for 50, or this if smaller).
    pub list_conversations_limit_max: u32,
    /// Bytes of the last message's payload a conversation list entry carries.
    pub conversation_preview_bytes: u32,
    /// How long after sending a user may recall their message (0: no limit); group
    /// owners and admins may recall any message at any time.
    pub recall_window_secs: u32,
    /// How long after sending a user may edit their message (0: no limit).
    pub edit_window_secs: u32,
    /// Most users one connection may watch the presence of (one PresenceSubscribe
    /// names at most this many; more is a bad frame).
    pub presence_subscriptions_max: u32,
    /// PresenceSubscribes per second one connection may sustain (0: unlimited).
    pub presence_subscribe_rate_per_sec: u32,
    /// PresenceSubscribes one connection may burst above the sustained rate.
    pub presence_subscribe_burst: u32,
    /// SetPresence frames per second one connection may sustain (0: unlimited).
    pub set_presence_rate_per_sec: u32,
    /// SetPresence frames one connection may burst above the sustained rate.
    pub set_presence_burst: u32,
    /// Typing frames per second one connection may sustain (0: unlimited).
    pub typing_rate_per_sec: u32,
    /// Typing frames one connection may burst above the sustained rate.
    pub typing_burst: u32,
    /// Groups with more members than this get no typing fan-out (0: none do).
    pub typing_group_max: u32,
}

/// File descriptors kept free for the store, log files, the admin listener and NATS
/// when `limits.max_connections` is automatic.
pub const FD_RESERVE: u64 = 256;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 64 * 1024,
            heartbeat_secs: 30,
            idle_timeout_secs: 90,
            login_timeout_secs: 10,
            max_bad_frames: 10,
            sync_limit_max: 1000,
            max_group_members: 100_000,
            send_rate_per_sec: 500,
            send_burst: 1000,
            ping_rate_per_sec: 10,
            ping_burst: 20,
            max_rate_limited: 100,
            rate_limited_window_secs: 10,
            max_connections: 0,
            max_connections_per_ip: 0,
            trusted_proxies: Vec::new(),
            max_sessions_per_user: 16,
            deliver_ack_rate_per_sec: 200,
            deliver_ack_burst: 1000,
            sync_rate_per_sec: 50,
            sync_burst: 100,
            group_op_rate_per_sec: 5,
            group_op_burst: 20,
            max_batch_frames: 128,
            max_groups_per_user: 100,
            token_leeway_secs: 5,
            mark_read_rate_per_sec: 50,
            mark_read_burst: 200,
            list_conversations_rate_per_sec: 10,
            list_conversations_burst: 50,
            set_flags_rate_per_sec: 10,
            set_flags_burst: 50,
            list_conversations_limit_max: 100,
            conversation_preview_bytes: 256,
            recall_window_secs: 120,
            edit_window_secs: 0,
            presence_subscriptions_max: 500,
            presence_subscribe_rate_per_sec: 1,
            presence_subscribe_burst: 10,
            set_presence_rate_per_sec: 1,
            set_presence_burst: 5,
            typing_rate_per_sec: 2,
            typing_burst: 10,
            typing_group_max: 500,
        }
    }
}

impl Limits {
    /// Checks every key of `[limits]`, in the order of the file; the first bad one is
    /// the error.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.validate_frames_and_timeouts()?;
        self.validate_connections()?;
        self.validate_buckets()?;
        self.validate_sizes()
    }

    /// Frame size, heartbeat and timeouts, sync page and group size.
    fn validate_frames_and_timeouts(&self) -> Result<(), ConfigError> {
        let l = self;
        range("limits.max_frame_bytes", l.max_frame_bytes, 256, 16 << 20)?;
        range("limits.heartbeat_secs", l.heartbeat_secs, 1, 3600)?;
        range("limits.idle_timeout_secs", l.idle_timeout_secs, 1, 86_400)?;
        if l.idle_timeout_secs <= l.heartbeat_secs {
            return Err(invalid(
                "limits.idle_timeout_secs",
                l.idle_timeout_secs,
                "must be greater than limits.heartbeat_secs",
            ));
        }
        range("limits.login_timeout_secs", l.login_timeout_secs, 1, 3600)?;
        range("limits.sync_limit_max", l.sync_limit_max, 1, 100_000)?;
        range(
            "limits.max_group_members",
            l.max_group_members,
            2,
            10_000_000,
        )?;
        Ok(())
    }

    /// The Ping bucket, the flood rule and the connection, proxy and session caps.
    fn validate_connections(&self) -> Result<(), ConfigError> {
        let l = self;
        range(
            "limits.ping_rate_per_sec",
            l.ping_rate_per_sec,
            0,
            1_000_000,
        )?;
        range("limits.ping_burst", l.ping_burst, 1, 1_000_000)?;
        range("limits.max_rate_limited", l.max_rate_limited, 0, 1_000_000)?;
        range(
            "limits.rate_limited_window_secs",
            l.rate_limited_window_secs,
            1,
            3600,
        )?;
        range("limits.max_connections", l.max_connections, 0, 100_000_000)?;
        range(
            "limits.max_groups_per_user",
            l.max_groups_per_user,
            0,
            100_000_000,
        )?;
        range("limits.token_leeway_secs", l.token_leeway_secs, 0, 3600)?;
        range(
            "limits.max_connections_per_ip",
            l.max_connections_per_ip,
            0,
            100_000_000,
        )?;
        for p in &l.trusted_proxies {
            if p.trim().parse::<std::net::IpAddr>().is_err() {
                return Err(invalid(
                    "limits.trusted_proxies",
                    p,
                    "expected IP addresses, e.g. [\"10.0.0.5\"] (env: comma-separated)",
                ));
            }
        }
        range(
            "limits.max_sessions_per_user",
            l.max_sessions_per_user,
            0,
            1_000_000,
        )?;
        Ok(())
    }

    /// The per-connection token buckets: rate 0 (unlimited) and up, burst 1 and up.
    fn validate_buckets(&self) -> Result<(), ConfigError> {
        let l = self;
        for (key, rate, burst_key, burst) in [
            (
                "limits.deliver_ack_rate_per_sec",
                l.deliver_ack_rate_per_sec,
                "limits.deliver_ack_burst",
                l.deliver_ack_burst,
            ),
            (
                "limits.sync_rate_per_sec",
                l.sync_rate_per_sec,
                "limits.sync_burst",
                l.sync_burst,
            ),
            (
                "limits.group_op_rate_per_sec",
                l.group_op_rate_per_sec,
                "limits.group_op_burst",
                l.group_op_burst,
            ),
            (
                "limits.mark_read_rate_per_sec",
                l.mark_read_rate_per_sec,
                "limits.mark_read_burst",
                l.mark_read_burst,
            ),
            (
                "limits.list_conversations_rate_per_sec",
                l.list_conversations_rate_per_sec,
                "limits.list_conversations_burst",
                l.list_conversations_burst,
            ),
            (
                "limits.set_flags_rate_per_sec",
                l.set_flags_rate_per_sec,
                "limits.set_flags_burst",
                l.set_flags_burst,
            ),
            (
                "limits.presence_subscribe_rate_per_sec",
                l.presence_subscribe_rate_per_sec,
                "limits.presence_subscribe_burst",
                l.presence_subscribe_burst,
            ),
            (
                "limits.set_presence_rate_per_sec",
                l.set_presence_rate_per_sec,
                "limits.set_presence_burst",
                l.set_presence_burst,
            ),
            (
                "limits.typing_rate_per_sec",
                l.typing_rate_per_sec,
                "limits.typing_burst",
                l.typing_burst,
            ),
        ] {
            range(key, rate, 0, 1_000_000)?;
            range(burst_key, burst, 1, 1_000_000)?;
        }
        Ok(())
    }

    /// Batches, list pages, previews, the recall and edit windows, presence and typing.
    fn validate_sizes(&self) -> Result<(), ConfigError> {
        let l = self;
        range("limits.max_batch_frames", l.max_batch_frames, 1, 100_000)?;
        range(
            "limits.list_conversations_limit_max",
            l.list_conversations_limit_max,
            1,
            1000,
        )?;
        range(
            "limits.conversation_preview_bytes",
            l.conversation_preview_bytes,
            0,
            65_536,
        )?;
        range(
            "limits.recall_window_secs",
            l.recall_window_secs,
            0,
            365 * 86_400,
        )?;
        range(
            "limits.edit_window_secs",
            l.edit_window_secs,
            0,
            365 * 86_400,
        )?;
        range(
            "limits.presence_subscriptions_max",
            l.presence_subscriptions_max,
            1,
            100_000,
        )?;
        range("limits.typing_group_max", l.typing_group_max, 0, 10_000_000)?;
        Ok(())
    }

    /// `max_connections` with 0 resolved against this process's RLIMIT_NOFILE.
    pub fn max_connections_resolved(&self) -> usize {
        if self.max_connections > 0 {
            return self.max_connections as usize;
        }
        let fds = crate::obs::process::max_fds();
        if fds == 0 || fds >= u32::MAX as u64 {
            0
        } else {
            fds.saturating_sub(FD_RESERVE).max(1) as usize
        }
    }
}
