//! The SQLite commit thread: where a batch of messages and delivery cursors is committed
//! on the embedded store. It owns its own connection on its own OS thread and runs the
//! whole transaction there, with cached prepared statements, one row per statement
//! step: a batch costs one hand-over and one wake-up, not a round trip between the
//! runtime and a worker thread per statement (sqlx's SQLite driver), which was most of
//! a paced one-to-one message's CPU.
//!
//! The transaction is the one `store::sql` runs on Postgres, statement for statement:
//! dedup by (sender, conversation, client_msg_id), a gapless seq range per conversation,
//! the one-to-one parties' conversation list rows, the messages, RECALL/EDIT changes,
//! the sender's read cursor, then the device and user delivery cursors, forward only.
//! It begins IMMEDIATE (the write lock is taken at once, waiting up to the busy timeout
//! for the other writer connection of the store, which commits group changes and reads
//! state), and after any failure the connection is closed and reopened on the next
//! batch, so a rolled-back or half-open transaction never swallows a later commit.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::oneshot;

use super::{batch, Committed, CursorUpdate, MessageRef, NewMessage, StoreError};

/// Batches that may wait for the thread (the persistence writer waits for each; more
/// pile up only behind a commit it gave up on).
const QUEUE: usize = 4;

/// Prepared statements kept by the connection.
const STATEMENT_CACHE: usize = 32;

/// A one-to-one conversation's two users.
type Parties = (String, String);

/// The submitting side of the commit thread; dropping it ends the thread.
pub(crate) struct CommitThread {
    tx: SyncSender<Job>,
}

struct Job {
    messages: Vec<NewMessage>,
    cursors: Vec<CursorUpdate>,
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
        Ok(CommitThread { tx })
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
            let out = commit_batch(&mut c, &job.messages, &job.cursors);
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
) -> Result<Vec<Committed>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = im_proto::now_ms();

    // 1. Dedup: decide new versus duplicate (stored before, or earlier in this batch),
    //    and count the new messages per conversation.
    let mut results: Vec<Option<Committed>> = vec![None; messages.len()];
    let mut fresh: Vec<usize> = Vec::with_capacity(messages.len());
    let mut first_of: HashMap<(&str, &str, &str), usize> = HashMap::new();
    let mut dup_of: Vec<(usize, usize)> = Vec::new();
    // Per conversation: its new messages, and its parties when one-to-one.
    let mut counts: BTreeMap<&str, (u64, Option<&Parties>)> = BTreeMap::new();
    for (i, m) in messages.iter().enumerate() {
        if !m.client_msg_id.is_empty() {
            let key = (
                m.sender.as_str(),
                m.conversation_id.as_str(),
                m.client_msg_id.as_str(),
            );
            if let Some(&j) = first_of.get(&key) {
                dup_of.push((i, j));
                continue;
            }
            if let Some(stored) = stored_duplicate(&tx, m)? {
                results[i] = Some(stored);
                continue;
            }
            first_of.insert(key, i);
        }
        fresh.push(i);
        counts
            .entry(m.conversation_id.as_str())
            .or_insert((0, m.direct.as_ref()))
            .0 += 1;
    }

    // 2. Seqs: reserve a gapless range per conversation, in conversation order.
    let mut next: HashMap<&str, u64> = HashMap::with_capacity(counts.len());
    let mut created: Vec<(&str, &str)> = Vec::new();
    {
        let mut reserve = tx.prepare_cached(
            "INSERT INTO conversations (conversation_id, last_seq, last_time) VALUES (?1, ?2, ?3) \
             ON CONFLICT (conversation_id) DO UPDATE \
             SET last_seq = conversations.last_seq + excluded.last_seq, \
             last_time = excluded.last_time RETURNING last_seq",
        )?;
        for (&conv, &(n, direct)) in &counts {
            let last: i64 = reserve.query_row(params![conv, n as i64, now], |r| r.get(0))?;
            next.insert(conv, last as u64 + 1 - n);
            if let Some((a, b)) = direct {
                // A one-to-one conversation: recorded for both parties, with its last
                // activity (the conversation list's order).
                created.push((a.as_str(), conv));
                created.push((b.as_str(), conv));
            }
        }
    }
    created.sort_unstable();
    created.dedup();
    {
        let mut listed = tx.prepare_cached(
            "INSERT INTO user_conversations (user_id, conversation_id, last_time) \
             VALUES (?1, ?2, ?3) ON CONFLICT (user_id, conversation_id) DO UPDATE \
             SET last_time = excluded.last_time",
        )?;
        for (user, conv) in &created {
            listed.execute(params![user, conv, now])?;
        }
    }
    batch::assign_seqs(messages, &fresh, &mut next, &mut results, now);

    // 3. The new messages. One stored meanwhile by the store's other connection loses
    //    here instead of failing the batch; it is re-read and acked as a duplicate.
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO messages (conversation_id, seq, msg_id, sender, client_msg_id, \
             msg_type, payload, send_time) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
             ON CONFLICT DO NOTHING",
        )?;
        for &i in &fresh {
            let m = &messages[i];
            let seq = results[i].as_ref().map_or(0, |c| c.seq as i64);
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
            let stored = stored_duplicate(&tx, m)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
            results[i] = Some(stored);
        }
    }
    batch::mark_duplicates(&mut results, &dup_of);

    // 4. RECALL and EDIT events change the message they name, in seq order.
    for &i in &fresh {
        let m = &messages[i];
        if let (Some(r), Some(c)) = (m.reference.as_ref(), results[i].as_ref()) {
            if !c.duplicate {
                apply_change(&tx, m, r, c.seq, now)?;
            }
        }
    }

    // 5. A sender has read their own messages: the read cursor moves to the last seq
    //    they sent in each conversation (forward only).
    let own = batch::own_read_cursors(messages, &results);
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

    // 6. Delivery cursors, forward only: each device's, and the user's (the furthest of
    //    their devices).
    if !cursors.is_empty() {
        let mut devices: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
        for c in cursors {
            let d = devices
                .entry((
                    c.user_id.as_str(),
                    c.device_id.as_str(),
                    c.conversation_id.as_str(),
                ))
                .or_insert(0);
            *d = (*d).max(c.seq);
        }
        let mut device = tx.prepare_cached(
            "INSERT INTO device_cursors (user_id, device_id, conversation_id, delivered_seq) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (user_id, device_id, conversation_id) \
             DO UPDATE SET delivered_seq = excluded.delivered_seq \
             WHERE excluded.delivered_seq > device_cursors.delivered_seq",
        )?;
        for ((user, dev, conv), seq) in &devices {
            device.execute(params![user, dev, conv, *seq as i64])?;
        }
        let mut user = tx.prepare_cached(
            "INSERT INTO cursors (user_id, conversation_id, seq) VALUES (?1, ?2, ?3) \
             ON CONFLICT (user_id, conversation_id) DO UPDATE SET seq = excluded.seq \
             WHERE excluded.seq > cursors.seq",
        )?;
        for ((u, conv), seq) in &batch::furthest_cursors(cursors) {
            user.execute(params![u, conv, *seq as i64])?;
        }
    }

    tx.commit()?;
    Ok(batch::answers(results, now))
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

