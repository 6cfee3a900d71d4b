//! The SQLite commit thread: where a batch of messages and delivery cursors is committed
//! on the embedded store. It owns its own connection on its own OS thread and runs the
//! whole transaction there, with cached prepared statements, one row per statement
//! step: a batch costs one hand-over and one wake-up, not a round trip between the
//! runtime and a worker thread per statement (sqlx's SQLite driver), which was most of
//! a paced one-to-one message's CPU.
//!
//! The transaction is the one `store::postgres_commit` runs on Postgres, statement for statement:
//! dedup by (sender, conversation, client_msg_id), a gapless seq range per conversation,
//! the one-to-one parties' conversation list rows, the messages, RECALL/EDIT changes,
//! the sender's read cursor, then the device and user delivery cursors, forward only,
//! and with webhooks on, the outbox row of each message stored now (`store::outbox`).
//! It begins IMMEDIATE (the write lock is taken at once, waiting up to the busy timeout
//! for the other writer connection of the store, which commits group changes and reads
//! state), and after any failure the connection is closed and reopened on the next
//! batch, so a rolled-back or half-open transaction never swallows a later commit.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::oneshot;

use im_proto::MessageType;

use super::batch::{self, Change};
use super::{Committed, CursorUpdate, NewMessage, StoreError};

/// Batches that may wait for the thread (the persistence writer waits for each; more
/// pile up only behind a commit it gave up on).
const QUEUE: usize = 4;

/// Prepared statements kept by the connection.
const STATEMENT_CACHE: usize = 32;

/// The submitting side of the commit thread; dropping it ends the thread.
pub(crate) struct CommitThread {
    tx: SyncSender<Job>,
    /// Whether each batch also writes its webhook outbox rows (`store::outbox`).
    outbox: Arc<AtomicBool>,
}

struct Job {
    messages: Vec<NewMessage>,
    cursors: Vec<CursorUpdate>,
    outbox: bool,
    reply: oneshot::Sender<Result<Vec<Committed>, StoreError>>,
}

impl CommitThread {
    /// Opens the connection (errors are the caller's) and starts the thread.
    pub(crate) fn start(path: &Path, full_sync: bool) -> Result<Self, StoreError> {
        let conn = open(path, full_sync)?;
        let (tx, rx) = sync_channel(QUEUE);
        let path = path.to_owned();
        std::thread::Builder::new()
            .name("im-sqlite-commit".into())
            .spawn(move || run(Some(conn), &path, full_sync, rx))?;
        Ok(CommitThread {
            tx,
            outbox: Arc::default(),
        })
    }

    /// Whether batches write webhook outbox rows now.
    pub(crate) fn outbox_on(&self) -> bool {
        self.outbox.load(Ordering::Relaxed)
    }

    /// Whether later batches write webhook outbox rows.
    pub(crate) fn set_outbox(&self, on: bool) {
        self.outbox.store(on, Ordering::Relaxed);
    }

    /// Commits one batch on the thread ([`Store::commit_batch`](super::Store::commit_batch)).
    pub(crate) async fn commit(
        &self,
        messages: &[NewMessage],
        cursors: &[CursorUpdate],
    ) -> Result<Vec<Committed>, StoreError> {
        let (reply, done) = oneshot::channel();
        let job = Job {
            messages: messages.to_vec(),
            cursors: cursors.to_vec(),
            outbox: self.outbox.load(Ordering::Relaxed),
            reply,
        };
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(StoreError::Timeout(Duration::ZERO)),
            Err(TrySendError::Disconnected(_)) => return Err(StoreError::WriterGone),
        }
        done.await.unwrap_or(Err(StoreError::WriterGone))
    }
}

/// The writer connection: WAL, `synchronous` FULL (or NORMAL), a 10 s busy timeout.
fn open(path: &Path, full_sync: bool) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(Duration::from_secs(10))?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::BadRequest(format!(
            "the database file {} cannot use the WAL journal (it is in {mode} mode)",
            path.display()
        )));
    }
    conn.pragma_update(
        None,
        "synchronous",
        if full_sync { "FULL" } else { "NORMAL" },
    )?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

fn run(mut conn: Option<Connection>, path: &Path, full_sync: bool, rx: Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        if job.reply.is_closed() {
            // Given up on (past the write bound) before it started: not tried, not acked.
            continue;
        }
        let c = match conn.take() {
            Some(c) => Ok(c),
            None => open(path, full_sync),
        };
        let out = c.and_then(|mut c| {
            let out = commit_batch(&mut c, &job.messages, &job.cursors, job.outbox);
            if out.is_ok() && c.is_autocommit() {
                conn = Some(c);
            } else {
                // The connection's state is in doubt: closing it rolls back whatever it
                // held (none of it acked); the next batch opens a new one.
                metrics::counter!("im_store_connection_resets_total").increment(1);
            }
            out
        });
        let _ = job.reply.send(out);
    }
}

