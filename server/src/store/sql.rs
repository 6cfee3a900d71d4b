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
                req: &$crate::store::GroupRequest,
            ) -> Result<$crate::store::GroupOutcome, $crate::store::StoreError> {
                let mut conn = self.writer().await?;
                let out = Self::group_change_on(&mut conn, group_id, req).await;
                if out.is_err() {
                    self.discard_writer(conn).await;
                }
                out
            }

            async fn group_members(
                &self,
                group_id: &str,
            ) -> Result<Option<(Vec<String>, u64)>, $crate::store::StoreError> {
                let row: Option<(i64, i32)> = sqlx::query_as(
                    "SELECT version, dissolved FROM chat_groups WHERE group_id = $1",
                )
                .bind(group_id)
                .fetch_optional(&self.read)
                .await?;
                let Some((version, 0)) = row else {
                    return Ok(None);
                };
                let members = sqlx::query_scalar(
                    "SELECT user_id FROM group_members WHERE group_id = $1 ORDER BY user_id",
                )
                .bind(group_id)
                .fetch_all(&self.read)
                .await?;
                Ok(Some((members, version.max(0) as u64)))
            }

            async fn group_versions(
                &self,
                group_ids: &[&str],
            ) -> Result<Vec<(String, u64)>, $crate::store::StoreError> {
                let mut out = Vec::with_capacity(group_ids.len());
                for chunk in group_ids.chunks($crate::store::sql::CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "SELECT group_id, version FROM chat_groups WHERE group_id IN (",
                    );
                    let mut list = qb.separated(", ");
                    for g in chunk {
                        list.push_bind(*g);
                    }
                    qb.push(")");
                    let rows: Vec<(String, i64)> = qb.build_query_as().fetch_all(&self.read).await?;
                    out.extend(rows.into_iter().map(|(g, v)| (g, v.max(0) as u64)));
                }
                Ok(out)
            }

            async fn group_info(
                &self,
                group_id: &str,
                limit: u32,
            ) -> Result<Option<$crate::store::GroupInfo>, $crate::store::StoreError> {
                let row: Option<(String, i64, i32, i32, i64, i32, i32)> = sqlx::query_as(
                    "SELECT created_by, created_at, kind, members_can_invite, version, \
                     dissolved, size FROM chat_groups WHERE group_id = $1",
                )
                .bind(group_id)
                .fetch_optional(&self.read)
                .await?;
                let Some((created_by, created_at, kind, invite, version, dissolved, size)) = row
                else {
                    return Ok(None);
                };
                let members: Vec<(String, i32)> = sqlx::query_as(
                    "SELECT user_id, role FROM group_members WHERE group_id = $1 \
                     ORDER BY user_id LIMIT $2",
                )
                .bind(group_id)
                .bind(limit as i64)
                .fetch_all(&self.read)
                .await?;
                let banned: Vec<String> = sqlx::query_scalar(
                    "SELECT user_id FROM group_bans WHERE group_id = $1 ORDER BY user_id LIMIT $2",
                )
                .bind(group_id)
                .bind(limit as i64)
                .fetch_all(&self.read)
                .await?;
                Ok(Some($crate::store::GroupInfo {
                    group_id: group_id.to_string(),
                    kind: if kind == im_proto::group_op::Kind::Public as i32 {
                        "public"
                    } else {
                        "private"
                    },
                    members_can_invite: invite != 0,
                    created_by,
                    created_at,
                    version: version.max(0) as u64,
                    dissolved: dissolved != 0,
                    size: size.max(0) as u32,
                    members: members
                        .into_iter()
                        .map(|(u, r)| (u, $crate::store::role_name(r)))
                        .collect(),
                    banned,
                }))
            }

            async fn revoke(&self, user_id: &str, at: i64) -> Result<(), $crate::store::StoreError> {
                let mut conn = self.writer().await?;
                let out = sqlx::query(
                    "INSERT INTO revocations (user_id, revoked_at) VALUES ($1, $2) \
                     ON CONFLICT (user_id) DO UPDATE SET revoked_at = excluded.revoked_at \
                     WHERE excluded.revoked_at > revocations.revoked_at",
                )
                .bind(user_id)
                .bind(at)
                .execute(&mut *conn)
                .await;
                if out.is_err() {
                    self.discard_writer(conn).await;
                }
                out?;
                Ok(())
            }

            async fn revocations(&self) -> Result<Vec<(String, i64)>, $crate::store::StoreError> {
                Ok(sqlx::query_as("SELECT user_id, revoked_at FROM revocations")
                    .fetch_all(&self.read)
                    .await?)
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
                // Named conversations the user has no record of are read as given (within
                // the intervals below, so a group they never joined reads nothing).
                plan.extend(given.into_iter().map(|(c, s)| (c.to_string(), s)));
                plan.sort();
                plan.dedup_by(|a, b| a.0 == b.0);
                let mut out = Vec::new();
                let mut bytes = 0usize;
                let mut more = false;
                'convs: for (conv, after) in plan {
                    // The seq ranges the user may read: a group's membership intervals,
                    // all of a one-to-one conversation.
                    let ranges: Vec<(i64, Option<i64>)> =
                        match im_proto::parse_conversation(&conv) {
                            Some(im_proto::ConversationRef::Group(g)) => sqlx::query_as(
                                "SELECT joined_seq, left_seq FROM group_intervals \
                                 WHERE group_id = $1 AND user_id = $2 ORDER BY joined_seq",
                            )
                            .bind(g)
                            .bind(user_id)
                            .fetch_all(&self.read)
                            .await?,
                            _ => vec![(0, None)],
                        };
                    for (joined, left) in ranges {
                        let from = (after as i64).max(joined - 1);
                        let to = left.unwrap_or(i64::MAX);
                        if from >= to {
                            continue;
                        }
                        let room = limit as usize - out.len();
                        if room == 0 || bytes >= max_bytes {
                            more = true;
                            break 'convs;
                        }
                        // Streamed: the page stops at its byte budget without reading the
                        // rest.
                        let mut rows = sqlx::query(
                            "SELECT conversation_id, sender, payload, send_time, msg_type, seq, \
                             msg_id, client_msg_id FROM messages \
                             WHERE conversation_id = $1 AND seq > $2 AND seq <= $3 \
                             ORDER BY seq LIMIT $4",
                        )
                        .bind(conv.as_str())
                        .bind(from)
                        .bind(to)
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
                                ..Default::default()
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
                            break 'convs;
                        }
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

            async fn presence_peers(
                &self,
                user_id: &str,
                candidates: &[&str],
            ) -> Result<Vec<String>, $crate::store::StoreError> {
                let mut out = Vec::new();
                for chunk in candidates.chunks($crate::store::sql::CHUNK) {
                    // One-to-one conversations that exist between them.
                    let direct: Vec<(String, &str)> = chunk
                        .iter()
                        .map(|u| (im_proto::direct_conversation(user_id, u), *u))
                        .collect();
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "SELECT conversation_id FROM user_conversations WHERE user_id = ",
                    );
                    qb.push_bind(user_id);
                    qb.push(" AND conversation_id IN (");
                    let mut list = qb.separated(", ");
                    for (c, _) in &direct {
                        list.push_bind(c.as_str());
                    }
                    qb.push(")");
                    let rows: Vec<(String,)> = qb.build_query_as().fetch_all(&self.read).await?;
                    for (c,) in rows {
                        if let Some((_, u)) = direct.iter().find(|(d, _)| *d == c) {
                            out.push((*u).to_owned());
                        }
                    }
                    // A group both are members of.
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "SELECT DISTINCT b.user_id FROM group_members a \
                         JOIN group_members b ON b.group_id = a.group_id WHERE a.user_id = ",
                    );
                    qb.push_bind(user_id);
                    qb.push(" AND b.user_id IN (");
                    let mut list = qb.separated(", ");
                    for u in chunk {
                        list.push_bind(*u);
                    }
                    qb.push(")");
                    let rows: Vec<(String,)> = qb.build_query_as().fetch_all(&self.read).await?;
                    out.extend(rows.into_iter().map(|(u,)| u));
                }
                out.sort_unstable();
                out.dedup();
                Ok(out)
            }

            async fn presence_hidden(
                &self,
                users: &[&str],
            ) -> Result<Vec<String>, $crate::store::StoreError> {
                let mut out = Vec::new();
                for chunk in users.chunks($crate::store::sql::CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "SELECT user_id FROM presence_settings WHERE hidden <> 0 AND user_id IN (",
                    );
                    let mut list = qb.separated(", ");
                    for u in chunk {
                        list.push_bind(*u);
                    }
                    qb.push(")");
                    let rows: Vec<(String,)> = qb.build_query_as().fetch_all(&self.read).await?;
                    out.extend(rows.into_iter().map(|(u,)| u));
                }
                Ok(out)
            }

            async fn set_presence_hidden(
                &self,
                user_id: &str,
                hidden: bool,
            ) -> Result<(), $crate::store::StoreError> {
                let mut conn = self.writer().await?;
                let out: Result<(), $crate::store::StoreError> = sqlx::query(
                    "INSERT INTO presence_settings (user_id, hidden) VALUES ($1, $2) \
                     ON CONFLICT (user_id) DO UPDATE SET hidden = excluded.hidden",
                )
                .bind(user_id)
                .bind(i32::from(hidden))
                .execute(&mut *conn)
                .await
                .map(|_| ())
                .map_err(Into::into);
                if out.is_err() {
                    self.discard_writer(conn).await;
                }
                out
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

                // 1. Dedup: look up every (sender, conversation, client_msg_id) already stored.
                let keyed: Vec<&$crate::store::NewMessage> = messages
                    .iter()
                    .filter(|m| !m.client_msg_id.is_empty())
                    .collect();
                let mut found: HashMap<(String, String, String), Committed> = HashMap::new();
                for chunk in keyed.chunks(CHUNK) {
                    // A join against the keys, so both engines probe the unique index
                    // (SQLite scans the whole index for a row-value `IN (VALUES ...)`).
                    let mut qb = sqlx::QueryBuilder::<$db>::new("WITH k (s, v, c) AS (");
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
                    for row in qb.build().fetch_all(&mut *tx).await? {
                        let seq: i64 = row.try_get("seq")?;
                        found.insert(
                            (
                                row.try_get("sender")?,
                                row.try_get("conversation_id")?,
                                row.try_get("client_msg_id")?,
                            ),
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
                let mut first_of: HashMap<(&str, &str, &str), usize> = HashMap::new();
                let mut dup_of: Vec<(usize, usize)> = Vec::new();
                // Per conversation, in order of first appearance: (id, new messages, parties).
                let mut counts: Vec<(&str, u64, Option<&(String, String)>)> = Vec::new();
                let mut conv_index: HashMap<&str, usize> = HashMap::new();
                for (i, m) in messages.iter().enumerate() {
                    if !m.client_msg_id.is_empty() {
                        let key = (
                            m.sender.as_str(),
                            m.conversation_id.as_str(),
                            m.client_msg_id.as_str(),
                        );
                        let owned = (
                            m.sender.clone(),
                            m.conversation_id.clone(),
                            m.client_msg_id.clone(),
                        );
                        if let Some(c) = found.get(&owned) {
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
                    // A duplicate committed meanwhile by another node loses here instead of
                    // failing the batch; it is re-read below and acked as a duplicate.
                    qb.push(" ON CONFLICT DO NOTHING RETURNING seq, conversation_id");
                    let mut stored: std::collections::HashSet<(String, i64)> =
                        std::collections::HashSet::new();
                    for row in qb.build().fetch_all(&mut *tx).await? {
                        stored.insert((row.try_get(1)?, row.try_get(0)?));
                    }
                    for &i in chunk {
                        let m = &messages[i];
                        let seq = results[i].as_ref().map_or(0, |c| c.seq as i64);
                        if stored.contains(&(m.conversation_id.clone(), seq)) {
                            continue;
                        }
                        let row = sqlx::query(
                            "SELECT msg_id, seq, send_time FROM messages WHERE sender = $1 \
                             AND conversation_id = $2 AND client_msg_id = $3",
                        )
                        .bind(m.sender.as_str())
                        .bind(m.conversation_id.as_str())
                        .bind(m.client_msg_id.as_str())
                        .fetch_one(&mut *tx)
                        .await?;
                        let seq: i64 = row.try_get("seq")?;
                        results[i] = Some(Committed {
                            msg_id: row.try_get("msg_id")?,
                            conversation_id: m.conversation_id.clone(),
                            seq: seq as u64,
                            server_time: row.try_get("send_time")?,
                            duplicate: true,
                        });
                    }
                }

                for (i, j) in dup_of {
                    results[i] = results[j].clone().map(|c| Committed {
                        duplicate: true,
                        ..c
                    });
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
                req: &$crate::store::GroupRequest,
            ) -> Result<$crate::store::GroupOutcome, $crate::store::StoreError> {
                use im_proto::group_op::{Kind, Op, Role};
                use sqlx::Row;
                use $crate::store::access::{self, Group, Plan, Target};
                use $crate::store::sql::CHUNK;
                use $crate::store::{GroupOutcome, GroupState, StoreError};

                let mut tx = sqlx::Connection::begin(&mut **conn).await?;
                let conv = im_proto::group_conversation(group_id);
                let now = im_proto::now_ms();
                let row: Option<(i32, i32, i64, i32, i32)> = sqlx::query_as(
                    "SELECT kind, members_can_invite, version, dissolved, size \
                     FROM chat_groups WHERE group_id = $1",
                )
                .bind(group_id)
                .fetch_optional(&mut *tx)
                .await?;
                let role_of = |r: Option<i32>| {
                    r.and_then(|r| Role::try_from(r).ok()).unwrap_or(Role::None)
                };
                let (group, version, plan) = if req.op == Op::Create {
                    if row.is_some() {
                        return Err(StoreError::GroupExists(group_id.to_string()));
                    }
                    let owned: i64 = sqlx::query_scalar(
                        "SELECT COUNT(*) FROM chat_groups WHERE created_by = $1 AND dissolved = 0",
                    )
                    .bind(req.actor.as_str())
                    .fetch_one(&mut *tx)
                    .await?;
                    let plan = access::decide_create(req, owned as u64)?;
                    sqlx::query(
                        "INSERT INTO chat_groups (group_id, created_by, created_at, kind, \
                         members_can_invite) VALUES ($1, $2, $3, $4, $5)",
                    )
                    .bind(group_id)
                    .bind(req.actor.as_str())
                    .bind(now)
                    .bind(req.kind as i32)
                    .bind(req.members_can_invite as i32)
                    .execute(&mut *tx)
                    .await?;
                    let group = Group {
                        kind: req.kind,
                        members_can_invite: req.members_can_invite,
                        size: 0,
                    };
                    (group, 0u64, plan)
                } else {
                    let Some((kind, invite, version, dissolved, size)) = row else {
                        return Err(StoreError::GroupNotFound(group_id.to_string()));
                    };
                    if dissolved != 0 {
                        return Err(StoreError::GroupNotFound(group_id.to_string()));
                    }
                    let group = Group {
                        kind: Kind::try_from(kind).unwrap_or(Kind::Private),
                        members_can_invite: invite != 0,
                        size: size.max(0) as u32,
                    };
                    let actor: Option<i32> = sqlx::query_scalar(
                        "SELECT role FROM group_members WHERE group_id = $1 AND user_id = $2",
                    )
                    .bind(group_id)
                    .bind(req.actor.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
                    // Every named user's role and ban, set-based (a join on the keys).
                    let named = access::named_users(req);
                    let mut found: std::collections::HashMap<String, (Option<i32>, bool)> =
                        std::collections::HashMap::new();
                    for chunk in named.chunks(CHUNK) {
                        let mut qb = sqlx::QueryBuilder::<$db>::new("WITH k (u) AS (");
                        qb.push_values(chunk, |mut b, u| {
                            b.push_bind(u.as_str());
                        });
                        qb.push(
                            ") SELECT k.u, m.role, b.user_id FROM k \
                             LEFT JOIN group_members m ON m.group_id = ",
                        );
                        qb.push_bind(group_id);
                        qb.push(" AND m.user_id = k.u LEFT JOIN group_bans b ON b.group_id = ");
                        qb.push_bind(group_id);
                        qb.push(" AND b.user_id = k.u");
                        for r in qb.build().fetch_all(&mut *tx).await? {
                            let banned: Option<String> = r.try_get(2)?;
                            found.insert(r.try_get(0)?, (r.try_get(1)?, banned.is_some()));
                        }
                    }
                    let targets: Vec<Target> = named
                        .into_iter()
                        .map(|u| {
                            let (role, banned) = found.get(&u).copied().unwrap_or((None, false));
                            Target {
                                user: u,
                                role: role_of(role),
                                banned,
                            }
                        })
                        .collect();
                    let plan = access::decide(group_id, req, group, role_of(actor), &targets)?;
                    (group, version.max(0) as u64, plan)
                };

                // Dissolving lists everyone for the event and for the caller's cache.
                let everyone: Vec<String> = if plan == Plan::Dissolve {
                    sqlx::query_scalar("SELECT user_id FROM group_members WHERE group_id = $1")
                        .bind(group_id)
                        .fetch_all(&mut *tx)
                        .await?
                } else {
                    Vec::new()
                };
                let added: Vec<(String, Role)> = match &plan {
                    Plan::Create(m) => m.clone(),
                    Plan::Add(users) => users.iter().map(|u| (u.clone(), Role::Member)).collect(),
                    _ => Vec::new(),
                };
                let removed: Vec<String> = match &plan {
                    Plan::Remove { members, .. } => members.clone(),
                    Plan::Dissolve => everyone.clone(),
                    _ => Vec::new(),
                };
                let size = (group.size as i64 + added.len() as i64 - removed.len() as i64).max(0);
                if size > req.max_members as i64 {
                    return Err(StoreError::GroupFull(group_id.to_string(), req.max_members));
                }

                // The SYSTEM event takes the next seq of the group's conversation; members
                // who join read from it, members who leave read up to it.
                let mut event = None;
                let mut version = version;
                if let Some(payload) = access::event(req, &plan, &everyone) {
                    let seq: i64 = sqlx::query_scalar(
                        "INSERT INTO conversations (conversation_id, last_seq) VALUES ($1, 1) \
                         ON CONFLICT (conversation_id) DO UPDATE \
                         SET last_seq = conversations.last_seq + 1 RETURNING last_seq",
                    )
                    .bind(conv.as_str())
                    .fetch_one(&mut *tx)
                    .await?;
                    let msg_id = uuid::Uuid::now_v7().simple().to_string();
                    let payload = im_proto::Message::encode_to_vec(&payload);
                    sqlx::query(
                        "INSERT INTO messages (conversation_id, seq, msg_id, sender, \
                         client_msg_id, msg_type, payload, send_time) \
                         VALUES ($1, $2, $3, '', NULL, $4, $5, $6)",
                    )
                    .bind(conv.as_str())
                    .bind(seq)
                    .bind(msg_id.as_str())
                    .bind(im_proto::MessageType::System as i32)
                    .bind(payload.as_slice())
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                    version = seq as u64;
                    event = Some(im_proto::ChatMessage {
                        conversation_id: conv.clone(),
                        sender: String::new(),
                        payload: payload.into(),
                        send_time: now,
                        r#type: im_proto::MessageType::System as i32,
                        seq: seq as u64,
                        msg_id,
                        client_msg_id: String::new(),
                        ..Default::default()
                    });
                }
                let v = version as i64;

                for chunk in added.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO group_members (group_id, user_id, joined_at, role) ",
                    );
                    qb.push_values(chunk, |mut b, (u, r)| {
                        b.push_bind(group_id)
                            .push_bind(u.as_str())
                            .push_bind(now)
                            .push_bind(*r as i32);
                    });
                    qb.build().execute(&mut *tx).await?;
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO group_intervals (group_id, user_id, joined_seq) ",
                    );
                    qb.push_values(chunk, |mut b, (u, _)| {
                        b.push_bind(group_id).push_bind(u.as_str()).push_bind(v);
                    });
                    qb.build().execute(&mut *tx).await?;
                    // A new member's cursor sits just before its join event.
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO cursors (user_id, conversation_id, seq) ",
                    );
                    qb.push_values(chunk, |mut b, (u, _)| {
                        b.push_bind(u.as_str())
                            .push_bind(conv.as_str())
                            .push_bind(v - 1);
                    });
                    qb.push(
                        " ON CONFLICT (user_id, conversation_id) DO UPDATE SET seq = excluded.seq",
                    );
                    qb.build().execute(&mut *tx).await?;
                }
                if plan == Plan::Dissolve {
                    sqlx::query("DELETE FROM group_members WHERE group_id = $1")
                        .bind(group_id)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(
                        "UPDATE group_intervals SET left_seq = $2 \
                         WHERE group_id = $1 AND left_seq IS NULL",
                    )
                    .bind(group_id)
                    .bind(v)
                    .execute(&mut *tx)
                    .await?;
                } else {
                    for chunk in removed.chunks(CHUNK) {
                        for (table, head) in [
                            ("group_members", "DELETE FROM group_members WHERE group_id = "),
                            (
                                "group_intervals",
                                "UPDATE group_intervals SET left_seq = ",
                            ),
                        ] {
                            let mut qb = sqlx::QueryBuilder::<$db>::new(head);
                            if table == "group_intervals" {
                                qb.push_bind(v);
                                qb.push(" WHERE left_seq IS NULL AND group_id = ");
                            }
                            qb.push_bind(group_id);
                            qb.push(" AND user_id IN (");
                            let mut list = qb.separated(", ");
                            for u in chunk {
                                list.push_bind(u.as_str());
                            }
                            qb.push(")");
                            qb.build().execute(&mut *tx).await?;
                        }
                    }
                }
                match &plan {
                    Plan::Remove { ban, .. } => {
                        for chunk in ban.chunks(CHUNK) {
                            let mut qb = sqlx::QueryBuilder::<$db>::new(
                                "INSERT INTO group_bans (group_id, user_id, banned_by, banned_at) ",
                            );
                            qb.push_values(chunk, |mut b, u| {
                                b.push_bind(group_id)
                                    .push_bind(u.as_str())
                                    .push_bind(req.actor.as_str())
                                    .push_bind(now);
                            });
                            qb.push(" ON CONFLICT DO NOTHING");
                            qb.build().execute(&mut *tx).await?;
                        }
                    }
                    Plan::Unban(users) => {
                        for u in users {
                            sqlx::query("DELETE FROM group_bans WHERE group_id = $1 AND user_id = $2")
                                .bind(group_id)
                                .bind(u.as_str())
                                .execute(&mut *tx)
                                .await?;
                        }
                    }
                    Plan::SetRoles(roles) => {
                        for (u, r) in roles {
                            sqlx::query(
                                "UPDATE group_members SET role = $3 WHERE group_id = $1 AND user_id = $2",
                            )
                            .bind(group_id)
                            .bind(u.as_str())
                            .bind(*r as i32)
                            .execute(&mut *tx)
                            .await?;
                        }
                    }
                    _ => {}
                }
                if plan.has_event() {
                    // Relative and forward-only, so two nodes changing one group at once
                    // (serialised on the conversation row above) both count.
                    sqlx::query(
                        "UPDATE chat_groups SET size = size + $2, \
                         version = CASE WHEN version < $3 THEN $3 ELSE version END, \
                         dissolved = $4 WHERE group_id = $1",
                    )
                    .bind(group_id)
                    .bind((added.len() as i64 - removed.len() as i64) as i32)
                    .bind(v)
                    .bind((plan == Plan::Dissolve) as i32)
                    .execute(&mut *tx)
                    .await?;
                }
                let role: Option<i32> = sqlx::query_scalar(
                    "SELECT role FROM group_members WHERE group_id = $1 AND user_id = $2",
                )
                .bind(group_id)
                .bind(req.actor.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(GroupOutcome {
                    state: GroupState {
                        kind: group.kind,
                        members_can_invite: group.members_can_invite,
                        members: size as u32,
                        role: role_of(role),
                        version,
                    },
                    event,
                    added: added.into_iter().map(|(u, _)| u).collect(),
                    dissolved: plan == Plan::Dissolve,
                    removed,
                })
            }
        }
    };
}

pub(crate) use sql_store_impl;
