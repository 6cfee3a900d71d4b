//! Store: durable state behind one trait, with SQLite (embedded default) and Postgres
//! implementations. It owns the schema (`migrations/<db>`), seq allocation, dedup by
//! (sender, conversation, client_msg_id), cursors, groups (roles, bans, membership
//! intervals, the decision of who may change what), revocations and sync queries, which
//! clamp every group read to the reader's membership intervals. Only the persistence
//! writer (`persist`) calls the write methods, but one: the admin revoke writes its row
//! itself (`Store::revoke`), so that an operator stopping an account is answered even
//! while the writer's queue is full, and a revocation orders with nothing the writer
//! commits. Readers call the rest.

pub mod access;
pub mod backup;
mod batch;
pub mod health;
pub mod homes;
pub mod membership;
pub mod outbox;
mod postgres;
mod postgres_commit;
pub mod repl;
pub mod repl_cursors;
mod sql;
mod sqlite;
mod sqlite_checkpoint;
mod sqlite_commit;
mod sqlite_outbox;

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
    /// The SQLite commit thread's connection failed (`store::sqlite_commit`).
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The SQLite commit thread is gone.
    #[error("the store's commit thread is gone")]
    WriterGone,
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
    /// RECALL and EDIT events: the message they change. The commit applies the change
    /// to that row (state, payload, edit time) in the same transaction.
    /// (Boxed: events are rare, and a Send's queue entry stays small.)
    pub reference: Option<Box<MessageRef>>,
    /// The message is traced (`obs::trace`): in multi-region mode its replication
    /// outbox row is marked, so its record carries the trace to the other regions.
    pub traced: bool,
}

/// The message a RECALL or EDIT event changes: its primary key's seq and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRef {
    /// Its seq in the event's conversation.
    pub seq: u64,
    /// Its msg_id.
    pub msg_id: String,
}

/// What a recall or edit needs to know of the message it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageMeta {
    /// Who sent it.
    pub sender: String,
    /// `MessageType` as its wire value.
    pub msg_type: i32,
    /// Its id.
    pub msg_id: String,
    /// `MessageState` as stored (ORIGINAL, EDITED or RECALLED).
    pub state: i32,
    /// When it was sent, ms.
    pub send_time: i64,
}

/// A user's message deleted for themselves (DeleteForMe).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HiddenMessage {
    /// The user it is hidden for (all their devices).
    pub user_id: String,
    /// Its conversation.
    pub conversation_id: String,
    /// Its seq.
    pub seq: u64,
}

/// One `messages` row as read, before [`render_message`] makes it what a reader gets.
#[derive(Debug, Clone, Default)]
pub struct MessageRow {
    /// Conversation id.
    pub conversation_id: String,
    /// Sender ('' for SYSTEM).
    pub sender: String,
    /// Stored payload (the latest edit's for an edited message).
    pub payload: Vec<u8>,
    /// Commit time, ms.
    pub send_time: i64,
    /// `MessageType` as its wire value.
    pub msg_type: i32,
    /// Per-conversation seq.
    pub seq: i64,
    /// Message id.
    pub msg_id: String,
    /// Client idempotency key, when one was given.
    pub client_msg_id: Option<String>,
    /// RECALL and EDIT events: the seq of the message they change (0: none).
    pub ref_seq: i64,
    /// RECALL and EDIT events: the id of the message they change.
    pub ref_msg_id: Option<String>,
    /// Stored `MessageState` (0 original, 1 edited, 2 recalled).
    pub state: i32,
    /// When it was last edited, ms (0: never).
    pub edit_time: i64,
}