/// The batch's transaction; see the module header.
pub(crate) fn commit_batch(
    conn: &mut Connection,
    messages: &[NewMessage],
    cursors: &[CursorUpdate],
    outbox: bool,
) -> Result<Vec<Committed>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = im_proto::now_ms();
    // 1. Dedup: new versus duplicate (stored before, or earlier in this batch).
    let mut sorted = batch::sort(messages, |m| stored_duplicate(&tx, m))?;
    // 2. Seqs: a gapless range per conversation, in conversation order.
    let mut next = reserve_seqs(&tx, &sorted.counts, now)?;
    list_direct(&tx, &batch::direct_rows(&sorted.counts), now)?;
    batch::assign_seqs(messages, &sorted.fresh, &mut next, &mut sorted.results, now);
    // 3. The new messages.
    insert_messages(&tx, messages, &mut sorted, now)?;
    batch::mark_duplicates(&mut sorted.results, &sorted.dup_of);
    // 4. RECALL and EDIT events change the message they name, in seq order.
    for change in batch::changes(messages, &sorted) {
        apply_change(&tx, &change, now)?;
    }
    // 5. A sender has read their own messages: the read cursor moves to the last seq
    //    they sent in each conversation (forward only).
    let own = batch::own_read_cursors(messages, &sorted.results);
    if !own.is_empty() {
        let mut read = tx.prepare_cached(
            "INSERT INTO conversation_state (user_id, conversation_id, read_seq, read_time) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (user_id, conversation_id) DO UPDATE \
             SET read_seq = excluded.read_seq, read_time = excluded.read_time \
             WHERE excluded.read_seq > conversation_state.read_seq",
        )?;
        for ((user, conv), seq) in &own {
            read.execute(params![user, conv, seq, now])?;
        }
    }
    // 6. Delivery cursors, forward only.
    if !cursors.is_empty() {
        delivery_cursors(&tx, cursors)?;
    }
    // 7. With webhooks on: one outbox row per message stored now, in this transaction.
    if outbox {
        let mut row = tx.prepare_cached(
            "INSERT INTO webhook_outbox (conversation_id, seq, created_ms) VALUES (?1, ?2, ?3)",
        )?;
        for (conv, seq) in batch::stored_now(&sorted) {
            row.execute(params![conv, seq, now])?;
        }
    }
    tx.commit()?;
    Ok(batch::answers(sorted.results, now))
}

/// Reserves each conversation's range of seqs (`counts`, in conversation order): the
/// first seq of each range.
fn reserve_seqs<'a>(
    tx: &rusqlite::Transaction<'_>,
    counts: &BTreeMap<&'a str, (u64, Option<&batch::Parties>)>,
    now: i64,
) -> Result<HashMap<&'a str, u64>, StoreError> {
    let mut next = HashMap::with_capacity(counts.len());
    let mut reserve = tx.prepare_cached(
        "INSERT INTO conversations (conversation_id, last_seq, last_time) VALUES (?1, ?2, ?3) \
         ON CONFLICT (conversation_id) DO UPDATE \
         SET last_seq = conversations.last_seq + excluded.last_seq, \
         last_time = excluded.last_time RETURNING last_seq",
    )?;
    for (&conv, &(n, _)) in counts {
        let last: i64 = reserve.query_row(params![conv, n as i64, now], |r| r.get(0))?;
        next.insert(conv, last as u64 + 1 - n);
    }
    Ok(next)
}

/// A one-to-one conversation is listed for both parties, with its last activity (the
/// conversation list's order).
fn list_direct(
    tx: &rusqlite::Transaction<'_>,
    rows: &[(&str, &str)],
    now: i64,
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut listed = tx.prepare_cached(
        "INSERT INTO user_conversations (user_id, conversation_id, last_time) \
         VALUES (?1, ?2, ?3) ON CONFLICT (user_id, conversation_id) DO UPDATE \
         SET last_time = excluded.last_time",
    )?;
    for (user, conv) in rows {
        listed.execute(params![user, conv, now])?;
    }
    Ok(())
}

/// Inserts the new messages at their seqs. One stored meanwhile by the store's other
/// connection loses here instead of failing the batch; it is re-read and acked as a
/// duplicate.
fn insert_messages(
    tx: &rusqlite::Transaction<'_>,
    messages: &[NewMessage],
    sorted: &mut batch::Sorted<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO messages (conversation_id, seq, msg_id, sender, client_msg_id, \
         msg_type, payload, send_time) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
         ON CONFLICT DO NOTHING",
    )?;
    for &i in &sorted.fresh {
        let m = &messages[i];
        let seq = sorted.results[i].as_ref().map_or(0, |c| c.seq as i64);
        let client = (!m.client_msg_id.is_empty()).then_some(m.client_msg_id.as_str());
        let stored = insert.execute(params![
            m.conversation_id,
            seq,
            m.msg_id,
            m.sender,
            client,
            m.msg_type,
            m.payload.as_ref(),
            now
        ])?;
        if stored == 1 {
            continue;
        }
        let stored = stored_duplicate(tx, m)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
        sorted.results[i] = Some(stored);
    }
    Ok(())
}

