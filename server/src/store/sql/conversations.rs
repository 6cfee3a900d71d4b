//! The conversation list in SQL: a page's keys from three index-ordered sources, then
//! the details of those rows only; and the per-user backlog the admin API shows.

use sqlx::{ColumnIndex, Database, Executor, IntoArguments, Pool, Row};

use super::{Bind, Col, Sql, Statement};
use crate::store::{ListAfter, StoreError, UserBacklog, UNREAD_CAP};

/// One entry of a list page, in list order.
struct Key {
    pinned: bool,
    last_time: i64,
    conversation_id: String,
    group: bool,
}

/// The keyset condition after `(time, id)` (`$2`, `$3`), or one that keeps both binds
/// used when the page starts at the top.
fn keyset(on: bool, t: &str, c: &str) -> String {
    if on {
        format!(" AND ({t}, {c}) < ($2, $3)")
    } else {
        " AND $2 = $2 AND $3 = $3".to_owned()
    }
}

/// The condition that the conversation `c` is not pinned by the user (`$1`).
fn not_pinned(c: &str) -> String {
    format!(
        " AND NOT EXISTS (SELECT 1 FROM conversation_state s \
         WHERE s.user_id = $1 AND s.conversation_id = {c} AND s.pinned <> 0)"
    )
}

/// The summary's name and size: the group's id and size, or the other party.
fn kind_name_size(
    cid: &str,
    group: bool,
    size: Option<i32>,
    user_id: &str,
) -> (im_proto::ConversationKind, String, u32) {
    use im_proto::{ConversationKind, ConversationRef};
    match im_proto::parse_conversation(cid) {
        Some(ConversationRef::Group(g)) if group => (
            ConversationKind::Group,
            g.to_owned(),
            size.unwrap_or(0).max(0) as u32,
        ),
        Some(ConversationRef::Direct(a, b)) => (
            ConversationKind::Direct,
            if a == user_id {
                b.to_owned()
            } else {
                a.to_owned()
            },
            2,
        ),
        _ => (ConversationKind::Direct, String::new(), 0),
    }
}

