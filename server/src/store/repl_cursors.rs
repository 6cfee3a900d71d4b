//! Multi-region replication of cursors (Postgres only; docs/multi-region.md): the
//! delivered and read cursors a region moves are written, in the transaction that moves
//! them, into `region_cursor_outbox` (one row per user, device, conversation and kind,
//! so several moves before the next publish are one row: `Sql::region_cursors`); the
//! publisher takes them as [`CursorMove`]s ([`take`]) and deletes them once published
//! ([`done`]); another region applies them by max ([`apply`]): a cursor never moves
//! back, a move applied twice changes nothing, and moves need no order among themselves
//! or with the messages. A read cursor that moved is returned for the read receipts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Row};

use super::{ReadMoved, StoreError};

/// Most cursor moves one [`take`] returns (and one published batch holds).
pub const MAX_TAKE: u32 = 500;

/// The delivered cursor (`device_cursors.delivered_seq`, `cursors.seq`).
pub const DELIVERED: i32 = 0;
/// The read cursor (`device_cursors.read_seq`, `conversation_state.read_seq`).
pub const READ: i32 = 1;

/// One cursor a region moved, as published (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorMove {
    /// The user.
    pub user_id: String,
    /// The user's device.
    pub device_id: String,
    /// The conversation.
    pub conversation_id: String,
    /// [`DELIVERED`] or [`READ`].
    pub kind: i32,
    /// Everything up to this seq was delivered (read).
    pub seq: u64,
    /// When it moved, ms.
    pub at: i64,
}

/// A batch of cursor moves on a region's stream (one message, marked by its
/// `Im-Repl-Kind: cursors` header).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorBatch {
    /// The region that moved them.
    pub region: String,
    /// The moves.
    pub cursors: Vec<CursorMove>,
}

/// Up to `limit` (at most [`MAX_TAKE`]) outbox rows as cursor moves.
pub(crate) async fn take(pool: &PgPool, limit: u32) -> Result<Vec<CursorMove>, StoreError> {
    let rows = sqlx::query(
        "SELECT user_id, device_id, conversation_id, kind, seq, at FROM region_cursor_outbox \
         LIMIT $1",
    )
    .bind(i64::from(limit.min(MAX_TAKE)))
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let seq: i64 = r.try_get(4)?;
        out.push(CursorMove {
            user_id: r.try_get(0)?,
            device_id: r.try_get(1)?,
            conversation_id: r.try_get(2)?,
            kind: r.try_get(3)?,
            seq: seq.max(0) as u64,
            at: r.try_get(5)?,
        });
    }
    Ok(out)
}

/// Deletes the outbox rows of published moves, unless the cursor moved further since.
pub(crate) async fn done(pool: &PgPool, moves: &[CursorMove]) -> Result<(), StoreError> {
    if moves.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&CursorMove) -> String| moves.iter().map(f).collect::<Vec<_>>();
    let kinds: Vec<i32> = moves.iter().map(|m| m.kind).collect();
    let seqs: Vec<i64> = moves.iter().map(|m| seq(m.seq)).collect();
    sqlx::query(
        "DELETE FROM region_cursor_outbox o USING \
         UNNEST($1::text[], $2::text[], $3::text[], $4::int[], $5::bigint[]) AS d(u, dv, c, k, s) \
         WHERE o.user_id = d.u AND o.device_id = d.dv AND o.conversation_id = d.c \
         AND o.kind = d.k AND o.seq <= d.s",
    )
    .bind(col(|m| m.user_id.clone()))
    .bind(col(|m| m.device_id.clone()))
    .bind(col(|m| m.conversation_id.clone()))
    .bind(kinds)
    .bind(seqs)
    .execute(pool)
    .await?;
    Ok(())
}

/// A seq as stored.
fn seq(s: u64) -> i64 {
    s.min(i64::MAX as u64) as i64
}

