//! The webhook outbox in SQL (`store::outbox`): claiming committed messages and events
//! with a lease, expanding messages into events, settling attempts, the parked list and
//! redelivery, the counts. `lock` is the backend's row-lock suffix of a claim's inner
//! select (Postgres: `FOR UPDATE SKIP LOCKED`, so nodes claim disjoint rows). SQLite,
//! one node, claims by the plain reads `outbox_read` and `events_read` instead (its
//! claims are held in memory, `sql::inflight`), so claiming takes no write lock, and it
//! runs expansions and outcomes on its commit thread with the statement constants here
//! (`store::sqlite_outbox`).

use sqlx::pool::PoolConnection;
use sqlx::{ColumnIndex, Database, Executor, IntoArguments, Pool, Row};

use super::{Bind, Col, Sql, Statement, CHUNK};
use crate::store::outbox::{
    Claimed, Merge, NewEvent, OutboxCounts, OutboxSource, Outcome, ParkedRow,
};
use crate::store::StoreError;

/// The outbox rows with their messages (`Sql::sources` reads its columns), before the
/// `WHERE` that picks them.
const SOURCES: &str = "SELECT o.id, o.conversation_id, o.seq, o.created_ms, \
     COALESCE(m.sender, ''), COALESCE(m.msg_id, ''), COALESCE(m.msg_type, 0), \
     COALESCE(m.ref_msg_id, ''), COALESCE(m.send_time, 0) FROM webhook_outbox o \
     LEFT JOIN messages m ON m.conversation_id = o.conversation_id AND m.seq = o.seq";

/// Stores one event, answering its row id (`$1`..`$8`: endpoint, event id, kind, body,
/// created, due, parked, last error).
pub(crate) const INSERT_EVENT: &str = "INSERT INTO webhook_deliveries (endpoint, event_id, \
     kind, body, created_ms, next_ms, parked, last_error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     RETURNING id";
/// A merge into a stored event never tried (`$1` the body, `$2` the row).
pub(crate) const MERGE_EVENT: &str = "UPDATE webhook_deliveries SET body = $1 \
     WHERE id = $2 AND attempts = 0 AND lease_until = 0";
/// Deletes one expanded outbox row (`$1`).
pub(crate) const DELETE_SOURCE: &str = "DELETE FROM webhook_outbox WHERE id = $1";
/// Deletes one delivered event (`$1`).
pub(crate) const DELETE_EVENT: &str = "DELETE FROM webhook_deliveries WHERE id = $1";
/// A failed attempt: retried at `$1`, or parked (`$2` = 1), with the error `$3`, of row `$4`.
pub(crate) const SETTLE_FAILED: &str = "UPDATE webhook_deliveries SET attempts = attempts + 1, \
     next_ms = $1, parked = $2, last_error = $3, lease_owner = '', lease_until = 0 WHERE id = $4";
/// The last error of an event stored parked because the outbox was at its bound.
pub(crate) const OUTBOX_FULL: &str = "the outbox was full";

