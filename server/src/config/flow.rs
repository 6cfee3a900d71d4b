//! `[flow]`: outbound flow control (the soft and hard marks, write and drain timeouts,
//! coalescing, notify-and-pull, socket and WebSocket buffers, the sync page budget),
//! with its defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::{invalid, range};
use super::ConfigError;

/// Outbound flow control.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Flow {
    /// Above this many queued bytes a connection is a slow consumer.
    pub soft_mark_bytes: u64,
    /// Above this many queued bytes a connection is closed.
    pub hard_mark_bytes: u64,
    /// A socket write stuck this long closes the connection.
    pub write_timeout_secs: u32,
    /// Most frames coalesced into one socket write.
    pub coalesce_max_frames: u32,
    /// Groups with more members than this use notify-and-pull: members get a small
    /// sync hint (an unsolicited `SyncResponse{more: true}`) instead of the payload.
    pub notify_group_threshold: u32,
    /// WebSocket read buffer per connection (tungstenite allocates it eagerly); the socket
    /// is read through the worker thread's buffer (`gateway::pooled`), not this one.
    pub ws_read_buffer_bytes: u32,
    /// WebSocket write buffer per connection.
    pub ws_write_buffer_bytes: u32,
    /// Accept backlog of the client listener (capped by `net.core.somaxconn`).
    pub listen_backlog: u32,
    /// Kernel send buffer per client socket (SO_SNDBUF; 0: OS default).
    pub socket_send_buffer_bytes: u32,
    /// Kernel receive buffer per client socket (SO_RCVBUF; 0: OS default).
    pub socket_recv_buffer_bytes: u32,
    /// Graceful shutdown (SIGTERM): how long the drain may take to commit, flush and
    /// close before the process exits.
    pub drain_timeout_secs: u32,
    /// Byte budget of one sync page: a page stops before its messages pass this many
    /// bytes and says `more = true` (a single larger message still goes out alone). At
    /// most half of `soft_mark_bytes` is used, whatever is set here.
    pub sync_page_bytes: u64,
}

impl Default for Flow {
    fn default() -> Self {
        Flow {
            soft_mark_bytes: 1 << 20,
            hard_mark_bytes: 4 << 20,
            write_timeout_secs: 10,
            coalesce_max_frames: 64,
            notify_group_threshold: 2000,
            ws_read_buffer_bytes: 256,
            ws_write_buffer_bytes: 4096,
            listen_backlog: 4096,
            socket_send_buffer_bytes: 0,
            socket_recv_buffer_bytes: 0,
            drain_timeout_secs: 10,
            sync_page_bytes: 256 * 1024,
        }
    }
}

impl Flow {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range("flow.soft_mark_bytes", self.soft_mark_bytes, 1024, 1 << 40)?;
        if self.hard_mark_bytes <= self.soft_mark_bytes {
            return Err(invalid(
                "flow.hard_mark_bytes",
                self.hard_mark_bytes,
                "must be greater than flow.soft_mark_bytes",
            ));
        }
        range("flow.write_timeout_secs", self.write_timeout_secs, 1, 3600)?;
        range("flow.drain_timeout_secs", self.drain_timeout_secs, 1, 3600)?;
        range("flow.sync_page_bytes", self.sync_page_bytes, 1024, 1 << 30)?;
        range(
            "flow.coalesce_max_frames",
            self.coalesce_max_frames,
            1,
            4096,
        )?;
        range("flow.listen_backlog", self.listen_backlog, 1, 1 << 20)?;
        range(
            "flow.notify_group_threshold",
            self.notify_group_threshold,
            1,
            100_000_000,
        )?;
        range(
            "flow.ws_read_buffer_bytes",
            self.ws_read_buffer_bytes,
            256,
            16 << 20,
        )?;
        range(
            "flow.ws_write_buffer_bytes",
            self.ws_write_buffer_bytes,
            0,
            16 << 20,
        )?;
        Ok(())
    }

    /// The sync page budget in effect: `sync_page_bytes`, at most half the soft mark.
    pub fn sync_page_budget(&self) -> usize {
        self.sync_page_bytes.min(self.soft_mark_bytes / 2) as usize
    }
}
