//! Postgres backend (production and cluster mode). Seq allocation is an atomic upsert on
//! the conversation row, so several nodes may commit to one database safely.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool, Postgres};

use super::homes::{self, HomeRow, HomeStore, MoveReq, Moved};
use super::repl::{self, Applied, Leader, Record, Replication};
use super::repl_cursors::{self, CursorMove};
use super::sql::{settle, Backend};
use super::ReadMoved;
use super::{postgres_commit, Committed, CursorUpdate, NewMessage};
use super::{StoreError, Timeouts};

/// The Postgres store.
pub struct PgStore {
    write: PgPool,
    read: PgPool,
    /// Whether batch commits write webhook outbox rows (`store::outbox`).
    outbox: AtomicBool,
    /// The webhook outbox's connections (lazy; `store::outbox`).
    outbox_pool: PgPool,
    /// Whether commits write replication outbox rows (`store::repl`).
    region_outbox: AtomicBool,
}

impl PgStore {
    /// Connects with a read pool and a write pool of `pool_size` connections each and runs
    /// the migrations (default timeouts).
    pub async fn connect(url: &str, pool_size: u32) -> Result<Self, StoreError> {
        Self::connect_with(PgConnectOptions::from_str(url)?, pool_size).await
    }

    /// As [`PgStore::connect`] with the given timeouts.
    pub async fn connect_timed(
        url: &str,
        pool_size: u32,
        timeouts: Timeouts,
    ) -> Result<Self, StoreError> {
        Self::connect_with_timed(PgConnectOptions::from_str(url)?, pool_size, timeouts).await
    }

    /// As [`PgStore::connect`] with explicit options (tests use a schema per run).
    pub async fn connect_with(
        options: PgConnectOptions,
        pool_size: u32,
    ) -> Result<Self, StoreError> {
        Self::connect_with_timed(options, pool_size, Timeouts::default()).await
    }

    /// The most general constructor: explicit options and timeouts. The migrations run
    /// first on a connection of their own, without the statement timeout (a migration of
    /// a large table may take longer than any message commit should); the pool's
    /// connections carry `statement_timeout`, so a statement stuck on a lock or a dying
    /// server fails instead of holding the writer.
    pub async fn connect_with_timed(
        options: PgConnectOptions,
        pool_size: u32,
        timeouts: Timeouts,
    ) -> Result<Self, StoreError> {
        let mut migrator = options.connect().await?;
        // Newer releases' migrations are ignored, not refused: see the SQLite store.
        sqlx::migrate!("../migrations/postgres")
            .set_ignore_missing(true)
            .run(&mut migrator)
            .await?;
        let _ = sqlx::Connection::close(migrator).await;
        let ms = timeouts.statement.as_millis().to_string();
        let options = if timeouts.statement.is_zero() {
            options
        } else {
            options.options([("statement_timeout", ms.as_str())])
        };
        let outbox_pool = PgPoolOptions::new()
            .max_connections(2)
            .min_connections(0)
            .acquire_timeout(std::time::Duration::from_secs(30))
            .connect_lazy_with(options.clone());
        // Writes (the batch commits first) get a pool of their own: a flood of reads,
        // such as every member of a large group syncing after a hint, must not hold
        // every connection while a commit waits for one (the commit would time out and
        // the writer would take the store for down).
        let write = PgPoolOptions::new()
            .max_connections(pool_size.max(2))
            .acquire_timeout(timeouts.acquire)
            .connect_with(options.clone())
            .await?;
        let read = PgPoolOptions::new()
            .max_connections(pool_size.max(2))
            .acquire_timeout(timeouts.acquire)
            .connect_with(options)
            .await?;
        Ok(PgStore {
            write,
            read,
            outbox: AtomicBool::new(false),
            outbox_pool,
            region_outbox: AtomicBool::new(false),
        })
    }
}

impl Backend for PgStore {
    type DB = Postgres;
    const NAME: &'static str = "postgres";

    fn read(&self) -> &PgPool {
        &self.read
    }

    /// A pooled connection for a write, checked to be outside any transaction (a write
    /// cancelled by the writer's time bound leaves its rollback to the pool; should one
    /// still be open, the connection is closed and another taken).
    async fn writer(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        let conn = self.write.acquire().await?;
        if !sqlx::Connection::is_in_transaction(&*conn) {
            return Ok(conn);
        }
        tracing::warn!("a store connection was left inside a transaction; closing it");
        metrics::counter!("im_store_connection_resets_total").increment(1);
        let _ = conn.close().await;
        Ok(self.write.acquire().await?)
    }

