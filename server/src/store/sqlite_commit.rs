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
//!
//! The webhook outbox's own writes (`store::sqlite_outbox`) ride on the same thread:
//! they wait up to [`RIDE_WAIT`] for a message batch and join its transaction, each
//! under a savepoint (one that fails is rolled back alone and answered with its error;
//! the batch commits), or commit alone when no batch comes.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::oneshot;

use im_proto::MessageType;

use super::batch::{self, Change};
use super::outbox::OutboxWrite;
use super::sqlite_outbox::{self, Rider};
use super::{Committed, CursorUpdate, NewMessage, StoreError};

/// Batches that may wait for the thread (the persistence writer waits for each; more
/// pile up only behind a commit it gave up on), and a wake-up for the outbox's writes.
const QUEUE: usize = 5;

/// How long an outbox write waits for a message batch to ride in before it commits
/// alone.
pub(crate) const RIDE_WAIT: Duration = Duration::from_millis(20);

/// Outbox writes joining one transaction at most (the expander's and one per endpoint's
/// sender are outstanding at a time, so this is rarely reached).
const MAX_RIDERS: usize = 16;

/// Prepared statements kept by the connection.
const STATEMENT_CACHE: usize = 32;

/// The submitting side of the commit thread; dropping it ends the thread.
pub(crate) struct CommitThread {
    tx: SyncSender<Job>,
    /// Whether each batch also writes its webhook outbox rows (`store::outbox`).
    outbox: Arc<AtomicBool>,
    /// Outbox writes waiting for a transaction to ride in.
    riders: Arc<Riders>,
}

/// What the thread is handed.
enum Job {
    /// A batch to commit.
    Batch(Batch),
    /// An outbox write was queued while no batch was: start its wait.
    Wake,
}

struct Batch {
    messages: Vec<NewMessage>,
    cursors: Vec<CursorUpdate>,
    outbox: bool,
    reply: oneshot::Sender<Result<Vec<Committed>, StoreError>>,
}

/// Outbox writes waiting, with when the oldest came.
#[derive(Default)]
struct Riders {
    waiting: Mutex<(Vec<Rider>, Option<Instant>)>,
}

impl Riders {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<Rider>, Option<Instant>)> {
        // A panic while holding it leaves a valid list: keep going.
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues one; true when it is the first waiting (the thread needs a wake-up).
    fn push(&self, rider: Rider) -> bool {
        let mut w = self.lock();
        w.0.push(rider);
        w.1.get_or_insert_with(Instant::now);
        w.0.len() == 1
    }

    /// When the oldest waiting write stops waiting for a batch.
    fn due(&self) -> Option<Instant> {
        self.lock().1.map(|t| t + RIDE_WAIT)
    }

    /// Takes up to [`MAX_RIDERS`], oldest first.
    fn take(&self) -> Vec<Rider> {
        let mut w = self.lock();
        let n = w.0.len().min(MAX_RIDERS);
        let taken: Vec<Rider> = w.0.drain(..n).collect();
        w.1 = (!w.0.is_empty()).then(Instant::now);
        taken
    }
}

impl CommitThread {
    /// Opens the connection (errors are the caller's) and starts the thread.
    pub(crate) fn start(path: &Path, full_sync: bool) -> Result<Self, StoreError> {
        let conn = open(path, full_sync)?;
        let (tx, rx) = sync_channel(QUEUE);
        let path = path.to_owned();
        let riders = Arc::<Riders>::default();
        let thread = Thread {
            conn: Some(conn),
            path,
            full_sync,
            riders: riders.clone(),
        };
        std::thread::Builder::new()
            .name("im-sqlite-commit".into())
            .spawn(move || thread.run(rx))?;
        Ok(CommitThread {
            tx,
            outbox: Arc::default(),
            riders,
        })
    }

