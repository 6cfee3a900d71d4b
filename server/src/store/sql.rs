//! The SQL shared by both backends. SQLite (3.35+) and Postgres accept the same
//! statements here (`$N` parameters, multi-row `ON CONFLICT ... DO UPDATE ... RETURNING`,
//! `WITH k AS (VALUES ...)`), so the [`Store`](super::Store) logic is written once, as a macro
//! expanded for each backend's pool type. Each backend struct has `write` and `read`
//! pools.

/// Rows per multi-row statement (8 binds each stays far below both backends' limits).
pub(crate) const CHUNK: usize = 500;

/// Expands `impl Store for $store` over database `$db`.
macro_rules! sql_store_impl {
    ($store:ty, $db:ty, $backend:literal) => {
        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            async fn commit_batch(
                &self,
                messages: &[$crate::store::NewMessage],
                cursors: &[$crate::store::CursorUpdate],
            ) -> Result<Vec<$crate::store::Committed>, $crate::store::StoreError> {
                let mut conn = self.writer().await?;
                let out = Self::commit_batch_on(&mut conn, messages, cursors).await;
                if out.is_err() {
                    self.discard_writer(conn).await;
                }
                out
            }

            async fn group_change(
                &self,
                group_id: &str,
                change: &$crate::store::GroupChange,
                max_members: u32,
            ) -> Result<Vec<String>, $crate::store::StoreError> {
                let mut conn = self.writer().await?;
                let out = Self::group_change_on(&mut conn, group_id, change, max_members).await;
                if out.is_err() {
                    self.discard_writer(conn).await;
                }
                out
            }

            async fn group_members(
                &self,
                group_id: &str,
            ) -> Result<Option<Vec<String>>, $crate::store::StoreError> {
                let exists: Option<i32> =
                    sqlx::query_scalar("SELECT 1 FROM chat_groups WHERE group_id = $1")
                        .bind(group_id)
                        .fetch_optional(&self.read)
                        .await?;
                if exists.is_none() {
                    return Ok(None);
                }
                let members = sqlx::query_scalar(
                    "SELECT user_id FROM group_members WHERE group_id = $1 ORDER BY user_id",
                )
                .bind(group_id)
                .fetch_all(&self.read)
                .await?;
                Ok(Some(members))
            }

            async fn sync_page(
                &self,
                user_id: &str,
                cursors: &[(String, u64)],
                limit: u32,
                max_bytes: usize,
            ) -> Result<(Vec<$crate::store::StoredMessage>, bool), $crate::store::StoreError> {
                use sqlx::Row;
                let stored: Vec<(String, i64, i64)> = sqlx::query_as(
                    "SELECT c.conversation_id, COALESCE(k.seq, 0), v.last_seq FROM \
                     (SELECT conversation_id FROM user_conversations WHERE user_id = $1 \
                      UNION SELECT 'g:' || group_id FROM group_members WHERE user_id = $1) c \
                     JOIN conversations v ON v.conversation_id = c.conversation_id \
                     LEFT JOIN cursors k ON k.user_id = $1 AND k.conversation_id = c.conversation_id",
                )
                .bind(user_id)
                .fetch_all(&self.read)
                .await?;
                let mut given: std::collections::HashMap<&str, u64> =
                    cursors.iter().map(|(c, s)| (c.as_str(), *s)).collect();
                let mut plan: Vec<(String, u64)> = Vec::with_capacity(stored.len());
                for (conv, stored_seq, last) in stored {
                    let after = given.remove(conv.as_str()).unwrap_or(stored_seq as u64);
                    if (last as u64) > after {
                        plan.push((conv, after));
                    }
                }
                // Named conversations the user has no record of (e.g. left groups) are read as given.
                plan.extend(given.into_iter().map(|(c, s)| (c.to_string(), s)));
                plan.sort();
                plan.dedup_by(|a, b| a.0 == b.0);
                let mut out = Vec::new();
                let mut bytes = 0usize;
                let mut more = false;
                for (conv, after) in plan {
                    let room = limit as usize - out.len();
                    if room == 0 || bytes >= max_bytes {
                        more = true;
                        break;
                    }
                    // Streamed: the page stops at its byte budget without reading the rest.
                    let mut rows = sqlx::query(
                        "SELECT conversation_id, sender, payload, send_time, msg_type, seq, \
                         msg_id, client_msg_id FROM messages \
                         WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    )
                    .bind(conv.as_str())
                    .bind(after as i64)
                    .bind(room as i64 + 1)
                    .fetch(&self.read);
                    let mut taken = 0usize;
                    while let Some(r) = futures_util::TryStreamExt::try_next(&mut rows).await? {
                        if taken == room {
                            more = true;
                            break;
                        }
                        let payload: Vec<u8> = r.try_get("payload")?;
                        let seq: i64 = r.try_get("seq")?;
                        let cmid: Option<String> = r.try_get("client_msg_id")?;
                        let m = im_proto::ChatMessage {
                            conversation_id: r.try_get("conversation_id")?,
                            sender: r.try_get("sender")?,
                            payload: payload.into(),
                            send_time: r.try_get("send_time")?,
                            r#type: r.try_get("msg_type")?,
                            seq: seq as u64,
                            msg_id: r.try_get("msg_id")?,
                            client_msg_id: cmid.unwrap_or_default(),
                        };
                        let size = $crate::store::message_bytes(&m);
                        if !out.is_empty() && bytes.saturating_add(size) > max_bytes {
                            more = true;
                            break;
                        }
                        bytes = bytes.saturating_add(size);
                        out.push(m);
                        taken += 1;
                    }
                    if more {
                        break;
                    }
                }
                Ok((out, more))
            }

            async fn last_seq(
                &self,
                conversation_id: &str,
            ) -> Result<Option<u64>, $crate::store::StoreError> {
                let seq: Option<i64> = sqlx::query_scalar(
                    "SELECT last_seq FROM conversations WHERE conversation_id = $1",
                )
                .bind(conversation_id)
                .fetch_optional(&self.read)
                .await?;
                Ok(seq.map(|s| s as u64))
            }

            async fn cursor(
                &self,
                user_id: &str,
                conversation_id: &str,
            ) -> Result<u64, $crate::store::StoreError> {
                let seq: Option<i64> = sqlx::query_scalar(
                    "SELECT seq FROM cursors WHERE user_id = $1 AND conversation_id = $2",
                )
                .bind(user_id)
                .bind(conversation_id)
                .fetch_optional(&self.read)
                .await?;
                Ok(seq.unwrap_or(0) as u64)
            }

            async fn ping(&self) -> Result<(), $crate::store::StoreError> {
                sqlx::query("SELECT 1").execute(&self.read).await?;
                Ok(())
            }

            async fn probe_write(&self) -> Result<(), $crate::store::StoreError> {
                let mut conn = self.writer().await?;
                let out: Result<(), $crate::store::StoreError> = async {
                    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
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
                .await;
                if out.is_err() {
                    self.discard_writer(conn).await;
                }
                out
            }

            fn backend(&self) -> &'static str {
                $backend
            }
        }

        /// The write transactions, each on the connection `writer()` checked; the
        /// `Store` methods discard the connection when one fails.
        impl $store {
            async fn commit_batch_on(
                conn: &mut sqlx::pool::PoolConnection<$db>,
                messages: &[$crate::store::NewMessage],
                cursors: &[$crate::store::CursorUpdate],
            ) -> Result<Vec<$crate::store::Committed>, $crate::store::StoreError> {
                use std::collections::HashMap;
                use sqlx::Row;
                use $crate::store::sql::CHUNK;
                use $crate::store::Committed;

                let mut tx = sqlx::Connection::begin(&mut **conn).await?;
                let now = im_proto::now_ms();

                // 1. Dedup: look up every (sender, client_msg_id) already stored.
                let keyed: Vec<&$crate::store::NewMessage> = messages
                    .iter()
                    .filter(|m| !m.client_msg_id.is_empty())
                    .collect();
                let mut found: HashMap<(String, String), Committed> = HashMap::new();
                for chunk in keyed.chunks(CHUNK) {
                    // A join against the keys, so both engines probe the unique index
                    // (SQLite scans the whole index for a row-value `IN (VALUES ...)`).
                    let mut qb = sqlx::QueryBuilder::<$db>::new("WITH k (s, c) AS (");
                    qb.push_values(chunk, |mut b, m| {
                        b.push_bind(m.sender.as_str()).push_bind(m.client_msg_id.as_str());
                    });
                    qb.push(
                        ") SELECT m.sender, m.client_msg_id, m.msg_id, m.conversation_id, m.seq, \
                         m.send_time FROM k JOIN messages m \
                         ON m.sender = k.s AND m.client_msg_id = k.c",
                    );
                    for row in qb.build().fetch_all(&mut *tx).await? {
                        let seq: i64 = row.try_get("seq")?;
                        found.insert(
                            (row.try_get("sender")?, row.try_get("client_msg_id")?),
                            Committed {
                                msg_id: row.try_get("msg_id")?,
                                conversation_id: row.try_get("conversation_id")?,
                                seq: seq as u64,
                                server_time: row.try_get("send_time")?,
                                duplicate: true,
                            },
                        );
                    }
                }

                // 2. Decide new versus duplicate (also within the batch), count per conversation.
                let mut fresh: Vec<usize> = Vec::with_capacity(messages.len());
                let mut results: Vec<Option<Committed>> = vec![None; messages.len()];
                let mut first_of: HashMap<(&str, &str), usize> = HashMap::new();
                let mut dup_of: Vec<(usize, usize)> = Vec::new();
                // Per conversation, in order of first appearance: (id, new messages, parties).
                let mut counts: Vec<(&str, u64, Option<&(String, String)>)> = Vec::new();
                let mut conv_index: HashMap<&str, usize> = HashMap::new();
                for (i, m) in messages.iter().enumerate() {
                    if !m.client_msg_id.is_empty() {
                        let key = (m.sender.as_str(), m.client_msg_id.as_str());
                        if let Some(c) = found.get(&(m.sender.clone(), m.client_msg_id.clone())) {
                            results[i] = Some(c.clone());
                            continue;
                        }
                        if let Some(&j) = first_of.get(&key) {
                            dup_of.push((i, j));
                            continue;
                        }
                        first_of.insert(key, i);
                    }
                    fresh.push(i);
                    match conv_index.get(m.conversation_id.as_str()) {
                        Some(&k) => counts[k].1 += 1,
                        None => {
                            conv_index.insert(m.conversation_id.as_str(), counts.len());
                            counts.push((m.conversation_id.as_str(), 1, m.direct.as_ref()));
                        }
                    }
                }

                // 3. Allocate seqs: one multi-row upsert reserves a gapless range per
                //    conversation (atomic on the row, so several nodes may share a database).
                //    Rows are locked in conversation order, the same in every transaction,
                //    so batches of several nodes sharing conversations cannot deadlock.
                counts.sort_unstable_by(|a, b| a.0.cmp(b.0));
                conv_index = counts.iter().enumerate().map(|(k, c)| (c.0, k)).collect();
                let mut next: HashMap<&str, u64> = HashMap::new();
                let mut created: Vec<(&str, &str)> = Vec::new();
                for chunk in counts.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO conversations (conversation_id, last_seq) ",
                    );
                    qb.push_values(chunk, |mut b, (conv, n, _)| {
                        b.push_bind(*conv).push_bind(*n as i64);
                    });
                    qb.push(
                        " ON CONFLICT (conversation_id) DO UPDATE \
                         SET last_seq = conversations.last_seq + excluded.last_seq \
                         RETURNING conversation_id, last_seq",
                    );
                    for row in qb.build().fetch_all(&mut *tx).await? {
                        let conv: String = row.try_get(0)?;
                        let last: i64 = row.try_get(1)?;
                        let Some(&k) = conv_index.get(conv.as_str()) else {
                            continue;
                        };
                        let (id, n, direct) = counts[k];
                        let last = last as u64;
                        next.insert(id, last + 1 - n);
                        if let (true, Some((a, b))) = (last == n, direct) {
                            // A new one-to-one conversation: record it for both parties.
                            created.push((a.as_str(), id));
                            created.push((b.as_str(), id));
                        }
                    }
                }
                if next.len() != counts.len() {
                    return Err(sqlx::Error::Protocol(
                        "seq allocation returned fewer conversations than asked".into(),
                    )
                    .into());
                }
                created.sort_unstable();
                created.dedup();
                for chunk in created.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO user_conversations (user_id, conversation_id) ",
                    );
                    qb.push_values(chunk, |mut b, (user, conv)| {
                        b.push_bind(*user).push_bind(*conv);
                    });
                    qb.push(" ON CONFLICT DO NOTHING");
                    qb.build().execute(&mut *tx).await?;
                }
                for &i in &fresh {
                    let m = &messages[i];
                    let Some(seq) = next.get_mut(m.conversation_id.as_str()) else {
                        continue;
                    };
                    results[i] = Some(Committed {
                        msg_id: m.msg_id.clone(),
                        conversation_id: m.conversation_id.clone(),
                        seq: *seq,
                        server_time: now,
                        duplicate: false,
                    });
                    *seq += 1;
                }
                for (i, j) in dup_of {
                    results[i] = results[j].clone().map(|c| Committed {
                        duplicate: true,
                        ..c
                    });
                }

                // 4. Insert the new messages.
                for chunk in fresh.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO messages (conversation_id, seq, msg_id, sender, \
                         client_msg_id, msg_type, payload, send_time) ",
                    );
                    qb.push_values(chunk, |mut b, &i| {
                        let m = &messages[i];
                        let c = results[i].as_ref();
                        b.push_bind(m.conversation_id.as_str())
                            .push_bind(c.map_or(0, |c| c.seq as i64))
                            .push_bind(m.msg_id.as_str())
                            .push_bind(m.sender.as_str())
                            .push_bind((!m.client_msg_id.is_empty()).then_some(m.client_msg_id.as_str()))
                            .push_bind(m.msg_type)
                            .push_bind(m.payload.as_ref())
                            .push_bind(now);
                    });
                    qb.build().execute(&mut *tx).await?;
                }

                // 5. Cursors move forward only.
                //    (The writer sends each (user, conversation) once per batch; rows are
                //    locked in (user, conversation) order, against deadlocks across nodes.)
                let mut cursors: Vec<&$crate::store::CursorUpdate> = cursors.iter().collect();
                cursors.sort_unstable_by(|a, b| {
                    (&a.user_id, &a.conversation_id).cmp(&(&b.user_id, &b.conversation_id))
                });
                for chunk in cursors.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO cursors (user_id, conversation_id, seq) ",
                    );
                    qb.push_values(chunk, |mut b, c| {
                        b.push_bind(c.user_id.as_str())
                            .push_bind(c.conversation_id.as_str())
                            .push_bind(c.seq as i64);
                    });
                    qb.push(
                        " ON CONFLICT (user_id, conversation_id) DO UPDATE SET seq = excluded.seq \
                         WHERE excluded.seq > cursors.seq",
                    );
                    qb.build().execute(&mut *tx).await?;
                }

                tx.commit().await?;
                Ok(results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Committed {
                        msg_id: String::new(),
                        conversation_id: String::new(),
                        seq: 0,
                        server_time: now,
                        duplicate: false,
                    }))
                    .collect())
            }

            async fn group_change_on(
                conn: &mut sqlx::pool::PoolConnection<$db>,
                group_id: &str,
                change: &$crate::store::GroupChange,
                max_members: u32,
            ) -> Result<Vec<String>, $crate::store::StoreError> {
                use $crate::store::{GroupChange, StoreError};
                let mut tx = sqlx::Connection::begin(&mut **conn).await?;
                let conv = im_proto::group_conversation(group_id);
                let now = im_proto::now_ms();
                let current: Vec<String> = match change {
                    GroupChange::Create { creator, .. } => {
                        let done = sqlx::query(
                            "INSERT INTO chat_groups (group_id, created_by, created_at) \
                             VALUES ($1, $2, $3) ON CONFLICT (group_id) DO NOTHING",
                        )
                        .bind(group_id)
                        .bind(creator.as_str())
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                        if done.rows_affected() == 0 {
                            return Err(StoreError::GroupExists(group_id.to_string()));
                        }
                        Vec::new()
                    }
                    _ => {
                        let exists: Option<i32> =
                            sqlx::query_scalar("SELECT 1 FROM chat_groups WHERE group_id = $1")
                                .bind(group_id)
                                .fetch_optional(&mut *tx)
                                .await?;
                        if exists.is_none() {
                            return Err(StoreError::GroupNotFound(group_id.to_string()));
                        }
                        sqlx::query_scalar(
                            "SELECT user_id FROM group_members WHERE group_id = $1",
                        )
                        .bind(group_id)
                        .fetch_all(&mut *tx)
                        .await?
                    }
                };
                let candidates: Vec<&str> = match change {
                    GroupChange::Create { creator, members } => std::iter::once(creator)
                        .chain(members)
                        .map(String::as_str)
                        .collect(),
                    GroupChange::Join(members) => members.iter().map(String::as_str).collect(),
                    GroupChange::Leave(_) => Vec::new(),
                };
                let mut added: Vec<&str> = Vec::new();
                for u in candidates {
                    if !current.iter().any(|c| c == u) && !added.contains(&u) {
                        added.push(u);
                    }
                }
                if current.len() + added.len() > max_members as usize {
                    return Err(StoreError::GroupFull(group_id.to_string(), max_members));
                }
                for user in &added {
                    sqlx::query(
                        "INSERT INTO group_members (group_id, user_id, joined_at) \
                         VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    )
                    .bind(group_id)
                    .bind(*user)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                    // A new member starts reading from now, not from the group's history.
                    sqlx::query(
                        "INSERT INTO cursors (user_id, conversation_id, seq) \
                         SELECT $1, $2, COALESCE((SELECT last_seq FROM conversations \
                         WHERE conversation_id = $2), 0) WHERE true \
                         ON CONFLICT (user_id, conversation_id) DO UPDATE \
                         SET seq = excluded.seq WHERE excluded.seq > cursors.seq",
                    )
                    .bind(*user)
                    .bind(conv.as_str())
                    .execute(&mut *tx)
                    .await?;
                }
                if let GroupChange::Leave(user) = change {
                    let done = sqlx::query(
                        "DELETE FROM group_members WHERE group_id = $1 AND user_id = $2",
                    )
                    .bind(group_id)
                    .bind(user.as_str())
                    .execute(&mut *tx)
                    .await?;
                    if done.rows_affected() == 0 {
                        return Err(StoreError::NotMember(group_id.to_string()));
                    }
                }
                let members: Vec<String> = sqlx::query_scalar(
                    "SELECT user_id FROM group_members WHERE group_id = $1 ORDER BY user_id",
                )
                .bind(group_id)
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(members)
            }

        }
    };
}

pub(crate) use sql_store_impl;
