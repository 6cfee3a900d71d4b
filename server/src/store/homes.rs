//! Home moves' side of the store (Postgres only; docs/multi-region.md "Losing a region,
//! moving a home, reconciliation"): the `conversation_homes` rows (one per move of a
//! conversation, by epoch, with the new home and the fence: the last seq of the epoch
//! before), the move itself in one transaction with the conversation row locked (the
//! row, the set-aside of what this region holds above the fence, the `region_outbox`
//! row that publishes the move), and the `region_reconcile` rows: messages taken out of
//! the conversation above a fence, re-sent to the new home by the region that committed
//! them ([`HomeStore::reconcile_take`]).

use sqlx::{PgPool, Postgres, Row};

pub use super::repl::HomeMove;
use super::repl::Record;
use super::StoreError;

/// One `conversation_homes` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeRow {
    /// The conversation.
    pub conversation_id: String,
    /// The move.
    pub moved: HomeMove,
    /// The change cursor (rows are read in its order).
    pub id: i64,
}

/// What a move did in this region's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved {
    /// Recorded: the row, and how many messages above the fence were set aside.
    Done(HomeRow, u64),
    /// Not recorded: this region has applied only up to the given seq, below the fence.
    Behind(u64),
    /// Not recorded: the conversation already has this epoch or a later one.
    Stale(u64),
}

/// The home moves' side of a store (Postgres).
#[async_trait::async_trait]
pub trait HomeStore: Send + Sync {
    /// `conversation_homes` rows with an id above `after`, oldest first, at most `limit`.
    async fn homes_after(&self, after: i64, limit: u32) -> Result<Vec<HomeRow>, StoreError>;

    /// Makes `region` the home of `conversation` from `epoch` on, in one transaction:
    /// the fence is `fence` (`None`: this region's applied seq), refused when the
    /// applied seq is below it or `epoch` is not newer than every recorded one; rows
    /// above the fence are set aside (re-sent by this region when `resend`), and with
    /// `publish` a `region_outbox` row publishes the move.
    async fn record_move(&self, conversation: &str, m: MoveReq<'_>) -> Result<Moved, StoreError>;

    /// Pending set-aside messages this region re-sends, oldest first, at most `limit`.
    async fn reconcile_take(&self, limit: u32) -> Result<Vec<(i64, Record)>, StoreError>;

    /// Marks set-aside row `id` re-sent (at `new_seq` of the new home).
    async fn reconcile_done(&self, id: i64, new_seq: u64) -> Result<(), StoreError>;

    /// (pending re-sends, re-sent, kept) set-aside rows.
    async fn reconcile_counts(&self) -> Result<(u64, u64, u64), StoreError>;

    /// The seq of `msg_id` in `conversation` above `above`, if stored.
    async fn seq_of(
        &self,
        conversation: &str,
        msg_id: &str,
        above: u64,
    ) -> Result<Option<u64>, StoreError>;

    /// The msg_id stored at `seq` of `conversation`, if any.
    async fn msg_at(&self, conversation: &str, seq: u64) -> Result<Option<String>, StoreError>;

    /// Up to `limit` conversation ids after `after`, in order (the bulk move's pages).
    async fn conversations_after(&self, after: &str, limit: u32)
        -> Result<Vec<String>, StoreError>;
}

/// A move for [`HomeStore::record_move`].
#[derive(Debug, Clone)]
pub struct MoveReq<'a> {
    /// The new epoch.
    pub epoch: u64,
    /// The new home.
    pub region: &'a str,
    /// The fence (`None`: this region's applied seq).
    pub fence: Option<u64>,
    /// Whether this region committed what it holds above the fence (it re-sends it).
    pub resend: bool,
    /// Whether to publish the move (this region is the new home).
    pub publish: bool,
    /// This region's name (the set-aside records' origin).
    pub local: &'a str,
}

/// `conversation_homes` rows with an id above `after` ([`HomeStore::homes_after`]).
pub(crate) async fn homes_after(
    pool: &PgPool,
    after: i64,
    limit: u32,
) -> Result<Vec<HomeRow>, StoreError> {
    let rows = sqlx::query(
        "SELECT conversation_id, epoch, region, fence_seq, id FROM conversation_homes \
         WHERE id > $1 ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(home_row).collect()
}

/// Pending re-sends ([`HomeStore::reconcile_take`]).
pub(crate) async fn reconcile_take(
    pool: &PgPool,
    limit: u32,
) -> Result<Vec<(i64, Record)>, StoreError> {
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT id, record FROM region_reconcile WHERE status = 0 AND resend = 1 \
         ORDER BY id LIMIT $1",
    )
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for (id, json) in rows {
        let rec: Record =
            serde_json::from_str(&json).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        out.push((id, rec));
    }
    Ok(out)
}

