//! Multi-region replication's side of the store (Postgres only; docs/multi-region.md):
//! the `region_outbox` rows a home commit writes and the publisher drains
//! ([`Replication::outbox_take`], [`Replication::outbox_done`]), the record each row is
//! published as ([`Record`], with the group's membership state on a group's SYSTEM
//! event), and the apply of another region's record ([`Replication::apply`]): one
//! transaction that inserts the message at its origin seq and moves the
//! conversation's applied seq (`conversations.last_seq`) only when the record is the
//! next one, so nothing is applied twice or out of order. Also the Postgres advisory
//! lock that elects one publisher and one applier per region ([`Replication::lead`]).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Postgres, Row};

use super::repl_cursors::CursorMove;
use super::{ReadMoved, StoreError};

/// Most rows one [`Replication::outbox_take`] returns.
pub const MAX_TAKE: u32 = 1000;

/// Outbox rows per multi-row insert (2 binds each).
const OUTBOX_CHUNK: usize = 1000;

/// One replicated message, as published on a region's stream (JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The home region that committed it.
    pub region: String,
    /// Its conversation.
    pub conversation_id: String,
    /// Its seq there.
    pub seq: u64,
    /// Its id.
    pub msg_id: String,
    /// Its sender ("" for SYSTEM).
    pub sender: String,
    /// The client's idempotency key, when one was given.
    pub client_msg_id: Option<String>,
    /// `MessageType` as its wire value.
    pub msg_type: i32,
    /// The stored payload, base64.
    pub payload: String,
    /// Commit time at the home, ms.
    pub send_time: i64,
    /// RECALL and EDIT: the seq of the message they change (0: none).
    pub ref_seq: i64,
    /// RECALL and EDIT: the id of the message they change.
    pub ref_msg_id: Option<String>,
    /// Stored state when read for publishing (0 original, 1 edited, 2 recalled).
    pub state: i32,
    /// When it was last edited, ms.
    pub edit_time: i64,
    /// A group's SYSTEM event: the group's membership state as read for publishing
    /// (at this event's version or later).
    pub group: Option<GroupSnapshot>,
    /// A seq the home reserved and left empty (a duplicate that lost a race at the
    /// commit): applied as the seq passing by, with no message.
    #[serde(default)]
    pub hole: bool,
    /// The message is traced (`obs::trace`): the publisher and the appliers record
    /// their stages under its msg_id (absent from an untraced record and from an older
    /// release's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub traced: bool,
    /// The home epoch it was committed under (0: the hash rule's home; `store::homes`).
    #[serde(default)]
    pub epoch: u64,
    /// A home move instead of a message: the conversation's new home from `epoch` on
    /// (published by the new home; applied by `region_home`, never as a message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<HomeMove>,
    /// The outbox row it came from (not published).
    #[serde(skip)]
    pub outbox_id: i64,
}

/// A home move as it travels in a replication record (`Record::home`; `store::homes`
/// records it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeMove {
    /// The new epoch.
    pub epoch: u64,
    /// The home from this epoch on.
    pub region: String,
    /// The last seq of the epoch before: records of older epochs above it are fenced.
    pub fence: u64,
}

/// A group's membership state at its home: the group row, members, intervals, bans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshot {
    /// The group.
    pub group_id: String,
    /// Its creator.
    pub created_by: String,
    /// When it was made, ms.
    pub created_at: i64,
    /// `Kind` as stored.
    pub kind: i32,
    /// Members may invite.
    pub members_can_invite: i32,
    /// The seq of its last membership change.
    pub version: i64,
    /// 1 once dissolved.
    pub dissolved: i32,
    /// Member count.
    pub size: i32,
    /// (user, joined_at, role).
    pub members: Vec<(String, i64, i32)>,
    /// (user, joined_seq, left_seq).
    pub intervals: Vec<(String, i64, Option<i64>)>,
    /// (user, banned_by, banned_at).
    pub bans: Vec<(String, String, i64)>,
}

