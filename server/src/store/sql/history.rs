//! Reading messages back in SQL: sync pages (every conversation after its cursor) and
//! history pages (one conversation backwards), both clamped to the reader's membership
//! intervals in a group and streamed so a page stops at its byte budget; the message a
//! recall or edit names; DeleteForMe.

use std::collections::HashMap;
use std::sync::LazyLock;

use futures_util::TryStreamExt;
use sqlx::pool::PoolConnection;
use sqlx::{ColumnIndex, Database, Executor, IntoArguments, Pool};

use super::{rendered, Bind, Col, Sql, Statement, CHUNK, MESSAGE_COLUMNS};
use crate::store::{message_bytes, HiddenMessage, MessageMeta, StoreError, StoredMessage};

/// A sync page's rows of one conversation: seqs in ($2, $3], oldest first.
static SYNC_RANGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {MESSAGE_COLUMNS} FROM messages m \
         WHERE m.conversation_id = $1 AND m.seq > $2 AND m.seq <= $3 \
         ORDER BY m.seq LIMIT $4"
    )
});

/// A history page's rows of one conversation: seqs in [$2, $3], newest first.
static HISTORY_RANGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {MESSAGE_COLUMNS} FROM messages m \
         WHERE m.conversation_id = $1 AND m.seq >= $2 AND m.seq <= $3 \
         ORDER BY m.seq DESC LIMIT $4"
    )
});

/// A page's bounds: at most `limit` messages, stopping before their
/// [`message_bytes`] pass `max_bytes` (the first message always goes in).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Page {
    /// Most messages.
    pub limit: u32,
    /// Most bytes, about.
    pub max_bytes: usize,
}

/// A page being filled.
#[derive(Default)]
struct Filling {
    out: Vec<StoredMessage>,
    bytes: usize,
}

impl Filling {
    /// Room left for messages.
    fn room(&self, page: Page) -> usize {
        (page.limit as usize).saturating_sub(self.out.len())
    }

    /// Takes `m` unless the page is full; false when it is (more remain).
    fn take(&mut self, m: StoredMessage, page: Page) -> bool {
        let size = message_bytes(&m);
        if !self.out.is_empty() && self.bytes.saturating_add(size) > page.max_bytes {
            return false;
        }
        self.bytes = self.bytes.saturating_add(size);
        self.out.push(m);
        true
    }
}