/// The wire message for one stored row as sync and history return it, for one reader:
/// `hidden` (the reader deleted it for themselves, or it is an EDIT of such a message)
/// is a HIDDEN tombstone at its seq with no payload; a recalled one is RECALLED with no
/// payload; an edited one is EDITED with its latest payload and edit time. Seqs stay
/// gapless either way.
pub fn render_message(r: MessageRow, hidden: bool) -> StoredMessage {
    use im_proto::MessageState;
    let state = match MessageState::try_from(r.state) {
        _ if hidden => MessageState::Hidden,
        Ok(MessageState::Recalled) => MessageState::Recalled,
        Ok(MessageState::Edited) => MessageState::Edited,
        _ => MessageState::Original,
    };
    let (payload, edit_time) = match state {
        MessageState::Hidden | MessageState::Recalled => (Bytes::new(), 0),
        MessageState::Edited => (r.payload.into(), r.edit_time),
        MessageState::Original => (r.payload.into(), 0),
    };
    im_proto::ChatMessage {
        conversation_id: r.conversation_id,
        sender: r.sender,
        payload,
        send_time: r.send_time,
        r#type: r.msg_type,
        seq: r.seq.max(0) as u64,
        msg_id: r.msg_id,
        client_msg_id: r.client_msg_id.unwrap_or_default(),
        ref_seq: r.ref_seq.max(0) as u64,
        ref_msg_id: r.ref_msg_id.unwrap_or_default(),
        state: state as i32,
        edit_time,
    }
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

/// A delivered-up-to cursor to save (kept only if it moves forward): the device's, and
/// the user's (the furthest of their devices, [`Store::cursor`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorUpdate {
    /// The user.
    pub user_id: String,
    /// The user's device (`Login.device_id`; `"default"` when the client gave none).
    pub device_id: String,
    /// The conversation.
    pub conversation_id: String,
    /// Everything up to this seq was delivered.
    pub seq: u64,
}

/// A read cursor to save (MarkRead; kept only if it moves forward): the user's
/// `conversation_state.read_seq` and this device's `device_cursors.read_seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadUpdate {
    /// The reader.
    pub user_id: String,
    /// The reader's device.
    pub device_id: String,
    /// The conversation.
    pub conversation_id: String,
    /// Everything up to this seq was read.
    pub seq: u64,
}

/// A user's read cursor that moved forward in [`Store::commit_state`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadMoved {
    /// The reader.
    pub user_id: String,
    /// The conversation.
    pub conversation_id: String,
    /// The new read seq.
    pub seq: u64,
    /// When it moved, ms.
    pub read_time: i64,
}

/// A user's flags on a conversation (SetConversationFlags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagsUpdate {
    /// The user.
    pub user_id: String,
    /// The conversation.
    pub conversation_id: String,
    /// Muted.
    pub muted: bool,
    /// Pinned (listed first).
    pub pinned: bool,
}

/// Where a conversation list page starts: after this (pinned, last_time,
/// conversation_id) in the list's order (pinned first, latest activity first, then id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListAfter {
    /// The previous page's last entry was pinned.
    pub pinned: bool,
    /// Its last activity, ms.
    pub last_time: i64,
    /// Its conversation id.
    pub conversation_id: String,
}