impl Record {
    /// The JetStream `Nats-Msg-Id` of this record: `<region>:<conversation>:<seq>`.
    pub fn msg_id_header(&self) -> String {
        if let Some(h) = &self.home {
            return format!("{}:{}:home{}", self.region, self.conversation_id, h.epoch);
        }
        format!("{}:{}:{}", self.region, self.conversation_id, self.seq)
    }

    /// The stored payload (`payload` decoded); an error for a payload that is not
    /// base64 (a malformed record: never applied as an empty payload).
    pub fn payload_bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.decode(&self.payload)
    }

    /// The message as a reader gets it pushed.
    pub fn chat_message(&self) -> im_proto::ChatMessage {
        use base64::Engine as _;
        let payload = base64::engine::general_purpose::STANDARD
            .decode(&self.payload)
            .unwrap_or_default();
        let row = super::MessageRow {
            conversation_id: self.conversation_id.clone(),
            sender: self.sender.clone(),
            payload,
            send_time: self.send_time,
            msg_type: self.msg_type,
            seq: self.seq as i64,
            msg_id: self.msg_id.clone(),
            client_msg_id: self.client_msg_id.clone(),
            ref_seq: self.ref_seq,
            ref_msg_id: self.ref_msg_id.clone(),
            state: self.state,
            edit_time: self.edit_time,
        };
        super::render_message(row, false)
    }
}

/// What [`Replication::apply`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// It was the next seq: stored, the applied seq moved.
    Stored,
    /// It was the next seq and a hole: the applied seq moved, nothing to push.
    Hole,
    /// Its seq was applied before: nothing changed.
    Duplicate,
    /// A seq before it is missing (the applied seq is given): nothing changed.
    Gap(u64),
}

/// The Postgres session that holds a replication role's advisory lock; the lock goes
/// with the connection.
pub struct Leader {
    conn: PgConnection,
}

impl Leader {
    /// Whether the session (and so the lock) is still there.
    pub async fn alive(&mut self) -> bool {
        sqlx::query("SELECT 1")
            .execute(&mut self.conn)
            .await
            .is_ok()
    }
}

/// The replication side of a store (Postgres).
#[async_trait::async_trait]
pub trait Replication: Send + Sync {
    /// Whether later commits (messages and group changes) write `region_outbox` rows.
    fn set_region_outbox(&self, on: bool);

    /// The oldest `limit` outbox rows as records of `region`, in commit order.
    async fn outbox_take(&self, region: &str, limit: u32) -> Result<Vec<Record>, StoreError>;

    /// Deletes published outbox rows.
    async fn outbox_done(&self, ids: &[i64]) -> Result<(), StoreError>;

    /// Outbox rows waiting.
    async fn outbox_len(&self) -> Result<u64, StoreError>;

    /// Applies another region's record (see the module doc).
    async fn apply(&self, record: &Record) -> Result<Applied, StoreError>;

    /// Applies records in order in one transaction, each under its own savepoint: the
    /// outcome of each (a record the store failed is rolled back alone). `Err`: the
    /// transaction failed and nothing was applied.
    async fn apply_batch(
        &self,
        records: &[Record],
    ) -> Result<Vec<Result<Applied, StoreError>>, StoreError>;

    /// Takes the advisory lock `key` on a session of its own: `None` when another
    /// session holds it.
    async fn lead(&self, key: i64) -> Result<Option<Leader>, StoreError>;

    /// Up to `limit` cursor moves of this region not yet published (`store::repl_cursors`).
    async fn cursors_take(&self, limit: u32) -> Result<Vec<CursorMove>, StoreError>;

    /// Forgets published cursor moves (unless their cursor moved further since).
    async fn cursors_done(&self, moves: &[CursorMove]) -> Result<(), StoreError>;

    /// Applies another region's cursor moves by max; the read cursors that moved.
    async fn apply_cursors(&self, moves: &[CursorMove]) -> Result<Vec<ReadMoved>, StoreError>;
}