impl<DB: Database> Sql<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    Vec<u8>: Col<DB>,
    i64: Col<DB>,
    String: Col<DB>,
    i32: Col<DB>,
    for<'q> &'q str: Bind<'q, DB>,
{
    /// A page of the user's conversations ([`Store::list_conversations`]).
    ///
    /// [`Store::list_conversations`]: crate::store::Store::list_conversations
    pub(crate) async fn list_conversations(
        read: &Pool<DB>,
        user_id: &str,
        after: Option<&ListAfter>,
        limit: u32,
        preview_bytes: usize,
    ) -> Result<(Vec<im_proto::ConversationSummary>, Option<ListAfter>), StoreError> {
        let limit = limit.max(1) as usize;
        let keys = Self::list_keys(read, user_id, after, limit).await?;
        if keys.is_empty() {
            return Ok((Vec::new(), None));
        }
        let out = Self::list_details(read, user_id, &keys, preview_bytes).await?;
        // The next page starts after this page's last key (as ordered above).
        let next = match keys.last() {
            Some(k) if keys.len() >= limit => Some(ListAfter {
                pinned: k.pinned,
                last_time: k.last_time,
                conversation_id: k.conversation_id.clone(),
            }),
            _ => None,
        };
        Ok((out, next))
    }

    /// A page's keys, in list order (pinned, last_time, id, all descending), from three
    /// sources merged here: the pinned ones (a partial index), the one-to-one ones (an
    /// index range on user_conversations, which carries each party's last activity),
    /// the groups (the user's memberships joined with their conversations).
    async fn list_keys(
        read: &Pool<DB>,
        user_id: &str,
        after: Option<&ListAfter>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let (at, ac) = match after {
            Some(a) => (a.last_time, a.conversation_id.as_str()),
            None => (0, ""),
        };
        let mut keys: Vec<Key> = Vec::new();
        if after.is_none_or(|a| a.pinned) {
            let sql = format!(
                "SELECT s.conversation_id, v.last_time FROM conversation_state s \
                 JOIN conversations v ON v.conversation_id = s.conversation_id \
                 WHERE s.user_id = $1 AND s.pinned <> 0{} \
                 AND (EXISTS (SELECT 1 FROM user_conversations u \
                      WHERE u.user_id = $1 AND u.conversation_id = s.conversation_id) \
                   OR (s.conversation_id LIKE 'g:%' AND EXISTS (SELECT 1 \
                      FROM group_members m WHERE m.user_id = $1 \
                      AND m.group_id = substr(s.conversation_id, 3)))) \
                 ORDER BY v.last_time DESC, s.conversation_id DESC LIMIT $4",
                keyset(after.is_some(), "v.last_time", "s.conversation_id"),
            );
            let rows: Vec<(String, i64)> = sqlx::query_as(&sql)
                .bind(user_id)
                .bind(at)
                .bind(ac)
                .bind(limit as i64)
                .fetch_all(read)
                .await?;
            keys.extend(rows.into_iter().map(|(c, t)| Key {
                pinned: true,
                last_time: t,
                group: c.starts_with("g:"),
                conversation_id: c,
            }));
        }
        if keys.len() < limit {
            let need = limit - keys.len();
            let rest = after.is_some_and(|a| !a.pinned);
            keys.extend(Self::unpinned_keys(read, user_id, (at, ac), rest, need).await?);
        }
        Ok(keys)
    }

    /// The next `need` unpinned keys: the one-to-one and the group sources, each
    /// index-ordered, merged (after `(at, ac)` when `rest`).
    async fn unpinned_keys(
        read: &Pool<DB>,
        user_id: &str,
        (at, ac): (i64, &str),
        rest: bool,
        need: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let direct = format!(
            "SELECT u.conversation_id, u.last_time FROM user_conversations u \
             WHERE u.user_id = $1{}{} \
             ORDER BY u.last_time DESC, u.conversation_id DESC LIMIT $4",
            keyset(rest, "u.last_time", "u.conversation_id"),
            not_pinned("u.conversation_id"),
        );
        let groups = format!(
            "SELECT v.conversation_id, v.last_time FROM group_members m \
             JOIN conversations v ON v.conversation_id = 'g:' || m.group_id \
             WHERE m.user_id = $1{}{} \
             ORDER BY v.last_time DESC, v.conversation_id DESC LIMIT $4",
            keyset(rest, "v.last_time", "v.conversation_id"),
            not_pinned("v.conversation_id"),
        );
        let mut merged: Vec<(i64, String, bool)> = Vec::new();
        for (sql, group) in [(direct, false), (groups, true)] {
            let rows: Vec<(String, i64)> = sqlx::query_as(&sql)
                .bind(user_id)
                .bind(at)
                .bind(ac)
                .bind(need as i64)
                .fetch_all(read)
                .await?;
            merged.extend(rows.into_iter().map(|(c, t)| (t, c, group)));
        }
        merged.sort_unstable_by(|a, b| (b.0, &b.1).cmp(&(a.0, &a.1)));
        merged.truncate(need);
        Ok(merged
            .into_iter()
            .map(|(t, c, g)| Key {
                pinned: false,
                last_time: t,
                conversation_id: c,
                group: g,
            })
            .collect())
    }

    /// The details of the page's rows only, in their order: the visible last message,
    /// the bounded unread count, the group's size, the other party's read cursor.
    async fn list_details(
        read: &Pool<DB>,
        user_id: &str,
        keys: &[Key],
        preview_bytes: usize,
    ) -> Result<Vec<im_proto::ConversationSummary>, StoreError> {
        let mut qb = Statement::<DB>::new("WITH k (cid, grp, ord) AS (");
        qb.push_values(keys.iter().enumerate(), |b, (i, k)| {
            b.push_bind(k.conversation_id.as_str())
                .push_bind(k.group as i32)
                .push_bind(i as i32);
        });
        qb.push(
            "), q AS (SELECT k.cid, k.grp, k.ord, v.last_time, v.last_seq, \
               COALESCE(s.read_seq, 0) AS read_seq, COALESCE(s.muted, 0) AS muted, \
               COALESCE(s.pinned, 0) AS pinned, \
               CASE WHEN k.grp = 1 THEN COALESCE((SELECT MAX(i.joined_seq) \
                 FROM group_intervals i WHERE i.group_id = substr(k.cid, 3) \
                 AND i.user_id = ",
        );
        qb.push_bind(user_id);
        qb.push(
            " AND i.left_seq IS NULL), 0) ELSE 0 END AS lo \
             FROM k JOIN conversations v ON v.conversation_id = k.cid \
             LEFT JOIN conversation_state s ON s.user_id = ",
        );
        qb.push_bind(user_id);
        qb.push(
            " AND s.conversation_id = k.cid) \
             SELECT q.cid, q.grp, q.pinned, q.last_time, q.last_seq, q.read_seq, \
               q.muted, \
               (SELECT g.size FROM chat_groups g \
                WHERE q.grp = 1 AND g.group_id = substr(q.cid, 3)) AS size, \
               (SELECT MAX(o.read_seq) FROM conversation_state o \
                WHERE q.grp = 0 AND o.conversation_id = q.cid AND o.user_id <> ",
        );
        qb.push_bind(user_id);
        qb.push(
            ") AS peer, \
               (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = q.cid \
                AND m.seq > q.read_seq AND m.seq >= q.lo AND m.seq > q.last_seq - ",
        );
        qb.push_bind(UNREAD_CAP as i64);
        qb.push(" AND m.sender <> ");
        qb.push_bind(user_id);
        qb.push(
            " AND m.msg_type < 3) AS unread, \
               l.sender, l.payload, l.send_time, l.msg_type, l.seq, l.msg_id, \
               l.client_msg_id \
             FROM q LEFT JOIN messages l ON l.conversation_id = q.cid AND l.seq = (\
               SELECT MAX(m.seq) FROM messages m WHERE m.conversation_id = q.cid \
               AND m.seq >= q.lo AND m.seq <= q.last_seq) \
             ORDER BY q.ord",
        );
        let (sql, args) = qb.finish()?;
        let rows = sqlx::query_with(&sql, args).fetch_all(read).await?;
        rows.iter()
            .map(|r| Self::summary(r, user_id, preview_bytes))
            .collect()
    }

    /// One detail row as the summary the client gets (columns by position: cid, grp,
    /// pinned, last_time, last_seq, read_seq, muted, size, peer, unread, then the last
    /// message's sender, payload, send_time, msg_type, seq, msg_id, client_msg_id).
    fn summary(
        r: &DB::Row,
        user_id: &str,
        preview_bytes: usize,
    ) -> Result<im_proto::ConversationSummary, StoreError> {
        let cid: String = r.try_get(0)?;
        let grp: i32 = r.try_get(1)?;
        let last_seq: i64 = r.try_get(4)?;
        let peer: Option<i64> = r.try_get(8)?;
        let unread: i64 = r.try_get(9)?;
        let muted: i32 = r.try_get(6)?;
        let pinned: i32 = r.try_get(2)?;
        let read_seq: i64 = r.try_get(5)?;
        let last_message = match r.try_get::<Option<i64>, _>(14)? {
            Some(seq) => {
                let mut payload: Vec<u8> = r.try_get(11)?;
                payload.truncate(preview_bytes);
                let cmid: Option<String> = r.try_get(16)?;
                Some(im_proto::ChatMessage {
                    conversation_id: cid.clone(),
                    sender: r.try_get(10)?,
                    payload: payload.into(),
                    send_time: r.try_get(12)?,
                    r#type: r.try_get(13)?,
                    seq: seq as u64,
                    msg_id: r.try_get(15)?,
                    client_msg_id: cmid.unwrap_or_default(),
                    ..Default::default()
                })
            }
            None => None,
        };
        let (kind, name, size) = kind_name_size(&cid, grp == 1, r.try_get(7)?, user_id);
        Ok(im_proto::ConversationSummary {
            conversation_id: cid,
            kind: kind as i32,
            name,
            size,
            last_message,
            last_seq: last_seq.max(0) as u64,
            last_time: r.try_get(3)?,
            read_seq: read_seq.max(0) as u64,
            unread: (unread.max(0) as u32).min(UNREAD_CAP),
            muted: muted != 0,
            pinned: pinned != 0,
            peer_read_seq: peer.unwrap_or(0).max(0) as u64,
        })
    }

    /// The last seq of a conversation ([`Store::last_seq`]).
    ///
    /// [`Store::last_seq`]: crate::store::Store::last_seq
    pub(crate) async fn last_seq(
        read: &Pool<DB>,
        conversation_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        let seq: Option<i64> =
            sqlx::query_scalar("SELECT last_seq FROM conversations WHERE conversation_id = $1")
                .bind(conversation_id)
                .fetch_optional(read)
                .await?;
        Ok(seq.map(|s| s as u64))
    }

    /// The user's conversations with unread messages, largest backlog first
    /// ([`Store::user_backlog`]).
    ///
    /// [`Store::user_backlog`]: crate::store::Store::user_backlog
    pub(crate) async fn user_backlog(
        read: &Pool<DB>,
        user_id: &str,
        limit: u32,
    ) -> Result<Vec<UserBacklog>, StoreError> {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT conversation_id, last_seq, cur FROM (\
             SELECT c.conversation_id AS conversation_id, v.last_seq AS last_seq, \
             CASE WHEN COALESCE(k.seq, 0) > COALESCE(s.read_seq, 0) \
             THEN COALESCE(k.seq, 0) ELSE COALESCE(s.read_seq, 0) END AS cur \
             FROM (SELECT conversation_id FROM user_conversations WHERE user_id = $1 \
             UNION ALL SELECT 'g:' || group_id FROM group_members WHERE user_id = $1) c \
             JOIN conversations v ON v.conversation_id = c.conversation_id \
             LEFT JOIN cursors k \
             ON k.user_id = $1 AND k.conversation_id = c.conversation_id \
             LEFT JOIN conversation_state s \
             ON s.user_id = $1 AND s.conversation_id = c.conversation_id) b \
             WHERE last_seq > cur ORDER BY last_seq - cur DESC, conversation_id \
             LIMIT $2",
        )
        .bind(user_id)
        .bind(i64::from(limit))
        .fetch_all(read)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(conversation_id, last_seq, cur)| UserBacklog {
                conversation_id,
                cursor: cur.max(0) as u64,
                last_seq: last_seq.max(0) as u64,
            })
            .collect())
    }
}