/// Marks a set-aside row re-sent ([`HomeStore::reconcile_done`]).
pub(crate) async fn reconcile_done(pool: &PgPool, id: i64, new_seq: u64) -> Result<(), StoreError> {
    sqlx::query("UPDATE region_reconcile SET status = 1, new_seq = $2 WHERE id = $1")
        .bind(id)
        .bind(new_seq as i64)
        .execute(pool)
        .await?;
    Ok(())
}

/// The set-aside counts ([`HomeStore::reconcile_counts`]).
pub(crate) async fn reconcile_counts(pool: &PgPool) -> Result<(u64, u64, u64), StoreError> {
    let (p, r, k): (i64, i64, i64) = sqlx::query_as(
        "SELECT COUNT(*) FILTER (WHERE status = 0 AND resend = 1), \
         COUNT(*) FILTER (WHERE status = 1), COUNT(*) FILTER (WHERE status = 2) \
         FROM region_reconcile",
    )
    .fetch_one(pool)
    .await?;
    Ok((p.max(0) as u64, r.max(0) as u64, k.max(0) as u64))
}

/// The seq of a msg_id above a seq ([`HomeStore::seq_of`]).
pub(crate) async fn seq_of(
    pool: &PgPool,
    conversation: &str,
    msg_id: &str,
    above: u64,
) -> Result<Option<u64>, StoreError> {
    let seq: Option<i64> = sqlx::query_scalar(
        "SELECT seq FROM messages WHERE conversation_id = $1 AND seq > $2 AND msg_id = $3 \
         LIMIT 1",
    )
    .bind(conversation)
    .bind(above as i64)
    .bind(msg_id)
    .fetch_optional(pool)
    .await?;
    Ok(seq.map(|s| s.max(0) as u64))
}

/// The msg_id at a seq ([`HomeStore::msg_at`]).
pub(crate) async fn msg_at(
    pool: &PgPool,
    conversation: &str,
    seq: u64,
) -> Result<Option<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT msg_id FROM messages WHERE conversation_id = $1 AND seq = $2")
            .bind(conversation)
            .bind(seq as i64)
            .fetch_optional(pool)
            .await?,
    )
}

/// A page of conversation ids ([`HomeStore::conversations_after`]).
pub(crate) async fn conversations_after(
    pool: &PgPool,
    after: &str,
    limit: u32,
) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT conversation_id FROM conversations WHERE conversation_id > $1 \
         ORDER BY conversation_id LIMIT $2",
    )
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?)
}

fn home_row(r: &sqlx::postgres::PgRow) -> Result<HomeRow, StoreError> {
    let epoch: i64 = r.try_get(1)?;
    let fence: i64 = r.try_get(3)?;
    Ok(HomeRow {
        conversation_id: r.try_get(0)?,
        moved: HomeMove {
            epoch: epoch.max(0) as u64,
            region: r.try_get(2)?,
            fence: fence.max(0) as u64,
        },
        id: r.try_get(4)?,
    })
}