/// Most unread messages counted per conversation in a list (the count stops there).
pub const UNREAD_CAP: u32 = 9999;

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
        + m.ref_msg_id.len()
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

    /// The user's delivered cursor in a conversation: the furthest of their devices'
    /// (0 when none).
    async fn cursor(&self, user_id: &str, conversation_id: &str) -> Result<u64, StoreError>;

    /// Cheap readiness probe.
    async fn ping(&self) -> Result<(), StoreError>;

    /// A small durable write (one row rewritten and committed), which fails as a message
    /// commit would: the writer's way to learn that a failing store works again.
    async fn probe_write(&self) -> Result<(), StoreError>;

    /// Backend name for logs and the admin API.
    fn backend(&self) -> &'static str;

    /// Whether two write transactions run side by side (Postgres) rather than one at a
    /// time (SQLite): the writer then commits delivery cursors beside the messages.
    fn commits_side_by_side(&self) -> bool {
        false
    }

    /// As [`Store::sync_page`] for one device of the user: the stored cursors are the
    /// device's delivered cursors (a conversation the device has none of reads from the
    /// start of what the user may see).
    async fn sync_device(
        &self,
        user_id: &str,
        device_id: &str,
        cursors: &[(String, u64)],
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<StoredMessage>, bool), StoreError> {
        // Every conversation of the user gets an explicit cursor (the device's, 0
        // without one), which overrides the user's stored cursor; the request's own
        // cursors win over both.
        let stored = self.device_delivered(user_id, device_id).await?;
        let given: std::collections::HashSet<&str> =
            cursors.iter().map(|(c, _)| c.as_str()).collect();
        let mut all: Vec<(String, u64)> = cursors.to_vec();
        all.extend(
            stored
                .into_iter()
                .filter(|(c, _)| !given.contains(c.as_str())),
        );
        self.sync_page(user_id, &all, limit, max_bytes).await
    }

    /// The device's delivered cursor in each of the user's conversations (one-to-one
    /// and current groups), 0 where it has none.
    async fn device_delivered(
        &self,
        user_id: &str,
        device_id: &str,
    ) -> Result<Vec<(String, u64)>, StoreError>;

    /// Messages of one conversation before `before_seq` (0: from the end), newest
    /// first, at most `limit` and stopping before `max_bytes` (as [`Store::sync_page`];
    /// the first message always goes in), rendered for `user_id` ([`render_message`]).
    /// A group is read only inside the user's membership intervals, newest first; the
    /// bool is true when older messages the user may read remain. The caller checks
    /// that the user may read the conversation at all.
    async fn history_page(
        &self,
        user_id: &str,
        conversation_id: &str,
        before_seq: u64,
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<StoredMessage>, bool), StoreError>;

    /// Commits read cursors (forward only: the user's and the device's) and flags in one
    /// transaction; returns the user read cursors that moved.
    async fn commit_state(
        &self,
        reads: &[ReadUpdate],
        flags: &[FlagsUpdate],
    ) -> Result<Vec<ReadMoved>, StoreError>;

    /// A page of the user's conversations (direct ones and current groups): pinned
    /// first, then latest activity, then id; at most `limit`, after `after`. Each
    /// summary's last message payload is cut to `preview_bytes`; unread counts at most
    /// [`UNREAD_CAP`] TEXT, IMAGE and FILE messages of others after the read cursor
    /// (groups: inside the current membership). The second value is the next page's
    /// start, `None` on the last page.
    async fn list_conversations(
        &self,
        user_id: &str,
        after: Option<&ListAfter>,
        limit: u32,
        preview_bytes: usize,
    ) -> Result<(Vec<im_proto::ConversationSummary>, Option<ListAfter>), StoreError>;

    /// How many users have read the conversation up to `seq` or past it (one indexed
    /// count), and the sender of the message at `seq` ("" when none).
    async fn read_count(
        &self,
        conversation_id: &str,
        seq: u64,
    ) -> Result<(u32, String), StoreError>;

    /// A device's (delivered, read) cursors in a conversation (0 when none).
    async fn device_cursor(
        &self,
        user_id: &str,
        device_id: &str,
        conversation_id: &str,
    ) -> Result<(u64, u64), StoreError>;
    /// The message at (conversation, seq) as a recall or edit sees it, or `None` when
    /// there is none or `reader` may not read it (a group seq outside their intervals).
    async fn message_meta(
        &self,
        reader: &str,
        conversation_id: &str,
        seq: u64,
    ) -> Result<Option<MessageMeta>, StoreError>;

    /// A user's role in a group (`group_op::Role` as its wire value), `None` for a
    /// non-member.
    async fn group_role(&self, group_id: &str, user_id: &str) -> Result<Option<i32>, StoreError>;

    /// The seq and id of the message `sender` committed in the conversation with this
    /// client_msg_id, if any (a retried recall or edit is answered as a duplicate).
    async fn find_client_msg(
        &self,
        conversation_id: &str,
        sender: &str,
        client_msg_id: &str,
    ) -> Result<Option<(u64, String)>, StoreError>;

    /// Records messages as deleted for their users (DeleteForMe), in one transaction;
    /// hiding one twice is a no-op.
    async fn hide_messages(&self, hidden: &[HiddenMessage]) -> Result<(), StoreError>;
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

    /// The conversations of `user_id` (one-to-one and current groups) with unread
    /// messages, largest backlog first, at most `limit`: the user's cursor (the furthest
    /// of their delivered cursor and read position, so their own messages count as
    /// read) against the conversation's last seq. Each row is a primary-key or index
    /// probe from the user's memberships (the admin API's per-user diagnosis).
    async fn user_backlog(&self, user_id: &str, limit: u32)
        -> Result<Vec<UserBacklog>, StoreError>;

    /// Whether later message commits write webhook outbox rows (`store::outbox`).
    fn set_webhook_outbox(&self, on: bool);

    /// Claims up to `limit` committed messages of the outbox for `lease_ms` (rows whose
    /// lease ran out included), oldest first, with what their events say.
    async fn outbox_claim(
        &self,
        owner: &str,
        lease_ms: i64,
        limit: u32,
    ) -> Result<Vec<outbox::OutboxSource>, StoreError>;

    /// In one transaction: stores `events`, applies `merges` (to rows never tried),
    /// and deletes the expanded outbox rows `done`. Returns the row id of each event,
    /// in order.
    async fn outbox_expand(
        &self,
        done: &[i64],
        events: &[outbox::NewEvent],
        merges: &[outbox::Merge],
    ) -> Result<Vec<i64>, StoreError>;

    /// Claims up to `limit` due events of `endpoint` for `lease_ms`, oldest first.
    async fn events_claim(
        &self,
        endpoint: &str,
        owner: &str,
        lease_ms: i64,
        limit: u32,
    ) -> Result<Vec<outbox::Claimed>, StoreError>;

    /// Records attempts' outcomes in one transaction.
    async fn events_settle(&self, outcomes: &[outbox::Outcome]) -> Result<(), StoreError>;

    /// Parked events, oldest first, of one endpoint ("": all), at most `limit`.
    async fn events_parked(
        &self,
        endpoint: &str,
        limit: u32,
    ) -> Result<Vec<outbox::ParkedRow>, StoreError>;

    /// Queues parked events again (of one endpoint, "": all; `ids` empty: every one).
    async fn events_redeliver(&self, endpoint: &str, ids: &[i64]) -> Result<u64, StoreError>;

    /// Each named user's read position in the conversation (users without one are
    /// left out): what a `message.offline` event's unread count is computed from.
    async fn read_positions(
        &self,
        conversation_id: &str,
        users: &[&str],
    ) -> Result<Vec<(String, u64)>, StoreError>;

    /// How much the outbox holds.
    async fn outbox_counts(&self) -> Result<outbox::OutboxCounts, StoreError>;

    /// Multi-region replication's side of the store (`store::repl`): `None` but on
    /// Postgres.
    fn replication(&self) -> Option<&dyn repl::Replication> {
        None
    }

    /// Home moves' side of the store (`store::homes`): `None` but on Postgres.
    fn homes(&self) -> Option<&dyn homes::HomeStore> {
        None
    }
}

/// One conversation's unread backlog for a user ([`Store::user_backlog`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserBacklog {
    /// The conversation.
    pub conversation_id: String,
    /// The user's cursor in it (0: nothing delivered or read).
    pub cursor: u64,
    /// Its last seq.
    pub last_seq: u64,
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
    let store: Arc<dyn Store> = match config.database()? {
        Database::Sqlite(path) => Arc::new({
            sqlite::limit_memory(config.store.sqlite_memory_mib);
            SqliteStore::open_exclusive(
                &path,
                config.store.sqlite_synchronous == "full",
                config.store.pool_size,
                Timeouts::of(&config.store),
            )
            .await?
        }),
        Database::Postgres(url) => Arc::new(
            PgStore::connect_timed(&url, config.store.pool_size, Timeouts::of(&config.store))
                .await?,
        ),
    };
    store.set_webhook_outbox(config.webhooks.wants_messages());
    // Multi-region mode: every home commit writes its replication outbox row from the
    // first one on (`store::repl`).
    if let (false, Some(r)) = (config.region.is_empty(), store.replication()) {
        r.set_region_outbox(true);
    }
    Ok(store)
}
