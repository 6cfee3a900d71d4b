//! The SQL both backends share. SQLite (3.35+) and Postgres accept the same statements
//! here (`$N` parameters, multi-row `ON CONFLICT ... DO UPDATE ... RETURNING`,
//! `WITH k AS (VALUES ...)`), so each query is written once, as a function generic over
//! the sqlx [`Database`]; [`Backend`] is what a store gives them (its pools, its checked
//! writer connection, its batch commit), and one generic `impl Store` wires the trait's
//! methods to the files by concern:
//! - `groups`: group changes (the transaction around `store::access`) and group reads;
//! - `conversations`: the conversation list and the per-user backlog;
//! - `history`: sync and history pages, the messages a recall or edit names, hiding;
//! - `webhooks`: the webhook outbox (`store::outbox`): claims with a lease (Postgres) or
//!   plain reads (SQLite), expansion, attempts' outcomes, the parked list;
//! - `inflight`: SQLite's in-memory claims of outbox rows;
//! - `users`: per-user state: read state and flags, the delivered and read cursors,
//!   revocations, presence settings and peers; and the probes.
//!
//! The message batch commit is each engine's own: `store::sqlite_commit` (a thread with
//! rusqlite) and `store::postgres_commit`.

mod conversations;
mod groups;
mod history;
mod inflight;
mod users;
pub(crate) mod webhooks;

use std::future::Future;

pub(crate) use inflight::InFlight;
use std::marker::PhantomData;

use sqlx::error::BoxDynError;
use sqlx::pool::PoolConnection;
use sqlx::{
    Arguments, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type,
};

use super::outbox::{
    Claimed, Merge, NewEvent, OutboxCounts, OutboxSource, OutboxWrite, Outcome, ParkedRow,
};
use super::{
    Committed, CursorUpdate, FlagsUpdate, GroupInfo, GroupOutcome, GroupRequest, HiddenMessage,
    ListAfter, MessageMeta, MessageRow, NewMessage, ReadMoved, ReadUpdate, Store, StoreError,
    StoredMessage, UserBacklog,
};

/// Rows per multi-row statement (8 binds each stays far below both backends' limits).
pub(crate) const CHUNK: usize = 500;

/// The columns of a `messages` row (aliased `m`) that [`rendered`] reads, in its order,
/// with `hidden`: whether the reader (the statement's `$5`) deleted it for themselves,
/// or it is an EDIT event of a message they deleted. One primary-key probe of
/// `hidden_messages`.
pub(crate) const MESSAGE_COLUMNS: &str = "m.conversation_id AS conversation_id, \
     m.sender AS sender, m.payload AS payload, m.send_time AS send_time, \
     m.msg_type AS msg_type, m.seq AS seq, m.msg_id AS msg_id, \
     m.client_msg_id AS client_msg_id, m.ref_seq AS ref_seq, m.ref_msg_id AS ref_msg_id, \
     m.state AS state, m.edit_time AS edit_time, CASE WHEN EXISTS (SELECT 1 FROM hidden_messages h \
     WHERE h.user_id = $5 AND h.conversation_id = m.conversation_id \
     AND h.seq IN (m.seq, CASE WHEN m.msg_type = 5 THEN m.ref_seq ELSE 0 END)) \
     THEN 1 ELSE 0 END AS hidden";

/// A column type the shared SQL binds and reads on engine `DB`.
pub(crate) trait Col<DB: Database>:
    Type<DB> + for<'r> Decode<'r, DB> + for<'q> Encode<'q, DB> + Send
{
}

impl<DB: Database, T> Col<DB> for T where
    T: Type<DB> + for<'r> Decode<'r, DB> + for<'q> Encode<'q, DB> + Send
{
}

/// A borrowed value the shared SQL binds on engine `DB` (`&str`, `&[u8]`).
pub(crate) trait Bind<'q, DB: Database>: Encode<'q, DB> + Type<DB> + Send + 'q {}

impl<'q, DB: Database, T> Bind<'q, DB> for T where T: Encode<'q, DB> + Type<DB> + Send + 'q {}

