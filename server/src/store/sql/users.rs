//! Per-user state in SQL: the read cursors and flags a MarkRead or
//! SetConversationFlags batch commits (the read-cursor and device-cursor upserts are
//! also steps of the Postgres batch commit), the cursor reads, token revocations,
//! presence settings and the peers who may see a user's presence; and the store's
//! probes.

use std::collections::BTreeMap;

use sqlx::pool::PoolConnection;
use sqlx::{ColumnIndex, Database, Executor, IntoArguments, Pool, Row, Transaction};

use super::{Bind, Col, Sql, Statement, CHUNK};
use crate::store::batch::{furthest, DeviceCursors, UserCursors};
use crate::store::repl_cursors::READ;
use crate::store::{FlagsUpdate, ReadMoved, ReadUpdate, StoreError};

/// A read cursor to move forward: (user, conversation) and the seq.
pub(crate) type ReadRow<'a> = ((&'a str, &'a str), i64);

impl<DB: Database> Sql<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    i64: Col<DB>,
    String: Col<DB>,
    for<'q> &'q str: Bind<'q, DB>,
    i32: Col<DB>,
{
    /// Commits read cursors and flags in one transaction ([`Store::commit_state`]).
    /// One row per key (a multi-row upsert may not touch a row twice), in key order
    /// (the same lock order on every node).
    ///
    /// [`Store::commit_state`]: crate::store::Store::commit_state
    pub(crate) async fn commit_state(
        conn: &mut PoolConnection<DB>,
        reads: &[ReadUpdate],
        flags: &[FlagsUpdate],
        region_outbox: bool,
    ) -> Result<Vec<ReadMoved>, StoreError> {
        let mut tx = super::begin_write::<DB>(&mut **conn).await?;
        let now = im_proto::now_ms();
        let seq = |r: &ReadUpdate| r.seq.min(i64::MAX as u64);
        let users: Vec<ReadRow<'_>> = furthest(
            reads
                .iter()
                .map(|r| ((r.user_id.as_str(), r.conversation_id.as_str()), seq(r))),
        )
        .into_iter()
        .map(|(k, s)| (k, s as i64))
        .collect();
        let mut moved = Vec::new();
        Self::upsert_reads(&mut tx, &users, now, Some(&mut moved)).await?;
        let devices = furthest(reads.iter().map(|r| {
            let key = (r.user_id.as_str(), r.device_id.as_str());
            ((key, r.conversation_id.as_str()), seq(r))
        }));
        Self::upsert_devices(&mut tx, &devices, "read_seq").await?;
        if region_outbox {
            Self::region_cursors(&mut tx, &devices, READ, now).await?;
        }
        Self::set_flags(&mut tx, flags).await?;
        tx.commit().await?;
        Ok(moved)
    }

    /// Moves users' read cursors forward (`conversation_state.read_seq`, with the read
    /// time `now`); with `moved`, the rows that moved are added to it.
    pub(crate) async fn upsert_reads(
        tx: &mut Transaction<'_, DB>,
        rows: &[ReadRow<'_>],
        now: i64,
        mut moved: Option<&mut Vec<ReadMoved>>,
    ) -> Result<(), StoreError> {
        for chunk in rows.chunks(CHUNK) {
            let mut qb = Statement::<DB>::new(
                "INSERT INTO conversation_state (user_id, conversation_id, read_seq, \
                 read_time) ",
            );
            qb.push_values(chunk, |b, ((user, conv), seq)| {
                b.push_bind(*user)
                    .push_bind(*conv)
                    .push_bind(*seq)
                    .push_bind(now);
            });
            qb.push(
                " ON CONFLICT (user_id, conversation_id) DO UPDATE \
                 SET read_seq = excluded.read_seq, read_time = excluded.read_time \
                 WHERE excluded.read_seq > conversation_state.read_seq",
            );
            let Some(moved) = moved.as_deref_mut() else {
                let (sql, args) = qb.finish()?;
                sqlx::query_with(&sql, args).execute(&mut **tx).await?;
                continue;
            };
            qb.push(" RETURNING user_id, conversation_id, read_seq, read_time");
            let (sql, args) = qb.finish()?;
            for row in sqlx::query_with(&sql, args).fetch_all(&mut **tx).await? {
                let seq: i64 = row.try_get(2)?;
                moved.push(ReadMoved {
                    user_id: row.try_get(0)?,
                    conversation_id: row.try_get(1)?,
                    seq: seq.max(0) as u64,
                    read_time: row.try_get(3)?,
                });
            }
        }
        Ok(())
    }

    /// Moves devices' cursors forward: `column` (`delivered_seq` or `read_seq`) of
    /// `device_cursors`, per ((user, device), conversation).
    pub(crate) async fn upsert_devices(
        tx: &mut Transaction<'_, DB>,
        devices: &DeviceCursors<'_>,
        column: &str,
    ) -> Result<(), StoreError> {
        let rows: Vec<_> = devices.iter().collect();
        for chunk in rows.chunks(CHUNK) {
            let mut qb = Statement::<DB>::new(&format!(
                "INSERT INTO device_cursors (user_id, device_id, conversation_id, {column}) "
            ));
            qb.push_values(chunk, |b, (((user, device), conv), seq)| {
                b.push_bind(*user)
                    .push_bind(*device)
                    .push_bind(*conv)
                    .push_bind(**seq as i64);
            });
            qb.push(&format!(
                " ON CONFLICT (user_id, device_id, conversation_id) DO UPDATE \
                 SET {column} = excluded.{column} \
                 WHERE excluded.{column} > device_cursors.{column}"
            ));
            let (sql, args) = qb.finish()?;
            sqlx::query_with(&sql, args).execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Multi-region: the outbox rows of devices' cursors moved in `tx` (kind
    /// [`DELIVERED`] or [`READ`], at `now`), forward only, one row per key
    /// (`store::repl_cursors`; written only while `region` is set, so Postgres only).
    pub(crate) async fn region_cursors(
        tx: &mut Transaction<'_, DB>,
        devices: &DeviceCursors<'_>,
        kind: i32,
        now: i64,
    ) -> Result<(), StoreError> {
        let rows: Vec<_> = devices.iter().collect();
        for chunk in rows.chunks(CHUNK) {
            let mut qb = Statement::<DB>::new(
                "INSERT INTO region_cursor_outbox (user_id, device_id, conversation_id, kind, \
                 seq, at) ",
            );
            qb.push_values(chunk, |b, (((user, device), conv), seq)| {
                b.push_bind(*user)
                    .push_bind(*device)
                    .push_bind(*conv)
                    .push_bind(kind)
                    .push_bind(**seq as i64)
                    .push_bind(now);
            });
            qb.push(
                " ON CONFLICT (user_id, device_id, conversation_id, kind) DO UPDATE \
                 SET seq = excluded.seq, at = excluded.at \
                 WHERE excluded.seq > region_cursor_outbox.seq",
            );
            let (sql, args) = qb.finish()?;
            sqlx::query_with(&sql, args).execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Moves users' delivered cursors forward (`cursors.seq`), per (user, conversation).
    pub(crate) async fn upsert_delivered(
        tx: &mut Transaction<'_, DB>,
        users: &UserCursors<'_>,
    ) -> Result<(), StoreError> {
        let rows: Vec<_> = users.iter().collect();
        for chunk in rows.chunks(CHUNK) {
            let mut qb =
                Statement::<DB>::new("INSERT INTO cursors (user_id, conversation_id, seq) ");
            qb.push_values(chunk, |b, ((user, conv), seq)| {
                b.push_bind(*user).push_bind(*conv).push_bind(**seq as i64);
            });
            qb.push(
                " ON CONFLICT (user_id, conversation_id) DO UPDATE SET seq = excluded.seq \
                 WHERE excluded.seq > cursors.seq",
            );
            let (sql, args) = qb.finish()?;
            sqlx::query_with(&sql, args).execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Conversation flags: the last request per key wins.
    async fn set_flags(
        tx: &mut Transaction<'_, DB>,
        flags: &[FlagsUpdate],
    ) -> Result<(), StoreError> {
        let mut set: BTreeMap<(&str, &str), (bool, bool)> = BTreeMap::new();
        for f in flags {
            set.insert(
                (f.user_id.as_str(), f.conversation_id.as_str()),
                (f.muted, f.pinned),
            );
        }
        let set: Vec<_> = set.into_iter().collect();
        for chunk in set.chunks(CHUNK) {
            let mut qb = Statement::<DB>::new(
                "INSERT INTO conversation_state (user_id, conversation_id, muted, pinned) ",
            );
            qb.push_values(chunk, |b, ((user, conv), (muted, pinned))| {
                b.push_bind(*user)
                    .push_bind(*conv)
                    .push_bind(*muted as i32)
                    .push_bind(*pinned as i32);
            });
            qb.push(
                " ON CONFLICT (user_id, conversation_id) DO UPDATE \
                 SET muted = excluded.muted, pinned = excluded.pinned",
            );
            let (sql, args) = qb.finish()?;
            sqlx::query_with(&sql, args).execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// The user's delivered cursor in a conversation ([`Store::cursor`]).
    ///
    /// [`Store::cursor`]: crate::store::Store::cursor
    pub(crate) async fn cursor(
        read: &Pool<DB>,
        user_id: &str,
        conversation_id: &str,
    ) -> Result<u64, StoreError> {
        let seq: Option<i64> = sqlx::query_scalar(
            "SELECT seq FROM cursors WHERE user_id = $1 AND conversation_id = $2",
        )
        .bind(user_id)
        .bind(conversation_id)
        .fetch_optional(read)
        .await?;
        Ok(seq.unwrap_or(0) as u64)
    }

    /// A device's delivered cursor in each of the user's conversations, 0 where it has
    /// none ([`Store::device_delivered`]).
    ///
    /// [`Store::device_delivered`]: crate::store::Store::device_delivered
    pub(crate) async fn device_delivered(
        read: &Pool<DB>,
        user_id: &str,
        device_id: &str,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let stored: Vec<(String, i64)> = sqlx::query_as(
            "SELECT c.conversation_id, COALESCE(k.delivered_seq, 0) FROM \
             (SELECT conversation_id FROM user_conversations WHERE user_id = $1 \
              UNION SELECT 'g:' || group_id FROM group_members WHERE user_id = $1) c \
             LEFT JOIN device_cursors k ON k.user_id = $1 AND k.device_id = $2 \
             AND k.conversation_id = c.conversation_id",
        )
        .bind(user_id)
        .bind(device_id)
        .fetch_all(read)
        .await?;
        Ok(stored
            .into_iter()
            .map(|(c, s)| (c, s.max(0) as u64))
            .collect())
    }

    /// A device's (delivered, read) cursors ([`Store::device_cursor`]).
    ///
    /// [`Store::device_cursor`]: crate::store::Store::device_cursor
    pub(crate) async fn device_cursor(
        read: &Pool<DB>,
        user_id: &str,
        device_id: &str,
        conversation_id: &str,
    ) -> Result<(u64, u64), StoreError> {
        let row: Option<(i64, i64)> = sqlx::query_as(
            "SELECT delivered_seq, read_seq FROM device_cursors \
             WHERE user_id = $1 AND device_id = $2 AND conversation_id = $3",
        )
        .bind(user_id)
        .bind(device_id)
        .bind(conversation_id)
        .fetch_optional(read)
        .await?;
        let (d, r) = row.unwrap_or((0, 0));
        Ok((d.max(0) as u64, r.max(0) as u64))
    }

    /// How many users read up to `seq`, and its sender ([`Store::read_count`]).
    ///
    /// [`Store::read_count`]: crate::store::Store::read_count
    pub(crate) async fn read_count(
        read: &Pool<DB>,
        conversation_id: &str,
        seq: u64,
    ) -> Result<(u32, String), StoreError> {
        let count: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM conversation_state \
             WHERE conversation_id = $1 AND read_seq >= $2",
        )
        .bind(conversation_id)
        .bind(seq as i64)
        .fetch_one(read)
        .await?;
        let sender: Option<String> = sqlx::query_scalar(
            "SELECT sender FROM messages WHERE conversation_id = $1 AND seq = $2",
        )
        .bind(conversation_id)
        .bind(seq as i64)
        .fetch_optional(read)
        .await?;
        Ok((
            count.clamp(0, u32::MAX as i64) as u32,
            sender.unwrap_or_default(),
        ))
    }

    /// Records that the user's tokens issued at or before `at` are refused
    /// ([`Store::revoke`]).
    ///
    /// [`Store::revoke`]: crate::store::Store::revoke
    pub(crate) async fn revoke(
        conn: &mut PoolConnection<DB>,
        user_id: &str,
        at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO revocations (user_id, revoked_at) VALUES ($1, $2) \
             ON CONFLICT (user_id) DO UPDATE SET revoked_at = excluded.revoked_at \
             WHERE excluded.revoked_at > revocations.revoked_at",
        )
        .bind(user_id)
        .bind(at)
        .execute(&mut **conn)
        .await?;
        Ok(())
    }

    /// Every recorded revocation ([`Store::revocations`]).
    ///
    /// [`Store::revocations`]: crate::store::Store::revocations
    pub(crate) async fn revocations(read: &Pool<DB>) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(
            sqlx::query_as("SELECT user_id, revoked_at FROM revocations")
                .fetch_all(read)
                .await?,
        )
    }

    /// Cheap readiness probe ([`Store::ping`]).
    ///
    /// [`Store::ping`]: crate::store::Store::ping
    pub(crate) async fn ping(read: &Pool<DB>) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(read).await?;
        Ok(())
    }

    /// One row rewritten and committed ([`Store::probe_write`]).
    ///
    /// [`Store::probe_write`]: crate::store::Store::probe_write
    pub(crate) async fn probe_write(conn: &mut PoolConnection<DB>) -> Result<(), StoreError> {
        let mut tx = super::begin_write::<DB>(&mut **conn).await?;
        sqlx::query(
            "INSERT INTO store_probe (id, at) VALUES (1, $1) \
             ON CONFLICT (id) DO UPDATE SET at = excluded.at",
        )
        .bind(im_proto::now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records whether `user_id` hides their presence ([`Store::set_presence_hidden`]).
    ///
    /// [`Store::set_presence_hidden`]: crate::store::Store::set_presence_hidden
    pub(crate) async fn set_presence_hidden(
        conn: &mut PoolConnection<DB>,
        user_id: &str,
        hidden: bool,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO presence_settings (user_id, hidden) VALUES ($1, $2) \
             ON CONFLICT (user_id) DO UPDATE SET hidden = excluded.hidden",
        )
        .bind(user_id)
        .bind(i32::from(hidden))
        .execute(&mut **conn)
        .await?;
        Ok(())
    }

    /// Of `candidates`, those who share a conversation with `user_id`
    /// ([`Store::presence_peers`]).
    ///
    /// [`Store::presence_peers`]: crate::store::Store::presence_peers
    pub(crate) async fn presence_peers(
        read: &Pool<DB>,
        user_id: &str,
        candidates: &[&str],
    ) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for chunk in candidates.chunks(CHUNK) {
            // One-to-one conversations that exist between them.
            let direct: Vec<(String, &str)> = chunk
                .iter()
                .map(|u| (im_proto::direct_conversation(user_id, u), *u))
                .collect();
            let mut qb = Statement::<DB>::new(
                "SELECT conversation_id FROM user_conversations WHERE user_id = ",
            );
            qb.push_bind(user_id);
            qb.push(" AND conversation_id IN (");
            qb.push_list(direct.iter().map(|(c, _)| c.as_str()));
            qb.push(")");
            let (sql, args) = qb.finish()?;
            let rows: Vec<(String,)> = sqlx::query_as_with(&sql, args).fetch_all(read).await?;
            for (c,) in rows {
                if let Some((_, u)) = direct.iter().find(|(d, _)| *d == c) {
                    out.push((*u).to_owned());
                }
            }
            // A group both are members of.
            let mut qb = Statement::<DB>::new(
                "SELECT DISTINCT b.user_id FROM group_members a \
                 JOIN group_members b ON b.group_id = a.group_id WHERE a.user_id = ",
            );
            qb.push_bind(user_id);
            qb.push(" AND b.user_id IN (");
            qb.push_list(chunk.iter().copied());
            qb.push(")");
            let (sql, args) = qb.finish()?;
            let rows: Vec<(String,)> = sqlx::query_as_with(&sql, args).fetch_all(read).await?;
            out.extend(rows.into_iter().map(|(u,)| u));
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// Of `users`, those who hide their presence ([`Store::presence_hidden`]).
    ///
    /// [`Store::presence_hidden`]: crate::store::Store::presence_hidden
    pub(crate) async fn presence_hidden(
        read: &Pool<DB>,
        users: &[&str],
    ) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for chunk in users.chunks(CHUNK) {
            let mut qb = Statement::<DB>::new(
                "SELECT user_id FROM presence_settings WHERE hidden <> 0 AND user_id IN (",
            );
            qb.push_list(chunk.iter().copied());
            qb.push(")");
            let (sql, args) = qb.finish()?;
            let rows: Vec<(String,)> = sqlx::query_as_with(&sql, args).fetch_all(read).await?;
            out.extend(rows.into_iter().map(|(u,)| u));
        }
        Ok(out)
    }
}
