//! Store: durable state behind one trait, with SQLite (embedded default) and Postgres
//! implementations. It owns the schema (`migrations/<db>`), seq allocation, dedup by
//! (sender, conversation, client_msg_id), cursors, groups (roles, bans, membership
//! intervals, the decision of who may change what), revocations and sync queries, which
//! clamp every group read to the reader's membership intervals. Only the persistence
//! writer (`pipeline::persist`) calls the write methods; readers call the rest.

pub mod access;
pub mod health;
mod postgres;
mod sql;
mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

pub use health::{Fault, StoreHealth};
pub use postgres::PgStore;
pub use sqlite::SqliteStore;

use crate::config::{Config, ConfigError, Database};

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// A migration failed.
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The data directory could not be prepared.
    #[error("data dir: {0}")]
    Io(#[from] std::io::Error),
    /// The config selects no usable database.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The group does not exist.
    #[error("group {0} not found")]
    GroupNotFound(String),
    /// The group already exists.
    #[error("group {0} already exists")]
    GroupExists(String),
    /// The user is not a member of the group.
    #[error("not a member of group {0}")]
    NotMember(String),
    /// The group would exceed its member limit.
    #[error("group {0} would exceed {1} members")]
    GroupFull(String, u32),
    /// The caller's role (or a ban, or the group's kind) does not allow the operation.
    #[error("{0}")]
    Forbidden(String),
    /// The operation is malformed for the group's state (e.g. TRANSFER with no target).
    #[error("{0}")]
    BadRequest(String),
    /// The write did not finish within `store.unavailable_after_ms` and was abandoned.
    #[error("the store did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The store is failing (the reason word); the write was not tried.
    #[error("store unavailable: {0}")]
    Unavailable(&'static str),
}

/// A message to commit, as validated by the pipeline.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Conversation id (`u:a:b` or `g:id`).
    pub conversation_id: String,
    /// Sending user.
    pub sender: String,
    /// Client-chosen idempotency key; empty means none.
    pub client_msg_id: String,
    /// `MessageType` as its wire value.
    pub msg_type: i32,
    /// Opaque payload.
    pub payload: Bytes,
    /// Server-assigned id (used unless the message is a duplicate).
    pub msg_id: String,
    /// The two parties for a one-to-one conversation (recorded when it is first created).
    pub direct: Option<(String, String)>,
}

/// What the store made of one [`NewMessage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The message id (the original one for a duplicate).
    pub msg_id: String,
    /// The conversation id.
    pub conversation_id: String,
    /// Per-conversation seq.
    pub seq: u64,
    /// Server time of the commit, ms.
    pub server_time: i64,
    /// True when (sender, client_msg_id) was already stored.
    pub duplicate: bool,
}

/// A delivered-up-to cursor to save (kept only if it moves forward).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorUpdate {
    /// The user.
    pub user_id: String,
    /// The conversation.
    pub conversation_id: String,
    /// Everything up to this seq was delivered.
    pub seq: u64,
}

/// A stored message as it goes on the wire.
pub type StoredMessage = im_proto::ChatMessage;

/// A group operation as the store applies it: the store decides, inside the
/// transaction, whether the actor's role allows it.
#[derive(Debug, Clone)]
pub struct GroupRequest {
    /// Who asks.
    pub actor: String,
    /// What (`JOIN` naming others is already mapped to `ADD` by the pipeline).
    pub op: im_proto::group_op::Op,
    /// The users it names (CREATE: initial members besides the actor).
    pub users: Vec<String>,
    /// CREATE: the kind.
    pub kind: im_proto::group_op::Kind,
    /// SET_ROLE: the new role.
    pub role: im_proto::group_op::Role,
    /// CREATE: whether plain members may add others.
    pub members_can_invite: bool,
    /// Most members the group may have.
    pub max_members: u32,
    /// Most live groups one user may have created (CREATE; 0: no limit).
    pub max_groups_per_user: u32,
}

/// A group's state as one user sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupState {
    /// Private or public.
    pub kind: im_proto::group_op::Kind,
    /// Whether plain members may add others.
    pub members_can_invite: bool,
    /// Member count.
    pub members: u32,
    /// The user's role (`None` for a non-member).
    pub role: im_proto::group_op::Role,
    /// Seq of the last membership change.
    pub version: u64,
}

/// What a committed group operation changed.
#[derive(Debug, Clone)]
pub struct GroupOutcome {
    /// The state after it, as the actor sees it.
    pub state: GroupState,
    /// The SYSTEM message recording it (none when nothing changed).
    pub event: Option<StoredMessage>,
    /// Users who became members.
    pub added: Vec<String>,
    /// Users who stopped being members.
    pub removed: Vec<String>,
    /// The group was dissolved.
    pub dissolved: bool,
}

/// A group as operators see it (`GET /admin/v1/groups/{id}`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupInfo {
    /// The group id.
    pub group_id: String,
    /// `private` or `public`.
    pub kind: &'static str,
    /// Whether plain members may add others.
    pub members_can_invite: bool,
    /// Who created it.
    pub created_by: String,
    /// When, ms since the epoch.
    pub created_at: i64,
    /// Seq of the last membership change.
    pub version: u64,
    /// Dissolved by its owner.
    pub dissolved: bool,
    /// Member count.
    pub size: u32,
    /// Members with their role (`owner`, `admin`, `member`), sorted by user, at most `limit`.
    pub members: Vec<(String, &'static str)>,
    /// Banned users, at most `limit`.
    pub banned: Vec<String>,
}