/// What a store gives the shared SQL: its engine, its pools and its batch commit.
pub(crate) trait Backend: Send + Sync + 'static {
    /// The sqlx engine.
    type DB: Database;
    /// Backend name for logs and the admin API.
    const NAME: &'static str;

    /// The pool reads run on.
    fn read(&self) -> &Pool<Self::DB>;

    /// A connection for a write, checked to be outside any transaction.
    fn writer(&self) -> impl Future<Output = Result<PoolConnection<Self::DB>, StoreError>> + Send;

    /// Commits one batch of messages and delivery cursors ([`Store::commit_batch`]).
    fn commit(
        &self,
        messages: &[NewMessage],
        cursors: &[CursorUpdate],
    ) -> impl Future<Output = Result<Vec<Committed>, StoreError>> + Send;

    /// Whether later batch commits write webhook outbox rows.
    fn set_outbox(&self, on: bool);

    /// Whether commits write webhook outbox rows now.
    fn outbox_on(&self) -> bool;

    /// The webhook outbox's own pool (opened lazily, so a node without webhooks holds
    /// no connection for it): its traffic never waits for, nor holds, a connection the
    /// message path's writes use.
    fn outbox_pool(&self) -> &Pool<Self::DB>;

    /// Whether commits write replication outbox rows now (`store::repl`; Postgres only).
    fn region_outbox_on(&self) -> bool {
        false
    }

    /// The replication side of the store (`store::repl`): Postgres only.
    fn replication(&self) -> Option<&dyn super::repl::Replication> {
        None
    }

    /// The home moves' side of the store (`store::homes`): Postgres only.
    fn homes(&self) -> Option<&dyn super::homes::HomeStore> {
        None
    }

    /// Whether write transactions run side by side ([`Store::commits_side_by_side`]).
    const SIDE_BY_SIDE: bool = false;

    /// The row-lock suffix of a claim's inner select (Postgres: `FOR UPDATE SKIP
    /// LOCKED`; SQLite, one writer: none).
    const CLAIM_LOCK: &'static str = "";

    /// The outbox rows claimed in memory, on a single-node store whose claims are plain
    /// reads (SQLite); `None`: claims take leases in the database (Postgres).
    fn in_flight(&self) -> Option<&InFlight> {
        None
    }

    /// Runs an outbox write beside the message commits, in their transactions (SQLite:
    /// on its commit thread, `store::sqlite_outbox`); `None`: the backend runs it on the
    /// outbox pool (Postgres, whose writers do not exclude each other).
    fn outbox_write(
        &self,
        write: OutboxWrite,
    ) -> Option<impl Future<Output = Result<Vec<i64>, StoreError>> + Send> {
        let _ = write;
        None::<std::future::Ready<Result<Vec<i64>, StoreError>>>
    }
}

/// A claim's lease: (owner, end). The owner is the node's name and a number unique in
/// this process, so one claim's rows are found by it; the end is `lease_ms` from now.
fn lease(owner: &str, lease_ms: i64) -> (String, i64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CLAIMS: AtomicU64 = AtomicU64::new(0);
    let n = CLAIMS.fetch_add(1, Ordering::Relaxed);
    (format!("{owner}/{n}"), im_proto::now_ms() + lease_ms)
}

/// The shared SQL over engine `DB`, as associated functions in one `impl` block per
/// concern file (each states the bounds on `DB` its statements need).
pub(crate) struct Sql<DB>(PhantomData<DB>);

/// A statement built from SQL fragments and bound values, to the same text as sqlx's
/// `QueryBuilder` (the engine's own placeholders), whose text and arguments are taken
/// out to run: `let (sql, args) = st.finish()?;` then `sqlx::query_with(&sql, args)`.
/// (A `QueryBuilder`'s query cannot run in code generic over the engine: it borrows
/// the builder for the arguments' lifetime, which the builder's own drop outlives.)
pub(crate) struct Statement<'a, DB: Database> {
    sql: String,
    args: DB::Arguments<'a>,
    error: Option<BoxDynError>,
}

impl<'a, DB: Database> Statement<'a, DB> {
    /// A statement starting with `init`.
    pub(crate) fn new(init: &str) -> Self {
        Statement {
            sql: init.to_owned(),
            args: Default::default(),
            error: None,
        }
    }