/// Each device's delivery cursor and each user's (the furthest of their devices).
fn delivery_cursors(
    tx: &rusqlite::Transaction<'_>,
    cursors: &[CursorUpdate],
) -> Result<(), StoreError> {
    let (users, devices) = batch::delivery_cursors(cursors);
    let mut device = tx.prepare_cached(
        "INSERT INTO device_cursors (user_id, device_id, conversation_id, delivered_seq) \
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (user_id, device_id, conversation_id) \
         DO UPDATE SET delivered_seq = excluded.delivered_seq \
         WHERE excluded.delivered_seq > device_cursors.delivered_seq",
    )?;
    for (((user, dev), conv), seq) in &devices {
        device.execute(params![user, dev, conv, *seq as i64])?;
    }
    let mut user = tx.prepare_cached(
        "INSERT INTO cursors (user_id, conversation_id, seq) VALUES (?1, ?2, ?3) \
         ON CONFLICT (user_id, conversation_id) DO UPDATE SET seq = excluded.seq \
         WHERE excluded.seq > cursors.seq",
    )?;
    for ((u, conv), seq) in &users {
        user.execute(params![u, conv, *seq as i64])?;
    }
    Ok(())
}

/// The stored message with `m`'s (sender, conversation, client_msg_id), as a duplicate's
/// result: found before the batch (step 1) or stored meanwhile by the other connection
/// (step 3).
fn stored_duplicate(
    tx: &rusqlite::Transaction<'_>,
    m: &NewMessage,
) -> Result<Option<Committed>, StoreError> {
    let found = tx
        .prepare_cached(
            "SELECT msg_id, seq, send_time FROM messages \
             WHERE sender = ?1 AND conversation_id = ?2 AND client_msg_id = ?3",
        )?
        .query_row(params![m.sender, m.conversation_id, m.client_msg_id], |r| {
            Ok(Committed {
                msg_id: r.get(0)?,
                conversation_id: m.conversation_id.clone(),
                seq: r.get::<_, i64>(1)? as u64,
                server_time: r.get(2)?,
                duplicate: true,
            })
        })
        .optional()?;
    Ok(found)
}

/// Applies a committed RECALL or EDIT event to the message it names: the event row
/// gets its reference; a recall empties the original (and the EDIT events of it), an
/// edit replaces its payload unless it was recalled meanwhile (then the EDIT event
/// itself is emptied, so a reader never finds the recalled text in it).
fn apply_change(
    tx: &rusqlite::Transaction<'_>,
    c: &Change<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let (m, conv, target) = (c.event, c.event.conversation_id.as_str(), c.target_seq());
    let empty: &[u8] = &[];
    tx.prepare_cached(
        "UPDATE messages SET ref_seq = ?3, ref_msg_id = ?4 \
         WHERE conversation_id = ?1 AND seq = ?2",
    )?
    .execute(params![conv, c.seq, target, c.target.msg_id])?;
    match c.kind() {
        Some(MessageType::Recall) => {
            tx.prepare_cached(
                "UPDATE messages SET state = 2, payload = ?4, edit_time = 0 \
                 WHERE conversation_id = ?1 AND seq = ?2 AND msg_id = ?3 \
                 AND msg_type NOT IN (3, 4, 5)",
            )?
            .execute(params![conv, target, c.target.msg_id, empty])?;
            tx.prepare_cached(
                "UPDATE messages SET state = 2, payload = ?3 \
                 WHERE conversation_id = ?1 AND ref_seq = ?2 AND ref_seq > 0 AND msg_type = 5",
            )?
            .execute(params![conv, target, empty])?;
        }
        Some(MessageType::Edit) => {
            let changed = tx
                .prepare_cached(
                    "UPDATE messages SET state = 1, payload = ?4, edit_time = ?5 \
                     WHERE conversation_id = ?1 AND seq = ?2 AND msg_id = ?3 \
                     AND sender = ?6 AND state <> 2 AND msg_type NOT IN (3, 4, 5)",
                )?
                .execute(params![
                    conv,
                    target,
                    c.target.msg_id,
                    m.payload.as_ref(),
                    now,
                    m.sender
                ])?;
            if changed == 0 {
                tx.prepare_cached(
                    "UPDATE messages SET state = 2, payload = ?3 \
                     WHERE conversation_id = ?1 AND seq = ?2",
                )?
                .execute(params![conv, c.seq, empty])?;
            }
        }
        _ => {}
    }
    Ok(())
}
