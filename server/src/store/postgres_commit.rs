//! The Postgres batch commit: where a batch of messages and delivery cursors is
//! committed in production and cluster mode. Each statement is a network round trip,
//! so each step is one multi-row statement per table (per [`CHUNK`] rows), with rows
//! locked in key order, the same in every transaction, so batches of several nodes
//! sharing conversations cannot deadlock.
//!
//! The steps are the SQLite commit thread's (`store::sqlite_commit`), with what both
//! compute without the database in `store::batch`: dedup by (sender, conversation,
//! client_msg_id), a gapless seq range per conversation (an atomic upsert on the
//! conversation row, so several nodes may share a database), the one-to-one parties'
//! conversation list rows, the messages, RECALL/EDIT changes, the sender's read cursor,
//! then the device and user delivery cursors, forward only; with webhooks on, the
//! outbox row of each message stored now (`store::outbox`); in multi-region mode, the
//! replication outbox row of each (`store::repl`).

use std::collections::{BTreeMap, HashMap, HashSet};

use sqlx::pool::PoolConnection;
use sqlx::{Postgres, QueryBuilder, Row};

use im_proto::MessageType;

use super::batch::{self, Change, Parties, Sorted};
use super::sql::{Sql, CHUNK};
use super::{Committed, CursorUpdate, NewMessage, StoreError};

/// The open transaction.
type Tx<'c> = sqlx::Transaction<'c, Postgres>;

/// A message's dedup key: (sender, conversation, client_msg_id).
type DedupKey = (String, String, String);

/// Which outboxes a commit writes a row per stored message to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outboxes {
    /// The webhook outbox (`store::outbox`).
    pub(crate) webhooks: bool,
    /// The replication outbox (`store::repl`).
    pub(crate) region: bool,
}

/// Commits one batch ([`Store::commit_batch`](super::Store::commit_batch)).
pub(crate) async fn commit_batch(
    conn: &mut PoolConnection<Postgres>,
    messages: &[NewMessage],
    cursors: &[CursorUpdate],
    outbox: Outboxes,
) -> Result<Vec<Committed>, StoreError> {
    let mut tx = sqlx::Connection::begin(&mut **conn).await?;
    let now = im_proto::now_ms();
    // 1. Dedup: every (sender, conversation, client_msg_id) already stored, then new
    //    versus duplicate (also within the batch).
    let found = stored_duplicates(&mut tx, messages).await?;
    let mut sorted = batch::sort(messages, |m| {
        let key = (
            m.sender.clone(),
            m.conversation_id.clone(),
            m.client_msg_id.clone(),
        );
        Ok(found.get(&key).cloned())
    })?;
    // 2. Seqs: one multi-row upsert reserves a gapless range per conversation.
    let mut next = reserve_seqs(&mut tx, &sorted.counts, now).await?;
    list_direct(&mut tx, &batch::direct_rows(&sorted.counts), now).await?;
    batch::assign_seqs(messages, &sorted.fresh, &mut next, &mut sorted.results, now);
    // 3. The new messages.
    let holes = insert_messages(&mut tx, messages, &mut sorted, now).await?;
    batch::mark_duplicates(&mut sorted.results, &sorted.dup_of);
    // 4. RECALL and EDIT events change the message they name, in seq order (a
    //    duplicate changed it when first stored).
    for change in batch::changes(messages, &sorted) {
        apply_change(&mut tx, &change, now).await?;
    }
    // 5. A sender has read their own messages: their read cursor moves to the last seq
    //    they sent in each conversation (forward only).
    let own: Vec<_> = batch::own_read_cursors(messages, &sorted.results)
        .into_iter()
        .collect();
    Sql::upsert_reads(&mut tx, &own, now, None).await?;
    // 6. Delivery cursors, forward only.
    delivery_cursors(&mut tx, cursors, outbox.region, now).await?;
    // 7. With webhooks on: one outbox row per message stored now, in this transaction.
    if outbox.webhooks {
        outbox_rows(&mut tx, &sorted, now).await?;
    }
    // 8. Multi-region: one replication outbox row per message stored now, and one per
    //    seq left a hole (published as a hole, so the other regions do not wait for it).
    if outbox.region {
        let mut rows: Vec<(&str, i64)> = batch::stored_now(&sorted).collect();
        rows.extend(holes.iter().map(|(c, seq)| (c.as_str(), *seq)));
        super::repl::outbox_rows(&mut tx, &rows).await?;
        let traced = batch::traced_now(messages, &sorted);
        if !traced.is_empty() {
            super::repl::mark_traced(&mut tx, &traced).await?;
        }
    }
    tx.commit().await?;
    Ok(batch::answers(sorted.results, now))
}