    /// Appends SQL text.
    pub(crate) fn push(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }

    /// Appends a placeholder bound to `value` (an encoding error comes out of
    /// [`Statement::finish`]).
    pub(crate) fn push_bind<T>(&mut self, value: T) -> &mut Self
    where
        T: 'a + Encode<'a, DB> + Type<DB>,
    {
        if let Err(e) = self.args.add(value) {
            self.error.get_or_insert(e);
        }
        let _ = self.args.format_placeholder(&mut self.sql);
        self
    }

    /// Appends `VALUES (..), (..)`, one tuple per row, whose values `tuple` binds.
    pub(crate) fn push_values<I: IntoIterator>(
        &mut self,
        rows: I,
        mut tuple: impl FnMut(&mut Tuple<'_, 'a, DB>, I::Item),
    ) -> &mut Self {
        self.push("VALUES ");
        for (i, row) in rows.into_iter().enumerate() {
            self.push(if i == 0 { "(" } else { ", (" });
            tuple(
                &mut Tuple {
                    statement: self,
                    first: true,
                },
                row,
            );
            self.push(")");
        }
        self
    }

    /// Binds `items` as a comma-separated list.
    pub(crate) fn push_list<T>(&mut self, items: impl IntoIterator<Item = T>) -> &mut Self
    where
        T: 'a + Encode<'a, DB> + Type<DB>,
    {
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.push_bind(item);
        }
        self
    }

    /// The text and the arguments, or the first value that failed to encode.
    pub(crate) fn finish(self) -> Result<(String, DB::Arguments<'a>), sqlx::Error> {
        match self.error {
            Some(e) => Err(sqlx::Error::Encode(e)),
            None => Ok((self.sql, self.args)),
        }
    }
}

/// One row of [`Statement::push_values`]: its values, comma-separated.
pub(crate) struct Tuple<'s, 'a, DB: Database> {
    statement: &'s mut Statement<'a, DB>,
    first: bool,
}

impl<'a, DB: Database> Tuple<'_, 'a, DB> {
    /// Appends the next value of the row.
    pub(crate) fn push_bind<T>(&mut self, value: T) -> &mut Self
    where
        T: 'a + Encode<'a, DB> + Type<DB>,
    {
        if !self.first {
            self.statement.push(", ");
        }
        self.first = false;
        self.statement.push_bind(value);
        self
    }
}

/// Begins a write transaction on `conn`: on SQLite `BEGIN IMMEDIATE`, which takes the
/// write lock at once (waiting out the busy timeout). A deferred transaction that reads
/// first cannot take the lock after another connection (the commit thread, the webhook
/// outbox's) committed meanwhile: SQLite fails it at once with SQLITE_BUSY. Postgres:
/// `BEGIN`.
pub(crate) async fn begin_write<DB: Database>(
    conn: &mut DB::Connection,
) -> Result<sqlx::Transaction<'_, DB>, sqlx::Error> {
    if DB::NAME == "SQLite" {
        sqlx::Connection::begin_with(conn, "BEGIN IMMEDIATE").await
    } else {
        sqlx::Connection::begin(conn).await
    }
}

/// After a write on a connection from [`Backend::writer`]: a failed write leaves the
/// connection's state in doubt, so it is closed (its open transaction, if any, rolls
/// back) rather than returned to the pool, and the next write opens a new one.
pub(crate) async fn settle<DB: Database, T>(
    conn: PoolConnection<DB>,
    out: Result<T, StoreError>,
) -> Result<T, StoreError> {
    if out.is_err() {
        metrics::counter!("im_store_connection_resets_total").increment(1);
        let _ = conn.close().await;
    }
    out
}