/// The outbox rows' records, oldest first (a row whose message is gone is skipped and
/// deleted with the others).
pub(crate) async fn outbox_take(
    pool: &PgPool,
    region: &str,
    limit: u32,
) -> Result<Vec<Record>, StoreError> {
    use base64::Engine as _;
    let rows = sqlx::query(
        "SELECT o.id, o.conversation_id, o.seq, m.msg_id, m.sender, m.client_msg_id, \
         m.msg_type, m.payload, m.send_time, m.ref_seq, m.ref_msg_id, m.state, m.edit_time, \
         o.traced \
         FROM (SELECT id, conversation_id, seq, traced FROM region_outbox ORDER BY id LIMIT $1) o \
         LEFT JOIN messages m ON m.conversation_id = o.conversation_id AND m.seq = o.seq \
         ORDER BY o.id",
    )
    .bind(i64::from(limit.min(MAX_TAKE)))
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    let mut groups: HashMap<String, Option<GroupSnapshot>> = HashMap::new();
    for r in rows {
        let id: i64 = r.try_get(0)?;
        let conversation_id: String = r.try_get(1)?;
        let msg_id: Option<String> = r.try_get(3)?;
        let seq: i64 = r.try_get(2)?;
        if seq < 0 {
            // A home move's row (`store::homes`): its seq is minus the new epoch.
            out.push(move_record(pool, id, region, conversation_id, -seq).await?);
            continue;
        }
        let Some(msg_id) = msg_id else {
            out.push(hole(id, region, conversation_id, r.try_get(2)?));
            continue;
        };
        let msg_type: i32 = r.try_get(6)?;
        let group = match im_proto::parse_conversation(&conversation_id) {
            Some(im_proto::ConversationRef::Group(g))
                if msg_type == im_proto::MessageType::System as i32 =>
            {
                if !groups.contains_key(g) {
                    groups.insert(g.to_owned(), snapshot(pool, g).await?);
                }
                groups.get(g).cloned().flatten()
            }
            _ => None,
        };
        let payload: Vec<u8> = r.try_get(7)?;
        out.push(Record {
            region: region.to_owned(),
            conversation_id,
            seq: seq.max(0) as u64,
            msg_id,
            sender: r.try_get(4)?,
            client_msg_id: r.try_get(5)?,
            msg_type,
            payload: base64::engine::general_purpose::STANDARD.encode(payload),
            send_time: r.try_get(8)?,
            ref_seq: r.try_get(9)?,
            ref_msg_id: r.try_get(10)?,
            state: r.try_get(11)?,
            edit_time: r.try_get(12)?,
            group,
            hole: false,
            traced: r.try_get(13)?,
            epoch: 0,
            home: None,
            outbox_id: id,
        });
    }
    Ok(out)
}

/// The record of an outbox row with no message at its seq: a hole.
fn hole(id: i64, region: &str, conversation_id: String, seq: i64) -> Record {
    Record {
        region: region.to_owned(),
        conversation_id,
        seq: seq.max(0) as u64,
        msg_id: String::new(),
        sender: String::new(),
        client_msg_id: None,
        msg_type: 0,
        payload: String::new(),
        send_time: 0,
        ref_seq: 0,
        ref_msg_id: None,
        state: 0,
        edit_time: 0,
        group: None,
        hole: true,
        traced: false,
        epoch: 0,
        home: None,
        outbox_id: id,
    }
}

/// Group `g`'s membership state now (`None`: no such group).
async fn snapshot(pool: &PgPool, g: &str) -> Result<Option<GroupSnapshot>, StoreError> {
    let row = sqlx::query(
        "SELECT created_by, created_at, kind, members_can_invite, version, dissolved, size \
         FROM chat_groups WHERE group_id = $1",
    )
    .bind(g)
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let members: Vec<(String, i64, i32)> = sqlx::query_as(
        "SELECT user_id, joined_at, role FROM group_members WHERE group_id = $1 ORDER BY user_id",
    )
    .bind(g)
    .fetch_all(pool)
    .await?;
    let intervals: Vec<(String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT user_id, joined_seq, left_seq FROM group_intervals WHERE group_id = $1 \
         ORDER BY user_id, joined_seq",
    )
    .bind(g)
    .fetch_all(pool)
    .await?;
    let bans: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT user_id, banned_by, banned_at FROM group_bans WHERE group_id = $1 ORDER BY user_id",
    )
    .bind(g)
    .fetch_all(pool)
    .await?;
    Ok(Some(GroupSnapshot {
        group_id: g.to_owned(),
        created_by: row.try_get(0)?,
        created_at: row.try_get(1)?,
        kind: row.try_get(2)?,
        members_can_invite: row.try_get(3)?,
        version: row.try_get(4)?,
        dissolved: row.try_get(5)?,
        size: row.try_get(6)?,
        members,
        intervals,
        bans,
    }))
}