/// A role's name in the admin API.
pub fn role_name(role: i32) -> &'static str {
    match im_proto::group_op::Role::try_from(role) {
        Ok(im_proto::group_op::Role::Owner) => "owner",
        Ok(im_proto::group_op::Role::Admin) => "admin",
        Ok(im_proto::group_op::Role::Member) => "member",
        _ => "none",
    }
}

/// What one message adds to an encoded sync page, about: its payload and ids plus a
/// fixed allowance for the field tags and numbers.
pub fn message_bytes(m: &StoredMessage) -> usize {
    m.payload.len()
        + m.conversation_id.len()
        + m.sender.len()
        + m.msg_id.len()
        + m.client_msg_id.len()
        + 32
}

/// The durable store. One writer calls the mutating methods; reads may run in parallel.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Commits messages and cursor updates in one transaction: dedups, allocates
    /// gapless per-conversation seqs in input order, and returns one result per message.
    async fn commit_batch(
        &self,
        messages: &[NewMessage],
        cursors: &[CursorUpdate],
    ) -> Result<Vec<Committed>, StoreError>;

    /// Applies a group operation in one transaction (role checks, bans, intervals, the
    /// SYSTEM event at its seq) and returns what changed.
    async fn group_change(
        &self,
        group_id: &str,
        req: &GroupRequest,
    ) -> Result<GroupOutcome, StoreError>;

    /// Members of a live group and its version (seq of its last membership change), or
    /// `None` when it does not exist or was dissolved.
    async fn group_members(&self, group_id: &str)
        -> Result<Option<(Vec<String>, u64)>, StoreError>;

    /// The version (seq of the last membership change) of each named group that exists.
    async fn group_versions(&self, group_ids: &[&str]) -> Result<Vec<(String, u64)>, StoreError>;

    /// A group for operators, listing at most `limit` members and bans.
    async fn group_info(&self, group_id: &str, limit: u32)
        -> Result<Option<GroupInfo>, StoreError>;

    /// Records that the user's tokens issued at or before `at` (unix seconds) are refused.
    async fn revoke(&self, user_id: &str, at: i64) -> Result<(), StoreError>;

    /// Every recorded revocation: (user, revoked_at).
    async fn revocations(&self) -> Result<Vec<(String, i64)>, StoreError>;

    /// Messages of all the user's conversations after their stored cursors, where
    /// `cursors` overrides the stored cursor of the conversations it names; ordered by
    /// (conversation_id, seq), at most `limit`; the bool is true when more remain. Group
    /// messages are only those inside the user's membership intervals.
    async fn sync(
        &self,
        user_id: &str,
        cursors: &[(String, u64)],
        limit: u32,
    ) -> Result<(Vec<StoredMessage>, bool), StoreError> {
        self.sync_page(user_id, cursors, limit, usize::MAX).await
    }

    /// As [`Store::sync`], and the page also stops before its messages pass
    /// `max_bytes` ([`message_bytes`] each; the first message always goes in, however
    /// large). Rows are streamed, so a page never holds much more than that in memory.
    async fn sync_page(
        &self,
        user_id: &str,
        cursors: &[(String, u64)],
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<StoredMessage>, bool), StoreError>;

    /// The last seq of a conversation, or `None` when it does not exist.
    async fn last_seq(&self, conversation_id: &str) -> Result<Option<u64>, StoreError>;

    /// The stored cursor of a user in a conversation (0 when none).
    async fn cursor(&self, user_id: &str, conversation_id: &str) -> Result<u64, StoreError>;

    /// Cheap readiness probe.
    async fn ping(&self) -> Result<(), StoreError>;

    /// A small durable write (one row rewritten and committed), which fails as a message
    /// commit would: the writer's way to learn that a failing store works again.
    async fn probe_write(&self) -> Result<(), StoreError>;

    /// Backend name for logs and the admin API.
    fn backend(&self) -> &'static str;

    /// Of `candidates`, those who share a conversation with `user_id`: a one-to-one
    /// conversation between them exists, or both are members of a group (presence).
    async fn presence_peers(
        &self,
        user_id: &str,
        candidates: &[&str],
    ) -> Result<Vec<String>, StoreError>;

    /// Of `users`, those who hide their presence (`SetPresence`).
    async fn presence_hidden(&self, users: &[&str]) -> Result<Vec<String>, StoreError>;

    /// Records whether `user_id` hides their presence (the persistence writer only).
    async fn set_presence_hidden(&self, user_id: &str, hidden: bool) -> Result<(), StoreError>;
}

/// How long the store may take before it counts as not answering.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Waiting for a pooled connection (`store.acquire_timeout_ms`).
    pub acquire: std::time::Duration,
    /// One statement, Postgres only (`store.statement_timeout_ms`; 0: none).
    pub statement: std::time::Duration,
}

impl Timeouts {
    /// The configured timeouts.
    pub fn of(c: &crate::config::StoreConfig) -> Self {
        Timeouts {
            acquire: std::time::Duration::from_millis(c.acquire_timeout_ms.into()),
            statement: std::time::Duration::from_millis(c.statement_timeout_ms.into()),
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts::of(&crate::config::StoreConfig::default())
    }
}

/// Opens the store the config selects, creating the data dir and running migrations.
pub async fn open(config: &Config) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match config.database()? {
        Database::Sqlite(path) => Arc::new(
            SqliteStore::open_timed(
                &path,
                config.store.sqlite_synchronous == "full",
                config.store.pool_size,
                Timeouts::of(&config.store),
            )
            .await?,
        ),
        Database::Postgres(url) => Arc::new(
            PgStore::connect_timed(&url, config.store.pool_size, Timeouts::of(&config.store))
                .await?,
        ),
    })
}