/// A row selected with [`MESSAGE_COLUMNS`], rendered for its reader.
pub(crate) fn rendered<R: Row>(r: &R) -> Result<StoredMessage, sqlx::Error>
where
    usize: ColumnIndex<R>,
    i64: Col<R::Database>,
    i32: Col<R::Database>,
    String: Col<R::Database>,
    Vec<u8>: Col<R::Database>,
{
    let hidden: i32 = r.try_get(12)?;
    let row = MessageRow {
        conversation_id: r.try_get(0)?,
        sender: r.try_get(1)?,
        payload: r.try_get(2)?,
        send_time: r.try_get(3)?,
        msg_type: r.try_get(4)?,
        seq: r.try_get(5)?,
        msg_id: r.try_get(6)?,
        client_msg_id: r.try_get(7)?,
        ref_seq: r.try_get(8)?,
        ref_msg_id: r.try_get(9)?,
        state: r.try_get(10)?,
        edit_time: r.try_get(11)?,
    };
    Ok(super::render_message(row, hidden != 0))
}

#[async_trait::async_trait]
impl<S, DB> Store for S
where
    S: Backend<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    i64: Col<DB>,
    i32: Col<DB>,
    String: Col<DB>,
    Vec<u8>: Col<DB>,
    for<'q> &'q str: Bind<'q, DB>,
    for<'q> &'q [u8]: Bind<'q, DB>,
{
    async fn commit_batch(
        &self,
        messages: &[NewMessage],
        cursors: &[CursorUpdate],
    ) -> Result<Vec<Committed>, StoreError> {
        self.commit(messages, cursors).await
    }

    async fn group_change(
        &self,
        group_id: &str,
        req: &GroupRequest,
    ) -> Result<GroupOutcome, StoreError> {
        let mut conn = self.writer().await?;
        let (outbox, region) = (self.outbox_on(), self.region_outbox_on());
        let out = Sql::<DB>::group_change(&mut conn, group_id, req, outbox, region).await;
        settle(conn, out).await
    }

    async fn group_members(
        &self,
        group_id: &str,
    ) -> Result<Option<(Vec<String>, u64)>, StoreError> {
        Sql::<DB>::group_members(self.read(), group_id).await
    }

    async fn group_versions(&self, group_ids: &[&str]) -> Result<Vec<(String, u64)>, StoreError> {
        Sql::<DB>::group_versions(self.read(), group_ids).await
    }

    async fn group_info(
        &self,
        group_id: &str,
        limit: u32,
    ) -> Result<Option<GroupInfo>, StoreError> {
        Sql::<DB>::group_info(self.read(), group_id, limit).await
    }

    async fn revoke(&self, user_id: &str, at: i64) -> Result<(), StoreError> {
        let mut conn = self.writer().await?;
        let out = Sql::<DB>::revoke(&mut conn, user_id, at).await;
        settle(conn, out).await
    }

    async fn revocations(&self) -> Result<Vec<(String, i64)>, StoreError> {
        Sql::<DB>::revocations(self.read()).await
    }

    async fn sync_page(
        &self,
        user_id: &str,
        cursors: &[(String, u64)],
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<StoredMessage>, bool), StoreError> {
        let page = history::Page { limit, max_bytes };
        Sql::<DB>::sync_page(self.read(), user_id, cursors, page).await
    }

    async fn last_seq(&self, conversation_id: &str) -> Result<Option<u64>, StoreError> {
        Sql::<DB>::last_seq(self.read(), conversation_id).await
    }

    async fn cursor(&self, user_id: &str, conversation_id: &str) -> Result<u64, StoreError> {
        Sql::<DB>::cursor(self.read(), user_id, conversation_id).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Sql::<DB>::ping(self.read()).await
    }

    async fn probe_write(&self) -> Result<(), StoreError> {
        let mut conn = self.writer().await?;
        let out = Sql::<DB>::probe_write(&mut conn).await;
        settle(conn, out).await
    }

    fn backend(&self) -> &'static str {
        S::NAME
    }

    fn commits_side_by_side(&self) -> bool {
        S::SIDE_BY_SIDE
    }

    async fn device_delivered(
        &self,
        user_id: &str,
        device_id: &str,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        Sql::<DB>::device_delivered(self.read(), user_id, device_id).await
    }

    async fn history_page(
        &self,
        user_id: &str,
        conversation_id: &str,
        before_seq: u64,
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<StoredMessage>, bool), StoreError> {
        let page = history::Page { limit, max_bytes };
        Sql::<DB>::history_page(self.read(), user_id, conversation_id, before_seq, page).await
    }

    async fn commit_state(
        &self,
        reads: &[ReadUpdate],
        flags: &[FlagsUpdate],
    ) -> Result<Vec<ReadMoved>, StoreError> {
        let mut conn = self.writer().await?;
        let region = self.region_outbox_on();
        let out = Sql::<DB>::commit_state(&mut conn, reads, flags, region).await;
        settle(conn, out).await
    }

    async fn list_conversations(
        &self,
        user_id: &str,
        after: Option<&ListAfter>,
        limit: u32,
        preview_bytes: usize,
    ) -> Result<(Vec<im_proto::ConversationSummary>, Option<ListAfter>), StoreError> {
        Sql::<DB>::list_conversations(self.read(), user_id, after, limit, preview_bytes).await
    }

    async fn read_count(
        &self,
        conversation_id: &str,
        seq: u64,
    ) -> Result<(u32, String), StoreError> {
        Sql::<DB>::read_count(self.read(), conversation_id, seq).await
    }

    async fn device_cursor(
        &self,
        user_id: &str,
        device_id: &str,
        conversation_id: &str,
    ) -> Result<(u64, u64), StoreError> {
        Sql::<DB>::device_cursor(self.read(), user_id, device_id, conversation_id).await
    }

    async fn message_meta(
        &self,
        reader: &str,
        conversation_id: &str,
        seq: u64,
    ) -> Result<Option<MessageMeta>, StoreError> {
        Sql::<DB>::message_meta(self.read(), reader, conversation_id, seq).await
    }

    async fn group_role(&self, group_id: &str, user_id: &str) -> Result<Option<i32>, StoreError> {
        Sql::<DB>::group_role(self.read(), group_id, user_id).await
    }

    async fn find_client_msg(
        &self,
        conversation_id: &str,
        sender: &str,
        client_msg_id: &str,
    ) -> Result<Option<(u64, String)>, StoreError> {
        Sql::<DB>::find_client_msg(self.read(), conversation_id, sender, client_msg_id).await
    }

    async fn hide_messages(&self, hidden: &[HiddenMessage]) -> Result<(), StoreError> {
        let mut conn = self.writer().await?;
        let out = Sql::<DB>::hide_messages(&mut conn, hidden).await;
        settle(conn, out).await
    }

    async fn presence_peers(
        &self,
        user_id: &str,
        candidates: &[&str],
    ) -> Result<Vec<String>, StoreError> {
        Sql::<DB>::presence_peers(self.read(), user_id, candidates).await
    }

    async fn presence_hidden(&self, users: &[&str]) -> Result<Vec<String>, StoreError> {
        Sql::<DB>::presence_hidden(self.read(), users).await
    }

    async fn set_presence_hidden(&self, user_id: &str, hidden: bool) -> Result<(), StoreError> {
        let mut conn = self.writer().await?;
        let out = Sql::<DB>::set_presence_hidden(&mut conn, user_id, hidden).await;
        settle(conn, out).await
    }

    async fn user_backlog(
        &self,
        user_id: &str,
        limit: u32,
    ) -> Result<Vec<UserBacklog>, StoreError> {
        Sql::<DB>::user_backlog(self.read(), user_id, limit).await
    }

    fn set_webhook_outbox(&self, on: bool) {
        self.set_outbox(on);
    }

    async fn outbox_claim(
        &self,
        owner: &str,
        lease_ms: i64,
        limit: u32,
    ) -> Result<Vec<OutboxSource>, StoreError> {
        let mut conn = self.outbox_pool().acquire().await?;
        let (owner, until) = lease(owner, lease_ms);
        if let Some(f) = self.in_flight() {
            let Some((excluded, started)) = f.sources.begin() else {
                return Ok(Vec::new());
            };
            let out = Sql::<DB>::outbox_read(&mut conn, &excluded, limit).await;
            let rows = settle(conn, out).await?;
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            let taken = f.sources.claim(&ids, until, started);
            return Ok(rows
                .into_iter()
                .zip(taken)
                .filter_map(|(r, t)| t.then_some(r))
                .collect());
        }
        let out = Sql::<DB>::outbox_claim(&mut conn, S::CLAIM_LOCK, &owner, until, limit).await;
        settle(conn, out).await
    }

    async fn outbox_expand(
        &self,
        done: &[i64],
        events: &[NewEvent],
        merges: &[Merge],
    ) -> Result<Vec<i64>, StoreError> {
        let Some(f) = self.in_flight() else {
            let mut conn = self.outbox_pool().acquire().await?;
            let out = Sql::<DB>::outbox_expand(&mut conn, done, events, merges).await;
            return settle(conn, out).await;
        };
        // A merge only changes an event no sender holds (as the lease check does).
        let ids: Vec<i64> = merges.iter().map(|m| m.id).collect();
        let free = f.events.reserve(&ids);
        let merges: Vec<Merge> = merges
            .iter()
            .zip(&free)
            .filter(|(_, ok)| **ok)
            .map(|(m, _)| m.clone())
            .collect();
        let write = OutboxWrite::Expand {
            done: done.to_vec(),
            events: events.to_vec(),
            merges: merges.clone(),
        };
        let out = match self.outbox_write(write) {
            Some(ride) => ride.await,
            None => {
                let mut conn = self.outbox_pool().acquire().await?;
                let out = Sql::<DB>::outbox_expand(&mut conn, done, events, &merges).await;
                settle(conn, out).await
            }
        };
        f.events.settled(merges.iter().map(|m| m.id));
        f.sources.settled(done.iter().copied());
        out
    }

    async fn events_claim(
        &self,
        endpoint: &str,
        owner: &str,
        lease_ms: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut conn = self.outbox_pool().acquire().await?;
        let (owner, until) = lease(owner, lease_ms);
        if let Some(f) = self.in_flight() {
            let Some((excluded, started)) = f.events.begin() else {
                return Ok(Vec::new());
            };
            let out = Sql::<DB>::events_read(&mut conn, endpoint, &excluded, limit).await;
            let rows = settle(conn, out).await?;
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            let taken = f.events.claim(&ids, until, started);
            return Ok(rows
                .into_iter()
                .zip(taken)
                .filter_map(|(r, t)| t.then_some(r))
                .collect());
        }
        let out =
            Sql::<DB>::events_claim(&mut conn, S::CLAIM_LOCK, endpoint, &owner, until, limit).await;
        settle(conn, out).await
    }

    async fn events_settle(&self, outcomes: &[Outcome]) -> Result<(), StoreError> {
        let out = match self.outbox_write(OutboxWrite::Settle(outcomes.to_vec())) {
            Some(ride) => ride.await.map(drop),
            None => {
                let mut conn = self.outbox_pool().acquire().await?;
                let out = Sql::<DB>::events_settle(&mut conn, outcomes).await;
                settle(conn, out).await
            }
        };
        if let Some(f) = self.in_flight() {
            f.events.settled(outcomes.iter().map(|o| match o {
                Outcome::Delivered(id) | Outcome::Retry { id, .. } | Outcome::Park { id, .. } => {
                    *id
                }
            }));
        }
        out
    }

    async fn events_parked(
        &self,
        endpoint: &str,
        limit: u32,
    ) -> Result<Vec<ParkedRow>, StoreError> {
        Sql::<DB>::events_parked(self.outbox_pool(), endpoint, limit).await
    }

    async fn events_redeliver(&self, endpoint: &str, ids: &[i64]) -> Result<u64, StoreError> {
        let mut conn = self.outbox_pool().acquire().await?;
        let out = Sql::<DB>::events_redeliver(&mut conn, endpoint, ids).await;
        settle(conn, out).await
    }

    async fn read_positions(
        &self,
        conversation_id: &str,
        users: &[&str],
    ) -> Result<Vec<(String, u64)>, StoreError> {
        Sql::<DB>::read_positions(self.read(), conversation_id, users).await
    }

    async fn outbox_counts(&self) -> Result<OutboxCounts, StoreError> {
        Sql::<DB>::outbox_counts(self.outbox_pool()).await
    }

    fn replication(&self) -> Option<&dyn super::repl::Replication> {
        Backend::replication(self)
    }

    fn homes(&self) -> Option<&dyn super::homes::HomeStore> {
        Backend::homes(self)
    }
}