/// The move's transaction (see [`HomeStore::record_move`]).
pub(crate) async fn record_move(
    pool: &PgPool,
    conv: &str,
    m: MoveReq<'_>,
) -> Result<Moved, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO conversations (conversation_id, last_seq, last_time) VALUES ($1, 0, 0) \
         ON CONFLICT (conversation_id) DO NOTHING",
    )
    .bind(conv)
    .execute(&mut *tx)
    .await?;
    let applied: i64 = sqlx::query_scalar(
        "SELECT last_seq FROM conversations WHERE conversation_id = $1 FOR UPDATE",
    )
    .bind(conv)
    .fetch_one(&mut *tx)
    .await?;
    let applied = applied.max(0) as u64;
    let fence = m.fence.unwrap_or(applied);
    if m.publish && applied < fence {
        return Ok(Moved::Behind(applied));
    }
    let newest: Option<i64> =
        sqlx::query_scalar("SELECT MAX(epoch) FROM conversation_homes WHERE conversation_id = $1")
            .bind(conv)
            .fetch_one(&mut *tx)
            .await?;
    let newest = newest.unwrap_or(0).max(0) as u64;
    let row = if newest >= m.epoch {
        // Recorded before (a repeated request, a redelivered record): same fence or stale.
        let r = sqlx::query(
            "SELECT conversation_id, epoch, region, fence_seq, id FROM conversation_homes \
             WHERE conversation_id = $1 AND epoch = $2",
        )
        .bind(conv)
        .bind(m.epoch as i64)
        .fetch_optional(&mut *tx)
        .await?;
        match r.as_ref().map(home_row).transpose()? {
            Some(r) if newest == m.epoch && r.moved.region == m.region => r,
            _ => return Ok(Moved::Stale(newest)),
        }
    } else {
        let r = sqlx::query(
            "INSERT INTO conversation_homes (conversation_id, epoch, region, fence_seq, moved_at) \
             VALUES ($1, $2, $3, $4, $5) RETURNING conversation_id, epoch, region, fence_seq, id",
        )
        .bind(conv)
        .bind(m.epoch as i64)
        .bind(m.region)
        .bind(fence as i64)
        .bind(im_proto::now_ms())
        .fetch_one(&mut *tx)
        .await?;
        if m.publish {
            sqlx::query("INSERT INTO region_outbox (conversation_id, seq) VALUES ($1, $2)")
                .bind(conv)
                .bind(-(m.epoch as i64))
                .execute(&mut *tx)
                .await?;
        }
        home_row(&r)?
    };
    let fence = row.moved.fence;
    let aside = if applied > fence {
        set_aside(&mut tx, conv, fence, &m).await?
    } else {
        0
    };
    tx.commit().await?;
    Ok(Moved::Done(row, aside))
}

/// Moves the conversation's messages above `fence` into `region_reconcile` (as
/// records), drops their unpublished outbox rows and sets the applied seq to `fence`;
/// how many it moved.
async fn set_aside(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    conv: &str,
    fence: u64,
    m: &MoveReq<'_>,
) -> Result<u64, StoreError> {
    use base64::Engine as _;
    let rows = sqlx::query(
        "SELECT seq, msg_id, sender, client_msg_id, msg_type, payload, send_time, ref_seq, \
         ref_msg_id, state, edit_time FROM messages WHERE conversation_id = $1 AND seq > $2 \
         ORDER BY seq",
    )
    .bind(conv)
    .bind(fence as i64)
    .fetch_all(&mut **tx)
    .await?;
    let now = im_proto::now_ms();
    for r in &rows {
        let seq: i64 = r.try_get(0)?;
        let payload: Vec<u8> = r.try_get(5)?;
        let rec = Record {
            region: m.local.to_owned(),
            conversation_id: conv.to_owned(),
            seq: seq.max(0) as u64,
            msg_id: r.try_get(1)?,
            sender: r.try_get(2)?,
            client_msg_id: r.try_get(3)?,
            msg_type: r.try_get(4)?,
            payload: base64::engine::general_purpose::STANDARD.encode(payload),
            send_time: r.try_get(6)?,
            ref_seq: r.try_get(7)?,
            ref_msg_id: r.try_get(8)?,
            state: r.try_get(9)?,
            edit_time: r.try_get(10)?,
            ..Default::default()
        };
        // Only plain messages go again: an event (SYSTEM, RECALL, EDIT) names seqs and
        // states of the old history, so it is kept for the operator instead.
        let plain = rec.msg_type < im_proto::MessageType::System as i32;
        let status: i16 = if m.resend && !plain { 2 } else { 0 };
        let json = serde_json::to_string(&rec).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        sqlx::query(
            "INSERT INTO region_reconcile (conversation_id, seq, epoch, msg_id, record, resend, \
             status, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(conv)
        .bind(seq)
        .bind(m.epoch as i64)
        .bind(rec.msg_id.as_str())
        .bind(json)
        .bind(i16::from(m.resend))
        .bind(status)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    }
    for sql in [
        "DELETE FROM messages WHERE conversation_id = $1 AND seq > $2",
        "DELETE FROM region_outbox WHERE conversation_id = $1 AND seq > $2",
        "UPDATE conversations SET last_seq = $2 WHERE conversation_id = $1",
    ] {
        sqlx::query(sql)
            .bind(conv)
            .bind(fence as i64)
            .execute(&mut **tx)
            .await?;
    }
    Ok(rows.len() as u64)
}