impl<DB: Database> Sql<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    i64: Col<DB>,
    i32: Col<DB>,
    String: Col<DB>,
    for<'q> &'q str: Bind<'q, DB>,
{
    /// The rows of a [`SOURCES`] select.
    fn sources(rows: Vec<DB::Row>) -> Result<Vec<OutboxSource>, StoreError> {
        rows.iter()
            .map(|r| {
                Ok(OutboxSource {
                    id: r.try_get(0)?,
                    conversation_id: r.try_get(1)?,
                    seq: r.try_get::<i64, _>(2)?.max(0) as u64,
                    created_ms: r.try_get(3)?,
                    sender: r.try_get(4)?,
                    msg_id: r.try_get(5)?,
                    msg_type: r.try_get(6)?,
                    ref_msg_id: r.try_get(7)?,
                    send_time: r.try_get(8)?,
                })
            })
            .collect()
    }

    /// Events as claimed: rows of `id, event_id, kind, body, created_ms, attempts`.
    fn claimed(rows: Vec<DB::Row>) -> Result<Vec<Claimed>, StoreError> {
        rows.iter()
            .map(|r| {
                Ok(Claimed {
                    id: r.try_get(0)?,
                    event_id: r.try_get(1)?,
                    kind: r.try_get(2)?,
                    body: r.try_get(3)?,
                    created_ms: r.try_get(4)?,
                    attempts: r.try_get::<i32, _>(5)?.max(0) as u32,
                })
            })
            .collect()
    }

    /// Claims committed messages of the outbox ([`Store::outbox_claim`]) for `owner`
    /// (unique per claim) until `until`.
    ///
    /// [`Store::outbox_claim`]: crate::store::Store::outbox_claim
    pub(crate) async fn outbox_claim(
        conn: &mut PoolConnection<DB>,
        lock: &str,
        owner: &str,
        until: i64,
        limit: u32,
    ) -> Result<Vec<OutboxSource>, StoreError> {
        let now = im_proto::now_ms();
        let mut tx = super::begin_write::<DB>(&mut **conn).await?;
        let claim = format!(
            "UPDATE webhook_outbox SET lease_owner = $1, lease_until = $2 WHERE id IN \
             (SELECT id FROM webhook_outbox WHERE lease_until < $3 ORDER BY id LIMIT $4{lock}) \
             RETURNING id"
        );
        let ids: Vec<i64> = sqlx::query_scalar(&claim)
            .bind(owner)
            .bind(until)
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let mut st = Statement::<DB>::new(SOURCES);
        st.push(" WHERE o.id IN (");
        st.push_list(ids.iter().copied()).push(") ORDER BY o.id");
        let (sql, args) = st.finish()?;
        let rows = sqlx::query_with(&sql, args).fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Self::sources(rows)
    }

    /// The oldest committed messages of the outbox, but `excluded` (claimed in memory),
    /// by a plain read: the single-node claim (`sql::inflight`).
    pub(crate) async fn outbox_read(
        conn: &mut PoolConnection<DB>,
        excluded: &[i64],
        limit: u32,
    ) -> Result<Vec<OutboxSource>, StoreError> {
        let mut st = Statement::<DB>::new(SOURCES);
        if !excluded.is_empty() {
            st.push(" WHERE o.id NOT IN (")
                .push_list(excluded.iter().copied())
                .push(")");
        }
        st.push(" ORDER BY o.id LIMIT ").push_bind(i64::from(limit));
        let (sql, args) = st.finish()?;
        let rows = sqlx::query_with(&sql, args).fetch_all(&mut **conn).await?;
        Self::sources(rows)
    }

    /// Due events of one endpoint, but `excluded` (claimed in memory), by a plain read:
    /// the single-node claim (`sql::inflight`).
    pub(crate) async fn events_read(
        conn: &mut PoolConnection<DB>,
        endpoint: &str,
        excluded: &[i64],
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut st = Statement::<DB>::new(
            "SELECT id, event_id, kind, body, created_ms, attempts FROM webhook_deliveries \
             WHERE endpoint = ",
        );
        st.push_bind(endpoint)
            .push(" AND parked = 0 AND next_ms <= ")
            .push_bind(im_proto::now_ms());
        if !excluded.is_empty() {
            st.push(" AND id NOT IN (")
                .push_list(excluded.iter().copied())
                .push(")");
        }
        st.push(" ORDER BY next_ms, id LIMIT ")
            .push_bind(i64::from(limit));
        let (sql, args) = st.finish()?;
        let mut rows = sqlx::query_with(&sql, args).fetch_all(&mut **conn).await?;
        rows.sort_by_cached_key(|r| r.try_get::<i64, _>(0).unwrap_or(0));
        Self::claimed(rows)
    }

    /// Stores events, merges, deletes expanded rows ([`Store::outbox_expand`]).
    ///
    /// [`Store::outbox_expand`]: crate::store::Store::outbox_expand
    pub(crate) async fn outbox_expand(
        conn: &mut PoolConnection<DB>,
        done: &[i64],
        events: &[NewEvent],
        merges: &[Merge],
    ) -> Result<Vec<i64>, StoreError> {
        let mut tx = super::begin_write::<DB>(&mut **conn).await?;
        let mut ids = Vec::with_capacity(events.len());
        for e in events {
            let id: i64 = sqlx::query_scalar(INSERT_EVENT)
                .bind(e.endpoint.as_str())
                .bind(e.event_id.as_str())
                .bind(e.kind.as_str())
                .bind(e.body.as_str())
                .bind(e.created_ms)
                .bind(e.next_ms)
                .bind(i32::from(e.parked))
                .bind(if e.parked { OUTBOX_FULL } else { "" })
                .fetch_one(&mut *tx)
                .await?;
            ids.push(id);
        }
        for m in merges {
            sqlx::query(MERGE_EVENT)
                .bind(m.body.as_str())
                .bind(m.id)
                .execute(&mut *tx)
                .await?;
        }
        for chunk in done.chunks(CHUNK) {
            let mut st = Statement::<DB>::new("DELETE FROM webhook_outbox WHERE id IN (");
            st.push_list(chunk.iter().copied()).push(")");
            let (sql, args) = st.finish()?;
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(ids)
    }

    /// Claims due events of one endpoint ([`Store::events_claim`]).
    ///
    /// [`Store::events_claim`]: crate::store::Store::events_claim
    pub(crate) async fn events_claim(
        conn: &mut PoolConnection<DB>,
        lock: &str,
        endpoint: &str,
        owner: &str,
        until: i64,
        limit: u32,
    ) -> Result<Vec<Claimed>, StoreError> {
        let now = im_proto::now_ms();
        let mut tx = super::begin_write::<DB>(&mut **conn).await?;
        let claim = format!(
            "UPDATE webhook_deliveries SET lease_owner = $1, lease_until = $2 WHERE id IN \
             (SELECT id FROM webhook_deliveries WHERE endpoint = $3 AND parked = 0 \
             AND next_ms <= $4 AND lease_until < $4 ORDER BY next_ms, id LIMIT $5{lock}) \
             RETURNING id, event_id, kind, body, created_ms, attempts"
        );
        let mut rows = sqlx::query(&claim)
            .bind(owner)
            .bind(until)
            .bind(endpoint)
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        rows.sort_by_cached_key(|r| r.try_get::<i64, _>(0).unwrap_or(0));
        tx.commit().await?;
        Self::claimed(rows)
    }

    /// Records attempts' outcomes ([`Store::events_settle`]).
    ///
    /// [`Store::events_settle`]: crate::store::Store::events_settle
    pub(crate) async fn events_settle(
        conn: &mut PoolConnection<DB>,
        outcomes: &[Outcome],
    ) -> Result<(), StoreError> {
        let mut tx = super::begin_write::<DB>(&mut **conn).await?;
        let delivered: Vec<i64> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Delivered(id) => Some(*id),
                _ => None,
            })
            .collect();
        for chunk in delivered.chunks(CHUNK) {
            let mut st = Statement::<DB>::new("DELETE FROM webhook_deliveries WHERE id IN (");
            st.push_list(chunk.iter().copied()).push(")");
            let (sql, args) = st.finish()?;
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        for o in outcomes {
            let (id, next, parked, error) = match o {
                Outcome::Delivered(_) => continue,
                Outcome::Retry { id, next_ms, error } => (*id, *next_ms, 0, error),
                Outcome::Park { id, error } => (*id, 0, 1, error),
            };
            sqlx::query(SETTLE_FAILED)
                .bind(next)
                .bind(parked)
                .bind(error.as_str())
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Parked events ([`Store::events_parked`]).
    ///
    /// [`Store::events_parked`]: crate::store::Store::events_parked
    pub(crate) async fn events_parked(
        read: &Pool<DB>,
        endpoint: &str,
        limit: u32,
    ) -> Result<Vec<ParkedRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, endpoint, event_id, kind, created_ms, attempts, last_error \
             FROM webhook_deliveries WHERE parked = 1 AND ($1 = '' OR endpoint = $1) \
             ORDER BY id LIMIT $2",
        )
        .bind(endpoint)
        .bind(i64::from(limit))
        .fetch_all(read)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(ParkedRow {
                id: r.try_get(0)?,
                endpoint: r.try_get(1)?,
                event_id: r.try_get(2)?,
                kind: r.try_get(3)?,
                created_ms: r.try_get(4)?,
                attempts: r.try_get::<i32, _>(5)?.max(0) as u32,
                last_error: r.try_get(6)?,
            });
        }
        Ok(out)
    }

    /// Queues parked events again ([`Store::events_redeliver`]): due now, with a new
    /// retry age.
    ///
    /// [`Store::events_redeliver`]: crate::store::Store::events_redeliver
    pub(crate) async fn events_redeliver(
        conn: &mut PoolConnection<DB>,
        endpoint: &str,
        ids: &[i64],
    ) -> Result<u64, StoreError> {
        let now = im_proto::now_ms();
        let mut st = Statement::<DB>::new(
            "UPDATE webhook_deliveries SET parked = 0, attempts = 0, next_ms = ",
        );
        st.push_bind(now)
            .push(", created_ms = ")
            .push_bind(now)
            .push(", lease_owner = '', lease_until = 0 WHERE parked = 1");
        if !endpoint.is_empty() {
            st.push(" AND endpoint = ").push_bind(endpoint.to_owned());
        }
        if !ids.is_empty() {
            st.push(" AND id IN (")
                .push_list(ids.iter().copied())
                .push(")");
        }
        st.push(" RETURNING id");
        let (sql, args) = st.finish()?;
        let done = sqlx::query_with(&sql, args).fetch_all(&mut **conn).await?;
        Ok(done.len() as u64)
    }

    /// Read positions in one conversation ([`Store::read_positions`]).
    ///
    /// [`Store::read_positions`]: crate::store::Store::read_positions
    pub(crate) async fn read_positions(
        read: &Pool<DB>,
        conversation_id: &str,
        users: &[&str],
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::with_capacity(users.len());
        for chunk in users.chunks(CHUNK) {
            let mut st = Statement::<DB>::new(
                "SELECT user_id, read_seq FROM conversation_state WHERE conversation_id = ",
            );
            st.push_bind(conversation_id.to_owned())
                .push(" AND user_id IN (")
                .push_list(chunk.iter().map(|u| (*u).to_owned()))
                .push(")");
            let (sql, args) = st.finish()?;
            for r in sqlx::query_with(&sql, args).fetch_all(read).await? {
                let user: String = r.try_get(0)?;
                let seq: i64 = r.try_get(1)?;
                out.push((user, seq.max(0) as u64));
            }
        }
        Ok(out)
    }

    /// How much the outbox holds ([`Store::outbox_counts`]).
    ///
    /// [`Store::outbox_counts`]: crate::store::Store::outbox_counts
    pub(crate) async fn outbox_counts(read: &Pool<DB>) -> Result<OutboxCounts, StoreError> {
        let sources: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM webhook_outbox")
            .fetch_one(read)
            .await?;
        let rows = sqlx::query(
            "SELECT endpoint, COUNT(*) - COALESCE(SUM(parked), 0), COALESCE(SUM(parked), 0) \
             FROM webhook_deliveries GROUP BY endpoint",
        )
        .fetch_all(read)
        .await?;
        let mut endpoints = Vec::with_capacity(rows.len());
        for r in rows {
            let name: String = r.try_get(0)?;
            let queued: i64 = r.try_get(1)?;
            let parked: i64 = r.try_get(2)?;
            endpoints.push((name, queued.max(0) as u64, parked.max(0) as u64));
        }
        Ok(OutboxCounts {
            sources: sources.max(0) as u64,
            endpoints,
        })
    }
}