/// Applies another region's cursor moves by max in one transaction: each device's
/// cursor and the user's (the furthest of their devices). The user read cursors that
/// moved here (for the read receipts).
pub(crate) async fn apply(
    pool: &PgPool,
    moves: &[CursorMove],
) -> Result<Vec<ReadMoved>, StoreError> {
    // Per key the furthest move, in key order (the same lock order as the commits).
    let mut devices: BTreeMap<(i32, &str, &str, &str), (u64, i64)> = BTreeMap::new();
    let mut users: BTreeMap<(i32, &str, &str), (u64, i64)> = BTreeMap::new();
    for m in moves
        .iter()
        .filter(|m| m.kind == DELIVERED || m.kind == READ)
    {
        let key = (m.kind, m.user_id.as_str(), m.device_id.as_str());
        let d = devices
            .entry((key.0, key.1, key.2, m.conversation_id.as_str()))
            .or_insert((0, 0));
        *d = (d.0.max(m.seq), d.1.max(m.at));
        let u = users
            .entry((m.kind, m.user_id.as_str(), m.conversation_id.as_str()))
            .or_insert((0, 0));
        *u = (u.0.max(m.seq), u.1.max(m.at));
    }
    let mut tx = pool.begin().await?;
    for kind in [DELIVERED, READ] {
        let column = if kind == READ {
            "read_seq"
        } else {
            "delivered_seq"
        };
        let rows: Vec<_> = devices.iter().filter(|(k, _)| k.0 == kind).collect();
        for chunk in rows.chunks(1000) {
            let mut qb = sqlx::QueryBuilder::<Postgres>::new(format!(
                "INSERT INTO device_cursors (user_id, device_id, conversation_id, {column}) "
            ));
            qb.push_values(chunk, |mut b, ((_, user, device, conv), (s, _))| {
                b.push_bind(*user)
                    .push_bind(*device)
                    .push_bind(*conv)
                    .push_bind(seq(*s));
            });
            qb.push(format!(
                " ON CONFLICT (user_id, device_id, conversation_id) DO UPDATE \
                 SET {column} = excluded.{column} WHERE excluded.{column} > device_cursors.{column}"
            ));
            qb.build().execute(&mut *tx).await?;
        }
    }
    let delivered: Vec<_> = users.iter().filter(|(k, _)| k.0 == DELIVERED).collect();
    for chunk in delivered.chunks(1000) {
        let mut qb = sqlx::QueryBuilder::<Postgres>::new(
            "INSERT INTO cursors (user_id, conversation_id, seq) ",
        );
        qb.push_values(chunk, |mut b, ((_, user, conv), (s, _))| {
            b.push_bind(*user).push_bind(*conv).push_bind(seq(*s));
        });
        qb.push(
            " ON CONFLICT (user_id, conversation_id) DO UPDATE SET seq = excluded.seq \
             WHERE excluded.seq > cursors.seq",
        );
        qb.build().execute(&mut *tx).await?;
    }
    let mut moved = Vec::new();
    let read: Vec<_> = users.iter().filter(|(k, _)| k.0 == READ).collect();
    for chunk in read.chunks(1000) {
        let mut qb = sqlx::QueryBuilder::<Postgres>::new(
            "INSERT INTO conversation_state (user_id, conversation_id, read_seq, read_time) ",
        );
        qb.push_values(chunk, |mut b, ((_, user, conv), (s, at))| {
            b.push_bind(*user)
                .push_bind(*conv)
                .push_bind(seq(*s))
                .push_bind(*at);
        });
        qb.push(
            " ON CONFLICT (user_id, conversation_id) DO UPDATE \
             SET read_seq = excluded.read_seq, read_time = excluded.read_time \
             WHERE excluded.read_seq > conversation_state.read_seq \
             RETURNING user_id, conversation_id, read_seq, read_time",
        );
        for row in qb.build().fetch_all(&mut *tx).await? {
            let s: i64 = row.try_get(2)?;
            moved.push(ReadMoved {
                user_id: row.try_get(0)?,
                conversation_id: row.try_get(1)?,
                seq: s.max(0) as u64,
                read_time: row.try_get(3)?,
            });
        }
    }
    tx.commit().await?;
    Ok(moved)
}
