//! The routes about what a node holds: its connections (list, slow consumers, kick),
//! its memory, a group, a user's tokens (revoke), and `/v1/route` on the client listener.

use serde::{Deserialize, Serialize};

/// One connection row (`connections[]`, `slow_consumers[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Connection {
    /// Node-unique connection id (used to kick).
    pub conn_id: u64,
    /// Logged-in user, empty before login.
    pub user_id: String,
    /// Remote address.
    pub remote: String,
    /// Seconds since accept.
    pub age_secs: f64,
    /// Bytes queued for writing.
    pub queued_bytes: u64,
    /// Frames received.
    pub msgs_in: u64,
    /// Frames written.
    pub msgs_out: u64,
    /// `handshake`, `active`, `slow` or `closing`.
    pub state: String,
    /// The logged-in device (`Login.device_id`, `default` when it was empty); empty
    /// before login and from older nodes.
    #[serde(default)]
    pub device: String,
}

/// `GET /admin/v1/connections`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnectionList {
    /// Connections on the node (before the limit).
    pub total: u64,
    /// The rows returned.
    pub connections: Vec<Connection>,
}

/// `DELETE /admin/v1/connections/{conn_id}` answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Kicked {
    /// The connection closed.
    pub kicked: u64,
}

/// `POST /admin/v1/users/{uid}/revoke` answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Revoked {
    /// The user.
    pub user: String,
    /// Tokens issued at or before this unix second are refused.
    pub revoked_at: i64,
    /// Sessions closed on the node asked (other nodes close theirs too).
    pub closed: u64,
}

/// `POST /admin/v1/reload` answer: the secrets now in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SecretsReloaded {
    /// The key that signs new tokens (empty: the single `jwt_secret`, no key ids).
    pub signing_kid: String,
    /// Every key id that verifies tokens.
    pub kids: Vec<String>,
    /// Whether the admin token changed (the old one is refused from now on).
    pub admin_token_changed: bool,
}

/// `GET /admin/v1/slow-consumers`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlowConsumers {
    /// Slow consumers now.
    pub total: u64,
    /// Queue size above which a connection is slow.
    pub soft_mark_bytes: u64,
    /// Queue size above which a connection is closed.
    pub hard_mark_bytes: u64,
    /// A socket write stuck this long closes the connection.
    pub write_timeout_secs: u64,
    /// Connections ever marked slow.
    pub marked_total: u64,
    /// Slow consumers the node closed (hard mark or write timeout).
    pub disconnects_total: u64,
    /// The marked connections, largest queue first.
    pub slow_consumers: Vec<Connection>,
}

/// `GET /admin/v1/memory`: jemalloc read fresh, with the process RSS.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Memory {
    /// Bytes allocated by the application.
    pub allocated: u64,
    /// Bytes in active pages.
    pub active: u64,
    /// Bytes in physically resident pages.
    pub resident: u64,
    /// Bytes in mapped extents.
    pub mapped: u64,
    /// Bytes retained for reuse.
    pub retained: u64,
    /// Allocator metadata bytes.
    pub metadata: u64,
    /// `active - allocated`.
    pub fragmentation: u64,
    /// `resident - active - metadata`.
    pub dirty: u64,
    /// Process RSS in bytes.
    pub rss: u64,
    /// The part of `rss` in anonymous pages (the heaps, the stacks); 0 where the OS
    /// does not tell.
    pub rss_anon: u64,
    /// The part of `rss` in file-backed pages (the binary's own code and data as it is
    /// touched, SQLite's shared-memory index); 0 where the OS does not tell.
    pub rss_file: u64,
    /// Bytes the embedded SQLite holds (its page caches and statements, outside
    /// jemalloc); 0 when no SQLite store is open.
    pub sqlite: u64,
    /// Bytes the C allocator (glibc's, used by SQLite and other C code) has taken from
    /// the system; 0 where it cannot be read.
    pub c_heap: u64,
    /// Live connections.
    pub connections: u64,
    /// Memory cost of one connection in bytes.
    pub per_connection_bytes: u64,
    /// Whether that cost was measured.
    pub per_connection_measured: bool,
}

impl Memory {
    /// The six jemalloc figures alone.
    pub fn alloc(&self) -> crate::AllocStats {
        crate::AllocStats {
            allocated: self.allocated,
            active: self.active,
            resident: self.resident,
            mapped: self.mapped,
            retained: self.retained,
            metadata: self.metadata,
        }
    }
}

/// One member of a group and its role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupMember {
    /// The user.
    pub user: String,
    /// `owner`, `admin` or `member`.
    pub role: String,
}

/// `GET /admin/v1/groups/{group_id}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Group {
    /// The group id.
    pub group_id: String,
    /// `private` (members only by invitation) or `public` (anyone may join).
    pub kind: String,
    /// Whether plain members may add others.
    pub members_can_invite: bool,
    /// Who created it.
    pub created_by: String,
    /// When, ms since the Unix epoch.
    pub created_at_ms: i64,
    /// The seq of the group's last membership change in `g:<group_id>`.
    pub version: u64,
    /// Dissolved by its owner.
    pub dissolved: bool,
    /// Member count (all of them, listed or not).
    pub size: u64,
    /// Members sorted by user, at most `listed_max`.
    pub members: Vec<GroupMember>,
    /// Banned users, at most `listed_max`.
    pub banned: Vec<String>,
    /// Most members and bans listed.
    pub listed_max: u32,
}

/// `GET /v1/route` (client listener): the node a new connection should use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RouteAnswer {
    /// The chosen node's id.
    pub node_id: String,
    /// Its client WebSocket URL.
    pub ws_url: String,
    /// Multi-region mode: the answering node's region (absent otherwise).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub region: String,
    /// Multi-region mode: every region and its entry point, for clients to probe and
    /// pick the nearest healthy one (absent otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<RouteRegion>,
}

/// One region of [`RouteAnswer::regions`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RouteRegion {
    /// Its name.
    pub name: String,
    /// `http://HOST:PORT` where clients ask that region's `GET /v1/route`.
    pub route_url: String,
}
