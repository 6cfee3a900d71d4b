//! Store: durable state behind one trait, with SQLite (embedded default) and Postgres
//! implementations. It owns the schema (`migrations/<db>`), seq allocation, dedup by
//! (sender, client_msg_id), cursors, groups and sync queries. Only the persistence
//! writer (`pipeline::persist`) calls the write methods; readers call the rest.

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

/// A group membership change.
#[derive(Debug, Clone)]
pub enum GroupChange {
    /// Create the group with the creator and these members.
    Create {
        /// Creator, always a member.
        creator: String,
        /// Other initial members.
        members: Vec<String>,
    },
    /// Add these users.
    Join(Vec<String>),
    /// Remove this user.
    Leave(String),
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

    /// Applies a group change and returns the member list after it.
    async fn group_change(
        &self,
        group_id: &str,
        change: &GroupChange,
        max_members: u32,
    ) -> Result<Vec<String>, StoreError>;

    /// Members of a group, or `None` when it does not exist.
    async fn group_members(&self, group_id: &str) -> Result<Option<Vec<String>>, StoreError>;

    /// Messages of all the user's conversations after their stored cursors, where
    /// `cursors` overrides the stored cursor of the conversations it names; ordered by
    /// (conversation_id, seq), at most `limit`; the bool is true when more remain.
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