    /// One batch commit on a checked writer connection, discarded when it fails.
    async fn commit(
        &self,
        messages: &[NewMessage],
        cursors: &[CursorUpdate],
    ) -> Result<Vec<Committed>, StoreError> {
        let mut conn = self.writer().await?;
        let outbox = postgres_commit::Outboxes {
            webhooks: self.outbox.load(Ordering::Relaxed),
            region: self.region_outbox.load(Ordering::Relaxed),
        };
        let out = postgres_commit::commit_batch(&mut conn, messages, cursors, outbox).await;
        settle(conn, out).await
    }

    fn set_outbox(&self, on: bool) {
        self.outbox.store(on, Ordering::Relaxed);
    }

    fn outbox_on(&self) -> bool {
        self.outbox.load(Ordering::Relaxed)
    }

    fn outbox_pool(&self) -> &PgPool {
        &self.outbox_pool
    }

    const SIDE_BY_SIDE: bool = true;

    const CLAIM_LOCK: &'static str = " FOR UPDATE SKIP LOCKED";

    fn region_outbox_on(&self) -> bool {
        self.region_outbox.load(Ordering::Relaxed)
    }

    fn replication(&self) -> Option<&dyn Replication> {
        Some(self)
    }

    fn homes(&self) -> Option<&dyn HomeStore> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl Replication for PgStore {
    fn set_region_outbox(&self, on: bool) {
        self.region_outbox.store(on, Ordering::Relaxed);
    }

    async fn outbox_take(&self, region: &str, limit: u32) -> Result<Vec<Record>, StoreError> {
        repl::outbox_take(&self.outbox_pool, region, limit).await
    }

    async fn outbox_done(&self, ids: &[i64]) -> Result<(), StoreError> {
        repl::outbox_done(&self.outbox_pool, ids).await
    }

    async fn outbox_len(&self) -> Result<u64, StoreError> {
        repl::outbox_len(&self.outbox_pool).await
    }

    async fn apply(&self, record: &Record) -> Result<Applied, StoreError> {
        repl::apply(&self.write, record).await
    }

    async fn apply_batch(
        &self,
        records: &[Record],
    ) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
        repl::apply_batch(&self.write, records).await
    }

    async fn lead(&self, key: i64) -> Result<Option<Leader>, StoreError> {
        repl::lead(&self.outbox_pool, key).await
    }

    async fn cursors_take(&self, limit: u32) -> Result<Vec<CursorMove>, StoreError> {
        repl_cursors::take(&self.outbox_pool, limit).await
    }

    async fn cursors_done(&self, moves: &[CursorMove]) -> Result<(), StoreError> {
        repl_cursors::done(&self.outbox_pool, moves).await
    }

    async fn apply_cursors(&self, moves: &[CursorMove]) -> Result<Vec<ReadMoved>, StoreError> {
        repl_cursors::apply(&self.write, moves).await
    }
}

#[async_trait::async_trait]
impl HomeStore for PgStore {
    async fn homes_after(&self, after: i64, limit: u32) -> Result<Vec<HomeRow>, StoreError> {
        homes::homes_after(&self.outbox_pool, after, limit).await
    }

    async fn record_move(&self, conversation: &str, m: MoveReq<'_>) -> Result<Moved, StoreError> {
        homes::record_move(&self.write, conversation, m).await
    }

    async fn reconcile_take(&self, limit: u32) -> Result<Vec<(i64, Record)>, StoreError> {
        homes::reconcile_take(&self.outbox_pool, limit).await
    }

    async fn reconcile_done(&self, id: i64, new_seq: u64) -> Result<(), StoreError> {
        homes::reconcile_done(&self.outbox_pool, id, new_seq).await
    }

    async fn reconcile_counts(&self) -> Result<(u64, u64, u64), StoreError> {
        homes::reconcile_counts(&self.outbox_pool).await
    }

    async fn seq_of(
        &self,
        conversation: &str,
        msg_id: &str,
        above: u64,
    ) -> Result<Option<u64>, StoreError> {
        homes::seq_of(&self.write, conversation, msg_id, above).await
    }

    async fn msg_at(&self, conversation: &str, seq: u64) -> Result<Option<String>, StoreError> {
        homes::msg_at(&self.write, conversation, seq).await
    }

    async fn conversations_after(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        homes::conversations_after(&self.outbox_pool, after, limit).await
    }
}