/// Deletes published outbox rows.
pub(crate) async fn outbox_done(pool: &PgPool, ids: &[i64]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query("DELETE FROM region_outbox WHERE id = ANY($1)")
        .bind(ids)
        .execute(pool)
        .await?;
    Ok(())
}

/// Outbox rows waiting.
pub(crate) async fn outbox_len(pool: &PgPool) -> Result<u64, StoreError> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM region_outbox")
        .fetch_one(pool)
        .await?;
    Ok(n.max(0) as u64)
}

/// One outbox row per conversation and seq, in the commit's transaction.
pub(crate) async fn outbox_rows(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    rows: &[(&str, i64)],
) -> Result<(), StoreError> {
    for chunk in rows.chunks(OUTBOX_CHUNK) {
        let mut qb = sqlx::QueryBuilder::<Postgres>::new(
            "INSERT INTO region_outbox (conversation_id, seq) ",
        );
        qb.push_values(chunk, |mut b, (conv, seq)| {
            b.push_bind(*conv).push_bind(*seq);
        });
        qb.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// Marks the outbox rows of traced messages (conversation, seq), in the commit's
/// transaction after [`outbox_rows`] wrote them.
pub(crate) async fn mark_traced(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    rows: &[(&str, i64)],
) -> Result<(), StoreError> {
    for (conv, seq) in rows {
        sqlx::query(
            "UPDATE region_outbox SET traced = TRUE WHERE conversation_id = $1 AND seq = $2",
        )
        .bind(*conv)
        .bind(*seq)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Takes advisory lock `key` on a connection of `pool`, which then leaves the pool
/// with the lock (a connection that did not get it goes back).
pub(crate) async fn lead(pool: &PgPool, key: i64) -> Result<Option<Leader>, StoreError> {
    let mut conn = pool.acquire().await?;
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut *conn)
        .await?;
    Ok(got.then(|| Leader {
        conn: conn.detach(),
    }))
}

/// Applies `rec` in one transaction (see the module doc).
pub(crate) async fn apply(pool: &PgPool, rec: &Record) -> Result<Applied, StoreError> {
    let mut tx = pool.begin().await?;
    let applied = apply_in(&mut tx, rec).await?;
    if matches!(applied, Applied::Stored | Applied::Hole) {
        tx.commit().await?;
    }
    Ok(applied)
}

/// Applies `records` in order in one transaction, each under a savepoint of its own:
/// a record the store fails is rolled back alone (its outcome is the error) and the
/// others commit. The outcomes, in order, are valid only once this returns `Ok` (the
/// commit failed: nothing was applied).
pub(crate) async fn apply_batch(
    pool: &PgPool,
    records: &[Record],
) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
    let mut tx = pool.begin().await?;
    let mut out = Vec::with_capacity(records.len());
    for rec in records {
        out.push(apply_savepoint(&mut tx, rec).await?);
    }
    tx.commit().await?;
    Ok(out)
}

/// One record of [`apply_batch`] under a savepoint: released when it changed something,
/// rolled back otherwise (a duplicate, a gap, an error). `Err` only when the savepoint
/// itself failed (the batch's transaction is then unusable).
async fn apply_savepoint(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    rec: &Record,
) -> Result<Result<Applied, StoreError>, StoreError> {
    use sqlx::Connection as _;
    let mut sp = (**tx).begin().await?;
    let outcome = apply_in(&mut sp, rec).await;
    match outcome {
        Ok(a @ (Applied::Stored | Applied::Hole)) => {
            sp.commit().await?;
            Ok(Ok(a))
        }
        other => {
            sp.rollback().await?;
            Ok(other)
        }
    }
}

/// The apply of one record inside `tx` (see the module doc); the caller commits when
/// the outcome is `Stored` or `Hole`.
async fn apply_in(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    rec: &Record,
) -> Result<Applied, StoreError> {
    let conv = rec.conversation_id.as_str();
    sqlx::query(
        "INSERT INTO conversations (conversation_id, last_seq, last_time) VALUES ($1, 0, 0) \
         ON CONFLICT (conversation_id) DO NOTHING",
    )
    .bind(conv)
    .execute(&mut **tx)
    .await?;
    let applied: i64 = sqlx::query_scalar(
        "SELECT last_seq FROM conversations WHERE conversation_id = $1 FOR UPDATE",
    )
    .bind(conv)
    .fetch_one(&mut **tx)
    .await?;
    let applied = applied.max(0) as u64;
    if rec.seq <= applied {
        return Ok(Applied::Duplicate);
    }
    if rec.seq > applied + 1 {
        return Ok(Applied::Gap(applied));
    }
    if !rec.hole {
        insert_message(tx, rec).await?;
    }
    sqlx::query(
        "UPDATE conversations SET last_seq = $2, \
         last_time = GREATEST(last_time, $3) WHERE conversation_id = $1",
    )
    .bind(conv)
    .bind(rec.seq as i64)
    .bind(rec.send_time)
    .execute(&mut **tx)
    .await?;
    if !rec.hole {
        side_effects(tx, rec).await?;
    }
    if let Some(g) = &rec.group {
        apply_group(tx, g).await?;
    }
    Ok(if rec.hole {
        Applied::Hole
    } else {
        Applied::Stored
    })
}

/// The message row, at its origin seq with its origin id and times.
async fn insert_message(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    rec: &Record,
) -> Result<(), StoreError> {
    let payload = rec
        .payload_bytes()
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    let stored = sqlx::query(
        "INSERT INTO messages (conversation_id, seq, msg_id, sender, client_msg_id, msg_type, \
         payload, send_time, ref_seq, ref_msg_id, state, edit_time) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT DO NOTHING",
    )
    .bind(rec.conversation_id.as_str())
    .bind(rec.seq as i64)
    .bind(rec.msg_id.as_str())
    .bind(rec.sender.as_str())
    .bind(rec.client_msg_id.as_deref())
    .bind(rec.msg_type)
    .bind(payload.as_slice())
    .bind(rec.send_time)
    .bind(rec.ref_seq)
    .bind(rec.ref_msg_id.as_deref())
    .bind(rec.state)
    .bind(rec.edit_time)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if stored == 0 {
        tracing::warn!(
            conversation = ?rec.conversation_id,
            seq = rec.seq,
            "a replicated message collides with a stored one; the stored one is kept"
        );
    }
    Ok(())
}

/// What a commit at the home also did: the one-to-one parties' conversation list rows,
/// the sender's read cursor, and a RECALL's or EDIT's change to the message it names.
async fn side_effects(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    rec: &Record,
) -> Result<(), StoreError> {
    let conv = rec.conversation_id.as_str();
    if let Some(im_proto::ConversationRef::Direct(a, b)) = im_proto::parse_conversation(conv) {
        sqlx::query(
            "INSERT INTO user_conversations (user_id, conversation_id, last_time) \
             VALUES ($1, $3, $4), ($2, $3, $4) ON CONFLICT (user_id, conversation_id) \
             DO UPDATE SET last_time = GREATEST(user_conversations.last_time, excluded.last_time)",
        )
        .bind(a)
        .bind(b)
        .bind(conv)
        .bind(rec.send_time)
        .execute(&mut **tx)
        .await?;
    }
    if !rec.sender.is_empty() {
        sqlx::query(
            "INSERT INTO conversation_state (user_id, conversation_id, read_seq, read_time) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (user_id, conversation_id) DO UPDATE \
             SET read_seq = GREATEST(conversation_state.read_seq, excluded.read_seq), \
             read_time = GREATEST(conversation_state.read_time, excluded.read_time)",
        )
        .bind(rec.sender.as_str())
        .bind(conv)
        .bind(rec.seq as i64)
        .bind(rec.send_time)
        .execute(&mut **tx)
        .await?;
    }
    let empty: &[u8] = &[];
    if rec.msg_type == im_proto::MessageType::Recall as i32 && rec.ref_seq > 0 {
        sqlx::query(
            "UPDATE messages SET state = 2, payload = $3, edit_time = 0 \
             WHERE conversation_id = $1 AND seq = $2 AND msg_type NOT IN (3, 4, 5)",
        )
        .bind(conv)
        .bind(rec.ref_seq)
        .bind(empty)
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "UPDATE messages SET state = 2, payload = $3 \
             WHERE conversation_id = $1 AND ref_seq = $2 AND msg_type = 5",
        )
        .bind(conv)
        .bind(rec.ref_seq)
        .bind(empty)
        .execute(&mut **tx)
        .await?;
    } else if rec.msg_type == im_proto::MessageType::Edit as i32
        && rec.ref_seq > 0
        && rec.state != 2
    {
        let payload = rec
            .payload_bytes()
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        sqlx::query(
            "UPDATE messages SET state = 1, payload = $3, edit_time = $4 \
             WHERE conversation_id = $1 AND seq = $2 AND state <> 2 AND msg_type NOT IN (3, 4, 5)",
        )
        .bind(conv)
        .bind(rec.ref_seq)
        .bind(payload.as_slice())
        .bind(rec.send_time)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Replaces the group's membership state with `g` unless the stored one is newer.
async fn apply_group(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    g: &GroupSnapshot,
) -> Result<(), StoreError> {
    let id = g.group_id.as_str();
    let stored: Option<i64> =
        sqlx::query_scalar("SELECT version FROM chat_groups WHERE group_id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
    if stored.is_some_and(|v| v > g.version) {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO chat_groups (group_id, created_by, created_at, kind, members_can_invite, \
         version, dissolved, size) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (group_id) DO UPDATE SET kind = excluded.kind, \
         members_can_invite = excluded.members_can_invite, version = excluded.version, \
         dissolved = excluded.dissolved, size = excluded.size",
    )
    .bind(id)
    .bind(g.created_by.as_str())
    .bind(g.created_at)
    .bind(g.kind)
    .bind(g.members_can_invite)
    .bind(g.version)
    .bind(g.dissolved)
    .bind(g.size)
    .execute(&mut **tx)
    .await?;
    for table in ["group_members", "group_intervals", "group_bans"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE group_id = $1"))
            .bind(id)
            .execute(&mut **tx)
            .await?;
    }
    for (user, joined_at, role) in &g.members {
        sqlx::query(
            "INSERT INTO group_members (group_id, user_id, joined_at, role) VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(user.as_str())
        .bind(*joined_at)
        .bind(*role)
        .execute(&mut **tx)
        .await?;
    }
    for (user, joined, left) in &g.intervals {
        sqlx::query(
            "INSERT INTO group_intervals (group_id, user_id, joined_seq, left_seq) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(user.as_str())
        .bind(*joined)
        .bind(*left)
        .execute(&mut **tx)
        .await?;
    }
    for (user, by, at) in &g.bans {
        sqlx::query(
            "INSERT INTO group_bans (group_id, user_id, banned_by, banned_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(user.as_str())
        .bind(by.as_str())
        .bind(*at)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// The record that publishes move `epoch` of `conversation_id` (outbox row `id`); a
/// hole at seq 0, which every region takes as a duplicate, when the row is gone.
async fn move_record(
    pool: &PgPool,
    id: i64,
    region: &str,
    conversation_id: String,
    epoch: i64,
) -> Result<Record, StoreError> {
    let row: Option<(String, i64)> = sqlx::query_as(
        "SELECT region, fence_seq FROM conversation_homes WHERE conversation_id = $1 AND epoch = $2",
    )
    .bind(conversation_id.as_str())
    .bind(epoch)
    .fetch_optional(pool)
    .await?;
    let home = row.map(|(r, fence)| HomeMove {
        epoch: epoch.max(0) as u64,
        region: r,
        fence: fence.max(0) as u64,
    });
    Ok(Record {
        region: region.to_owned(),
        hole: home.is_none(),
        epoch: epoch.max(0) as u64,
        home,
        conversation_id,
        outbox_id: id,
        ..Default::default()
    })
}