/// Applies a committed RECALL or EDIT event (at `seq`) to the message it names: the
/// event row gets its reference; a recall empties the original (and the EDIT events of
/// it), an edit replaces its payload unless it was recalled meanwhile (then the EDIT
/// event itself is emptied, so a reader never finds the recalled text in it).
fn apply_change(
    tx: &rusqlite::Transaction<'_>,
    m: &NewMessage,
    r: &MessageRef,
    seq: u64,
    now: i64,
) -> Result<(), StoreError> {
    let conv = m.conversation_id.as_str();
    let target = r.seq.min(i64::MAX as u64) as i64;
    let empty: &[u8] = &[];
    tx.prepare_cached(
        "UPDATE messages SET ref_seq = ?3, ref_msg_id = ?4 \
         WHERE conversation_id = ?1 AND seq = ?2",
    )?
    .execute(params![conv, seq as i64, target, r.msg_id])?;
    if m.msg_type == im_proto::MessageType::Recall as i32 {
        tx.prepare_cached(
            "UPDATE messages SET state = 2, payload = ?4, edit_time = 0 \
             WHERE conversation_id = ?1 AND seq = ?2 AND msg_id = ?3 \
             AND msg_type NOT IN (3, 4, 5)",
        )?
        .execute(params![conv, target, r.msg_id, empty])?;
        tx.prepare_cached(
            "UPDATE messages SET state = 2, payload = ?3 \
             WHERE conversation_id = ?1 AND ref_seq = ?2 AND ref_seq > 0 AND msg_type = 5",
        )?
        .execute(params![conv, target, empty])?;
    } else if m.msg_type == im_proto::MessageType::Edit as i32 {
        let changed = tx
            .prepare_cached(
                "UPDATE messages SET state = 1, payload = ?4, edit_time = ?5 \
                 WHERE conversation_id = ?1 AND seq = ?2 AND msg_id = ?3 \
                 AND sender = ?6 AND state <> 2 AND msg_type NOT IN (3, 4, 5)",
            )?
            .execute(params![
                conv,
                target,
                r.msg_id,
                m.payload.as_ref(),
                now,
                m.sender
            ])?;
        if changed == 0 {
            tx.prepare_cached(
                "UPDATE messages SET state = 2, payload = ?3 \
                 WHERE conversation_id = ?1 AND seq = ?2",
            )?
            .execute(params![conv, seq as i64, empty])?;
        }
    }
    Ok(())
}