    /// Runs one outbox write in the thread's next transaction: the stored events' row
    /// ids of an expansion, nothing for outcomes.
    pub(crate) async fn outbox_write(&self, write: OutboxWrite) -> Result<Vec<i64>, StoreError> {
        let (reply, done) = oneshot::channel();
        if self.riders.push(Rider { write, reply }) {
            match self.tx.try_send(Job::Wake) {
                // Full: batches are queued, and the thread takes the write with the next.
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => return Err(StoreError::WriterGone),
            }
        }
        done.await.unwrap_or(Err(StoreError::WriterGone))
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
        let job = Job::Batch(Batch {
            messages: messages.to_vec(),
            cursors: cursors.to_vec(),
            outbox: self.outbox.load(Ordering::Relaxed),
            reply,
        });
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
    // The checkpointer thread does the checkpoints (`store::sqlite_checkpoint`), and a
    // reset log is cut back to its limit.
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(
        None,
        "journal_size_limit",
        super::sqlite_checkpoint::JOURNAL_SIZE_LIMIT,
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// The thread's side: its connection (none after a failure, until the next transaction
/// opens one) and the outbox writes waiting.
struct Thread {
    conn: Option<Connection>,
    path: std::path::PathBuf,
    full_sync: bool,
    riders: Arc<Riders>,
}

impl Thread {
    fn run(mut self, rx: Receiver<Job>) {
        loop {
            let job = match self.riders.due() {
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(due) => rx.recv_timeout(due.saturating_duration_since(Instant::now())),
            };
            match job {
                Ok(Job::Batch(batch)) if batch.reply.is_closed() => {
                    // Given up on (past the write bound) before it started: not tried,
                    // not acked.
                }
                Ok(Job::Batch(batch)) => {
                    let riders = self.riders.take();
                    let out = self.transaction(Some(&batch), riders);
                    let _ = batch.reply.send(out);
                }
                Ok(Job::Wake) => {}
                Err(RecvTimeoutError::Timeout) => {
                    let riders = self.riders.take();
                    let _ = self.transaction(None, riders);
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    /// One transaction: the batch, if any, then the riders, each under its savepoint;
    /// every rider is answered here.
    fn transaction(
        &mut self,
        batch: Option<&Batch>,
        riders: Vec<Rider>,
    ) -> Result<Vec<Committed>, StoreError> {
        let c = match self.conn.take() {
            Some(c) => Ok(c),
            None => open(&self.path, self.full_sync),
        };
        let mut rode = Vec::with_capacity(riders.len());
        let out = c.and_then(|mut c| {
            let out = commit(&mut c, batch, &riders, &mut rode);
            if out.is_ok() && c.is_autocommit() {
                self.conn = Some(c);
            } else {
                // The connection's state is in doubt: closing it rolls back whatever it
                // held (none of it acked); the next transaction opens a new one.
                metrics::counter!("im_store_connection_resets_total").increment(1);
            }
            out
        });
        let failed = out.as_ref().err().map(ToString::to_string);
        let mut rode = rode.into_iter();
        for rider in riders {
            let answer = match (&failed, rode.next()) {
                (None, Some(Ok(ids))) => Ok(ids),
                (None, Some(Err(e))) => Err(StoreError::Io(std::io::Error::other(e))),
                (Some(e), _) => Err(StoreError::Io(std::io::Error::other(e.clone()))),
                (None, None) => Err(StoreError::WriterGone),
            };
            let _ = rider.reply.send(answer);
        }
        out
    }
}

/// The transaction on `conn`: `batch`'s writes (see the module header), then each
/// rider's under a savepoint, its result pushed to `rode` (an error as its text).
fn commit(
    conn: &mut Connection,
    batch: Option<&Batch>,
    riders: &[Rider],
    rode: &mut Vec<Result<Vec<i64>, String>>,
) -> Result<Vec<Committed>, StoreError> {
    let mut tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let answers = match batch {
        Some(b) => write_batch(&tx, &b.messages, &b.cursors, b.outbox)?,
        None => Vec::new(),
    };
    for rider in riders {
        let mut sp = tx.savepoint()?;
        match sqlite_outbox::apply(&sp, &rider.write) {
            Ok(ids) => {
                sp.commit()?;
                rode.push(Ok(ids));
            }
            Err(e) => {
                sp.rollback()?;
                rode.push(Err(e.to_string()));
            }
        }
    }
    tx.commit()?;
    Ok(answers)
}

/// A batch's writes in transaction `tx`; see the module header.
pub(crate) fn write_batch(
    tx: &rusqlite::Transaction<'_>,
    messages: &[NewMessage],
    cursors: &[CursorUpdate],
    outbox: bool,
) -> Result<Vec<Committed>, StoreError> {
    let now = im_proto::now_ms();
    // 1. Dedup: new versus duplicate (stored before, or earlier in this batch).
    let mut sorted = batch::sort(messages, |m| stored_duplicate(tx, m))?;
    // 2. Seqs: a gapless range per conversation, in conversation order.
    let mut next = reserve_seqs(tx, &sorted.counts, now)?;
    list_direct(tx, &batch::direct_rows(&sorted.counts), now)?;
    batch::assign_seqs(messages, &sorted.fresh, &mut next, &mut sorted.results, now);
    // 3. The new messages.
    insert_messages(tx, messages, &mut sorted, now)?;
    batch::mark_duplicates(&mut sorted.results, &sorted.dup_of);
    // 4. RECALL and EDIT events change the message they name, in seq order.
    for change in batch::changes(messages, &sorted) {
        apply_change(tx, &change, now)?;
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
        delivery_cursors(tx, cursors)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::outbox::NewEvent;

    fn message(n: u32) -> NewMessage {
        NewMessage {
            conversation_id: "u:a:b".into(),
            sender: "a".into(),
            client_msg_id: format!("c{n}"),
            msg_type: MessageType::Text as i32,
            payload: bytes::Bytes::from_static(b"hi"),
            msg_id: format!("m{n}"),
            direct: Some(("a".into(), "b".into())),
            reference: None,
            traced: false,
        }
    }

    fn rider(write: OutboxWrite) -> Rider {
        Rider {
            write,
            reply: oneshot::channel().0,
        }
    }

    fn count(conn: &Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    #[tokio::test]
    async fn a_failing_outbox_write_is_rolled_back_alone_and_the_batch_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("im.db");
        drop(
            crate::store::SqliteStore::open(&path, true, 1)
                .await
                .unwrap(),
        );
        let mut conn = open(&path, true).unwrap();
        let batch = Batch {
            messages: vec![message(1), message(2)],
            cursors: Vec::new(),
            outbox: true,
            reply: oneshot::channel().0,
        };
        let now = im_proto::now_ms();
        let event = NewEvent {
            endpoint: "push".into(),
            event_id: "e1".into(),
            kind: "message.created".into(),
            body: "{}".into(),
            created_ms: now,
            next_ms: now,
            parked: false,
        };
        // A first expansion stores its event; then the events' table goes, so the
        // second one fails inside the same transaction as the batch.
        let first = [rider(OutboxWrite::Expand {
            done: Vec::new(),
            events: vec![event.clone()],
            merges: Vec::new(),
        })];
        let mut rode = Vec::new();
        commit(&mut conn, None, &first, &mut rode).unwrap();
        assert!(matches!(rode.as_slice(), [Ok(ids)] if ids.len() == 1));
        conn.execute_batch("ALTER TABLE webhook_deliveries RENAME TO gone")
            .unwrap();
        let riders = [
            rider(OutboxWrite::Expand {
                done: Vec::new(),
                events: vec![event],
                merges: Vec::new(),
            }),
            rider(OutboxWrite::Settle(Vec::new())),
        ];
        let mut rode = Vec::new();
        let answers = commit(&mut conn, Some(&batch), &riders, &mut rode).unwrap();
        assert_eq!(answers.iter().map(|c| c.seq).collect::<Vec<_>>(), [1, 2]);
        assert!(rode[0].is_err(), "the expansion failed: {:?}", rode[0]);
        assert!(rode[1].is_ok(), "the empty settle rode: {:?}", rode[1]);
        assert!(conn.is_autocommit());
        assert_eq!(count(&conn, "messages"), 2, "the batch committed");
        assert_eq!(count(&conn, "webhook_outbox"), 2, "with its outbox rows");
        assert_eq!(count(&conn, "gone"), 1, "the failed expansion left nothing");
    }
}