/// The webhook outbox's rows of the messages stored now (`store::outbox`).
async fn outbox_rows(tx: &mut Tx<'_>, sorted: &Sorted<'_>, now: i64) -> Result<(), StoreError> {
    let rows: Vec<(&str, i64)> = batch::stored_now(sorted).collect();
    for chunk in rows.chunks(CHUNK) {
        let mut qb = QueryBuilder::<Postgres>::new(
            "INSERT INTO webhook_outbox (conversation_id, seq, created_ms) ",
        );
        qb.push_values(chunk, |mut b, (conv, seq)| {
            b.push_bind(*conv).push_bind(*seq).push_bind(now);
        });
        qb.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// The stored messages with the (sender, conversation, client_msg_id) of the batch's
/// keyed messages: a join against the keys, so both engines probe the unique index
/// (SQLite scans the whole index for a row-value `IN (VALUES ...)`).
async fn stored_duplicates(
    tx: &mut Tx<'_>,
    messages: &[NewMessage],
) -> Result<HashMap<DedupKey, Committed>, StoreError> {
    let keyed: Vec<&NewMessage> = messages
        .iter()
        .filter(|m| !m.client_msg_id.is_empty())
        .collect();
    let mut found = HashMap::new();
    for chunk in keyed.chunks(CHUNK) {
        let mut qb = QueryBuilder::<Postgres>::new("WITH k (s, v, c) AS (");
        qb.push_values(chunk, |mut b, m| {
            b.push_bind(m.sender.as_str())
                .push_bind(m.conversation_id.as_str())
                .push_bind(m.client_msg_id.as_str());
        });
        qb.push(
            ") SELECT m.sender, m.client_msg_id, m.msg_id, m.conversation_id, m.seq, \
             m.send_time FROM k JOIN messages m \
             ON m.sender = k.s AND m.conversation_id = k.v AND m.client_msg_id = k.c",
        );
        for row in qb.build().fetch_all(&mut **tx).await? {
            let seq: i64 = row.try_get("seq")?;
            let key = (
                row.try_get("sender")?,
                row.try_get("conversation_id")?,
                row.try_get("client_msg_id")?,
            );
            let committed = Committed {
                msg_id: row.try_get("msg_id")?,
                conversation_id: row.try_get("conversation_id")?,
                seq: seq as u64,
                server_time: row.try_get("send_time")?,
                duplicate: true,
            };
            found.insert(key, committed);
        }
    }
    Ok(found)
}

/// Reserves each conversation's range of seqs (`counts`, in conversation order) with
/// one multi-row upsert per chunk (atomic on the row): the first seq of each range.
async fn reserve_seqs<'a>(
    tx: &mut Tx<'_>,
    counts: &BTreeMap<&'a str, (u64, Option<&Parties>)>,
    now: i64,
) -> Result<HashMap<&'a str, u64>, StoreError> {
    let counts: Vec<(&'a str, u64)> = counts.iter().map(|(&c, &(n, _))| (c, n)).collect();
    let mut next = HashMap::with_capacity(counts.len());
    for chunk in counts.chunks(CHUNK) {
        let mut qb = QueryBuilder::<Postgres>::new(
            "INSERT INTO conversations (conversation_id, last_seq, last_time) ",
        );
        qb.push_values(chunk, |mut b, (conv, n)| {
            b.push_bind(*conv).push_bind(*n as i64).push_bind(now);
        });
        qb.push(
            " ON CONFLICT (conversation_id) DO UPDATE \
             SET last_seq = conversations.last_seq + excluded.last_seq, \
             last_time = excluded.last_time \
             RETURNING conversation_id, last_seq",
        );
        let asked: HashMap<&str, u64> = chunk.iter().copied().collect();
        for row in qb.build().fetch_all(&mut **tx).await? {
            let conv: String = row.try_get(0)?;
            let last: i64 = row.try_get(1)?;
            if let Some((&id, &n)) = asked.get_key_value(conv.as_str()) {
                next.insert(id, last as u64 + 1 - n);
            }
        }
    }
    if next.len() != counts.len() {
        return Err(sqlx::Error::Protocol(
            "seq allocation returned fewer conversations than asked".into(),
        )
        .into());
    }
    Ok(next)
}

/// A one-to-one conversation is listed for both parties, with its last activity (the
/// conversation list's order).
async fn list_direct(tx: &mut Tx<'_>, rows: &[(&str, &str)], now: i64) -> Result<(), StoreError> {
    for chunk in rows.chunks(CHUNK) {
        let mut qb = QueryBuilder::<Postgres>::new(
            "INSERT INTO user_conversations (user_id, conversation_id, last_time) ",
        );
        qb.push_values(chunk, |mut b, (user, conv)| {
            b.push_bind(*user).push_bind(*conv).push_bind(now);
        });
        qb.push(
            " ON CONFLICT (user_id, conversation_id) DO UPDATE \
             SET last_time = excluded.last_time",
        );
        qb.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// Inserts the new messages at their seqs. A duplicate committed meanwhile by another
/// node loses here instead of failing the batch; it is re-read and acked as a
/// duplicate, and the seq reserved for it stays a hole: the holes are returned.
async fn insert_messages(
    tx: &mut Tx<'_>,
    messages: &[NewMessage],
    sorted: &mut Sorted<'_>,
    now: i64,
) -> Result<Vec<(String, i64)>, StoreError> {
    let mut holes = Vec::new();
    let fresh = sorted.fresh.clone();
    for chunk in fresh.chunks(CHUNK) {
        let mut qb = QueryBuilder::<Postgres>::new(
            "INSERT INTO messages (conversation_id, seq, msg_id, sender, \
             client_msg_id, msg_type, payload, send_time) ",
        );
        qb.push_values(chunk, |mut b, &i| {
            let m = &messages[i];
            let c = sorted.results[i].as_ref();
            let client = (!m.client_msg_id.is_empty()).then_some(m.client_msg_id.as_str());
            b.push_bind(m.conversation_id.as_str())
                .push_bind(c.map_or(0, |c| c.seq as i64))
                .push_bind(m.msg_id.as_str())
                .push_bind(m.sender.as_str())
                .push_bind(client)
                .push_bind(m.msg_type)
                .push_bind(m.payload.as_ref())
                .push_bind(now);
        });
        qb.push(" ON CONFLICT DO NOTHING RETURNING seq, conversation_id");
        let mut stored: HashSet<(String, i64)> = HashSet::new();
        for row in qb.build().fetch_all(&mut **tx).await? {
            stored.insert((row.try_get(1)?, row.try_get(0)?));
        }
        for &i in chunk {
            let m = &messages[i];
            let seq = sorted.results[i].as_ref().map_or(0, |c| c.seq as i64);
            if !stored.contains(&(m.conversation_id.clone(), seq)) {
                holes.push((m.conversation_id.clone(), seq));
                sorted.results[i] = Some(reread(tx, m).await?);
            }
        }
    }
    Ok(holes)
}

/// The message stored with `m`'s (sender, conversation, client_msg_id), as a duplicate.
async fn reread(tx: &mut Tx<'_>, m: &NewMessage) -> Result<Committed, StoreError> {
    let row = sqlx::query(
        "SELECT msg_id, seq, send_time FROM messages WHERE sender = $1 \
         AND conversation_id = $2 AND client_msg_id = $3",
    )
    .bind(m.sender.as_str())
    .bind(m.conversation_id.as_str())
    .bind(m.client_msg_id.as_str())
    .fetch_one(&mut **tx)
    .await?;
    let seq: i64 = row.try_get("seq")?;
    Ok(Committed {
        msg_id: row.try_get("msg_id")?,
        conversation_id: m.conversation_id.clone(),
        seq: seq as u64,
        server_time: row.try_get("send_time")?,
        duplicate: true,
    })
}

/// The RECALL or EDIT event changes the message it names, statement for statement as
/// on the SQLite commit thread (`store::sqlite_commit`, which says what each does).
async fn apply_change(tx: &mut Tx<'_>, c: &Change<'_>, now: i64) -> Result<(), StoreError> {
    let (m, conv, target) = (c.event, c.event.conversation_id.as_str(), c.target_seq());
    let empty: &[u8] = &[];
    sqlx::query(
        "UPDATE messages SET ref_seq = $3, ref_msg_id = $4 \
         WHERE conversation_id = $1 AND seq = $2",
    )
    .bind(conv)
    .bind(c.seq)
    .bind(target)
    .bind(c.target.msg_id.as_str())
    .execute(&mut **tx)
    .await?;
    match c.kind() {
        Some(MessageType::Recall) => {
            sqlx::query(
                "UPDATE messages SET state = 2, payload = $4, edit_time = 0 \
                 WHERE conversation_id = $1 AND seq = $2 AND msg_id = $3 \
                 AND msg_type NOT IN (3, 4, 5)",
            )
            .bind(conv)
            .bind(target)
            .bind(c.target.msg_id.as_str())
            .bind(empty)
            .execute(&mut **tx)
            .await?;
            sqlx::query(
                "UPDATE messages SET state = 2, payload = $3 \
                 WHERE conversation_id = $1 AND ref_seq = $2 AND ref_seq > 0 \
                 AND msg_type = 5",
            )
            .bind(conv)
            .bind(target)
            .bind(empty)
            .execute(&mut **tx)
            .await?;
        }
        Some(MessageType::Edit) => {
            let changed = sqlx::query(
                "UPDATE messages SET state = 1, payload = $4, edit_time = $5 \
                 WHERE conversation_id = $1 AND seq = $2 AND msg_id = $3 \
                 AND sender = $6 AND state <> 2 AND msg_type NOT IN (3, 4, 5)",
            )
            .bind(conv)
            .bind(target)
            .bind(c.target.msg_id.as_str())
            .bind(m.payload.as_ref())
            .bind(now)
            .bind(m.sender.as_str())
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if changed == 0 {
                sqlx::query(
                    "UPDATE messages SET state = 2, payload = $3 \
                     WHERE conversation_id = $1 AND seq = $2",
                )
                .bind(conv)
                .bind(c.seq)
                .bind(empty)
                .execute(&mut **tx)
                .await?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Delivery cursors, forward only: each device's, and the user's (the furthest of their
/// devices), in key order.
/// Multi-region (`region`): the moved device cursors also get replication outbox rows.
async fn delivery_cursors(
    tx: &mut Tx<'_>,
    cursors: &[CursorUpdate],
    region: bool,
    now: i64,
) -> Result<(), StoreError> {
    let (users, devices) = batch::delivery_cursors(cursors);
    Sql::upsert_devices(tx, &devices, "delivered_seq").await?;
    if region {
        Sql::region_cursors(tx, &devices, super::repl_cursors::DELIVERED, now).await?;
    }
    Sql::upsert_delivered(tx, &users).await
}