impl<DB: Database> Sql<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    String: Col<DB>,
    i64: Col<DB>,
    i32: Col<DB>,
    Vec<u8>: Col<DB>,
    for<'q> &'q str: Bind<'q, DB>,
{
    /// A sync page over all the user's conversations ([`Store::sync_page`]).
    ///
    /// [`Store::sync_page`]: crate::store::Store::sync_page
    pub(crate) async fn sync_page(
        read: &Pool<DB>,
        user_id: &str,
        cursors: &[(String, u64)],
        page: Page,
    ) -> Result<(Vec<StoredMessage>, bool), StoreError> {
        let mut fill = Filling::default();
        for (conv, after) in Self::sync_plan(read, user_id, cursors).await? {
            let group = match im_proto::parse_conversation(&conv) {
                Some(im_proto::ConversationRef::Group(g)) => Some(g),
                _ => None,
            };
            for (joined, left) in Self::ranges(read, user_id, group, false, (0, None)).await? {
                let from = (after as i64).max(joined - 1);
                let to = left.unwrap_or(i64::MAX);
                if from >= to {
                    continue;
                }
                if fill.room(page) == 0 || fill.bytes >= page.max_bytes {
                    return Ok((fill.out, true));
                }
                let bounds = (from, to);
                if Self::fill(read, &SYNC_RANGE, &conv, bounds, user_id, page, &mut fill).await? {
                    return Ok((fill.out, true));
                }
            }
        }
        Ok((fill.out, false))
    }

    /// The conversations a sync reads, in id order, each with the seq it reads after:
    /// the user's conversations with messages past their stored cursor, where
    /// `cursors` overrides the stored cursor of those it names. Named conversations the
    /// user has no record of are read as given (within the intervals, so a group they
    /// never joined reads nothing).
    async fn sync_plan(
        read: &Pool<DB>,
        user_id: &str,
        cursors: &[(String, u64)],
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let stored: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT c.conversation_id, COALESCE(k.seq, 0), v.last_seq FROM \
             (SELECT conversation_id FROM user_conversations WHERE user_id = $1 \
              UNION SELECT 'g:' || group_id FROM group_members WHERE user_id = $1) c \
             JOIN conversations v ON v.conversation_id = c.conversation_id \
             LEFT JOIN cursors k ON k.user_id = $1 AND k.conversation_id = c.conversation_id",
        )
        .bind(user_id)
        .fetch_all(read)
        .await?;
        let mut given: HashMap<&str, u64> = cursors.iter().map(|(c, s)| (c.as_str(), *s)).collect();
        let mut plan: Vec<(String, u64)> = Vec::with_capacity(stored.len());
        for (conv, stored_seq, last) in stored {
            let after = given.remove(conv.as_str()).unwrap_or(stored_seq as u64);
            if (last as u64) > after {
                plan.push((conv, after));
            }
        }
        plan.extend(given.into_iter().map(|(c, s)| (c.to_owned(), s)));
        plan.sort();
        plan.dedup_by(|a, b| a.0 == b.0);
        Ok(plan)
    }

    /// The seq ranges (joined, left) the user may read in a conversation: a group's
    /// membership intervals (`newest_first` or oldest first), `whole` for a one-to-one
    /// conversation.
    async fn ranges(
        read: &Pool<DB>,
        user_id: &str,
        group: Option<&str>,
        newest_first: bool,
        whole: (i64, Option<i64>),
    ) -> Result<Vec<(i64, Option<i64>)>, StoreError> {
        let Some(g) = group else {
            return Ok(vec![whole]);
        };
        let sql = if newest_first {
            "SELECT joined_seq, left_seq FROM group_intervals \
             WHERE group_id = $1 AND user_id = $2 ORDER BY joined_seq DESC"
        } else {
            "SELECT joined_seq, left_seq FROM group_intervals \
             WHERE group_id = $1 AND user_id = $2 ORDER BY joined_seq"
        };
        Ok(sqlx::query_as(sql)
            .bind(g)
            .bind(user_id)
            .fetch_all(read)
            .await?)
    }

    /// Streams one range's rows (`select`: [`SYNC_RANGE`] or [`HISTORY_RANGE`] over
    /// `bounds`) into the page, one row past its room to learn whether more remain;
    /// true when the page filled up before the rows ran out.
    async fn fill(
        read: &Pool<DB>,
        select: &str,
        conv: &str,
        bounds: (i64, i64),
        user_id: &str,
        page: Page,
        fill: &mut Filling,
    ) -> Result<bool, StoreError> {
        let mut rows = sqlx::query(select)
            .bind(conv)
            .bind(bounds.0)
            .bind(bounds.1)
            .bind(fill.room(page) as i64 + 1)
            .bind(user_id)
            .fetch(read);
        while let Some(r) = rows.try_next().await? {
            if fill.room(page) == 0 || !fill.take(rendered(&r)?, page) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A history page of one conversation ([`Store::history_page`]).
    ///
    /// [`Store::history_page`]: crate::store::Store::history_page
    pub(crate) async fn history_page(
        read: &Pool<DB>,
        user_id: &str,
        conversation_id: &str,
        before_seq: u64,
        page: Page,
    ) -> Result<(Vec<StoredMessage>, bool), StoreError> {
        // From the join event to the leave event in a group.
        let group = match im_proto::parse_conversation(conversation_id) {
            Some(im_proto::ConversationRef::Group(g)) => Some(g),
            Some(_) => None,
            None => return Ok((Vec::new(), false)),
        };
        let top = match before_seq {
            0 => i64::MAX,
            b => b.min(i64::MAX as u64) as i64 - 1,
        };
        let mut fill = Filling::default();
        for (joined, left) in Self::ranges(read, user_id, group, true, (1, None)).await? {
            let hi = top.min(left.unwrap_or(i64::MAX));
            let lo = joined.max(1);
            if hi < lo {
                continue;
            }
            // An empty older interval does not count as more.
            let bounds = (lo, hi);
            let (conv, select) = (conversation_id, HISTORY_RANGE.as_str());
            if Self::fill(read, select, conv, bounds, user_id, page, &mut fill).await? {
                return Ok((fill.out, true));
            }
        }
        Ok((fill.out, false))
    }

    /// The message a recall or edit names, if the reader may read it
    /// ([`Store::message_meta`]).
    ///
    /// [`Store::message_meta`]: crate::store::Store::message_meta
    pub(crate) async fn message_meta(
        read: &Pool<DB>,
        reader: &str,
        conversation_id: &str,
        seq: u64,
    ) -> Result<Option<MessageMeta>, StoreError> {
        if seq == 0 || seq > i64::MAX as u64 {
            return Ok(None);
        }
        let row: Option<(String, i32, String, i32, i64)> = sqlx::query_as(
            "SELECT sender, msg_type, msg_id, state, send_time FROM messages \
             WHERE conversation_id = $1 AND seq = $2",
        )
        .bind(conversation_id)
        .bind(seq as i64)
        .fetch_optional(read)
        .await?;
        let Some((sender, msg_type, msg_id, state, send_time)) = row else {
            return Ok(None);
        };
        if let Some(im_proto::ConversationRef::Group(g)) =
            im_proto::parse_conversation(conversation_id)
        {
            let inside: Option<i32> = sqlx::query_scalar(
                "SELECT 1 FROM group_intervals WHERE group_id = $1 AND user_id = $2 \
                 AND joined_seq <= $3 AND (left_seq IS NULL OR left_seq >= $3) LIMIT 1",
            )
            .bind(g)
            .bind(reader)
            .bind(seq as i64)
            .fetch_optional(read)
            .await?;
            if inside.is_none() {
                return Ok(None);
            }
        }
        Ok(Some(MessageMeta {
            sender,
            msg_type,
            msg_id,
            state,
            send_time,
        }))
    }

    /// The message `sender` committed with this client_msg_id
    /// ([`Store::find_client_msg`]).
    ///
    /// [`Store::find_client_msg`]: crate::store::Store::find_client_msg
    pub(crate) async fn find_client_msg(
        read: &Pool<DB>,
        conversation_id: &str,
        sender: &str,
        client_msg_id: &str,
    ) -> Result<Option<(u64, String)>, StoreError> {
        let row: Option<(i64, String)> = sqlx::query_as(
            "SELECT seq, msg_id FROM messages WHERE sender = $1 \
             AND conversation_id = $2 AND client_msg_id = $3",
        )
        .bind(sender)
        .bind(conversation_id)
        .bind(client_msg_id)
        .fetch_optional(read)
        .await?;
        Ok(row.map(|(seq, id)| (seq.max(0) as u64, id)))
    }

    /// Records messages as deleted for their users, in one transaction
    /// ([`Store::hide_messages`]).
    ///
    /// [`Store::hide_messages`]: crate::store::Store::hide_messages
    pub(crate) async fn hide_messages(
        conn: &mut PoolConnection<DB>,
        hidden: &[HiddenMessage],
    ) -> Result<(), StoreError> {
        let mut tx = super::begin_write::<DB>(&mut **conn).await?;
        for chunk in hidden.chunks(CHUNK) {
            let mut qb = Statement::<DB>::new(
                "INSERT INTO hidden_messages (user_id, conversation_id, seq) ",
            );
            qb.push_values(chunk, |b, h| {
                b.push_bind(h.user_id.as_str())
                    .push_bind(h.conversation_id.as_str())
                    .push_bind(h.seq.min(i64::MAX as u64) as i64);
            });
            qb.push(" ON CONFLICT DO NOTHING");
            let (sql, args) = qb.finish()?;
            sqlx::query_with(&sql, args).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
