//! The SQL shared by both backends. SQLite (3.35+) and Postgres accept the same
//! statements here (`$N` parameters, multi-row `ON CONFLICT ... DO UPDATE ... RETURNING`,
//! `WITH k AS (VALUES ...)`), so the [`Store`](super::Store) logic is written once, as a macro
//! expanded for each backend's pool type. Each backend struct has `write` and `read`
//! pools.

/// Rows per multi-row statement (8 binds each stays far below both backends' limits).
pub(crate) const CHUNK: usize = 500;

/// The columns of a `messages` row (aliased `m`) that `rendered` reads, with `hidden`:
/// whether the reader (the statement's `$5`) deleted it for themselves, or it is an
/// EDIT event of a message they deleted. One primary-key probe of `hidden_messages`.
pub(crate) const MESSAGE_COLUMNS: &str = "m.conversation_id AS conversation_id, \
     m.sender AS sender, m.payload AS payload, m.send_time AS send_time, \
     m.msg_type AS msg_type, m.seq AS seq, m.msg_id AS msg_id, \
     m.client_msg_id AS client_msg_id, m.ref_seq AS ref_seq, m.ref_msg_id AS ref_msg_id, \
     m.state AS state, m.edit_time AS edit_time, CASE WHEN EXISTS (SELECT 1 FROM hidden_messages h \
     WHERE h.user_id = $5 AND h.conversation_id = m.conversation_id \
     AND h.seq IN (m.seq, CASE WHEN m.msg_type = 5 THEN m.ref_seq ELSE 0 END)) \
     THEN 1 ELSE 0 END AS hidden";

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
                self.commit(messages, cursors).await
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
                        let select = format!(
                            "SELECT {} FROM messages m \
                             WHERE m.conversation_id = $1 AND m.seq > $2 AND m.seq <= $3 \
                             ORDER BY m.seq LIMIT $4",
                            $crate::store::sql::MESSAGE_COLUMNS
                        );
                        let mut rows = sqlx::query(&select)
                        .bind(conv.as_str())
                        .bind(from)
                        .bind(to)
                        .bind(room as i64 + 1)
                        .bind(user_id)
                        .fetch(&self.read);
                        let mut taken = 0usize;
                        while let Some(r) = futures_util::TryStreamExt::try_next(&mut rows).await? {
                            if taken == room {
                                more = true;
                                break;
                            }
                            let m = Self::rendered(&r)?;
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

            async fn sync_device(
                &self,
                user_id: &str,
                device_id: &str,
                cursors: &[(String, u64)],
                limit: u32,
                max_bytes: usize,
            ) -> Result<(Vec<$crate::store::StoredMessage>, bool), $crate::store::StoreError> {
                // Every conversation of the user gets an explicit cursor (the device's,
                // 0 without one), which overrides the user's stored cursor; the
                // request's own cursors win over both.
                let stored: Vec<(String, i64)> = sqlx::query_as(
                    "SELECT c.conversation_id, COALESCE(k.delivered_seq, 0) FROM \
                     (SELECT conversation_id FROM user_conversations WHERE user_id = $1 \
                      UNION SELECT 'g:' || group_id FROM group_members WHERE user_id = $1) c \
                     LEFT JOIN device_cursors k ON k.user_id = $1 AND k.device_id = $2 \
                     AND k.conversation_id = c.conversation_id",
                )
                .bind(user_id)
                .bind(device_id)
                .fetch_all(&self.read)
                .await?;
                let given: std::collections::HashSet<&str> =
                    cursors.iter().map(|(c, _)| c.as_str()).collect();
                let mut all: Vec<(String, u64)> = cursors.to_vec();
                all.extend(
                    stored
                        .into_iter()
                        .filter(|(c, _)| !given.contains(c.as_str()))
                        .map(|(c, s)| (c, s.max(0) as u64)),
                );
                $crate::store::Store::sync_page(self, user_id, &all, limit, max_bytes).await
            }

            async fn commit_state(
                &self,
                reads: &[$crate::store::ReadUpdate],
                flags: &[$crate::store::FlagsUpdate],
            ) -> Result<Vec<$crate::store::ReadMoved>, $crate::store::StoreError> {
                let mut conn = self.writer().await?;
                let out = Self::commit_state_on(&mut conn, reads, flags).await;
                if out.is_err() {
                    self.discard_writer(conn).await;
                }
                out
            }

            async fn list_conversations(
                &self,
                user_id: &str,
                after: Option<&$crate::store::ListAfter>,
                limit: u32,
                preview_bytes: usize,
            ) -> Result<
                (Vec<im_proto::ConversationSummary>, Option<$crate::store::ListAfter>),
                $crate::store::StoreError,
            > {
                use sqlx::Row;
                // 1. The page's keys, in list order (pinned, last_time, id, all
                //    descending), from three sources merged here: the pinned ones (a
                //    partial index), the one-to-one ones (an index range on
                //    user_conversations, which carries each party's last activity), the
                //    groups (the user's memberships joined with their conversations).
                let limit = limit.max(1) as usize;
                let keyset = |on: bool, t: &str, c: &str| {
                    if on {
                        format!(" AND ({t}, {c}) < ($2, $3)")
                    } else {
                        " AND $2 = $2 AND $3 = $3".to_owned()
                    }
                };
                let not_pinned = |c: &str| {
                    format!(
                        " AND NOT EXISTS (SELECT 1 FROM conversation_state s \
                         WHERE s.user_id = $1 AND s.conversation_id = {c} AND s.pinned <> 0)"
                    )
                };
                let (at, ac) = match after {
                    Some(a) => (a.last_time, a.conversation_id.as_str()),
                    None => (0, ""),
                };
                // (pinned, last_time, conversation id, group)
                let mut keys: Vec<(bool, i64, String, bool)> = Vec::new();
                if after.map_or(true, |a| a.pinned) {
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
                        .fetch_all(&self.read)
                        .await?;
                    keys.extend(
                        rows.into_iter()
                            .map(|(c, t)| (true, t, c.clone(), c.starts_with("g:"))),
                    );
                }
                if keys.len() < limit {
                    let need = (limit - keys.len()) as i64;
                    let rest = after.is_some_and(|a| !a.pinned);
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
                            .bind(need)
                            .fetch_all(&self.read)
                            .await?;
                        merged.extend(rows.into_iter().map(|(c, t)| (t, c, group)));
                    }
                    merged.sort_unstable_by(|a, b| (b.0, &b.1).cmp(&(a.0, &a.1)));
                    merged.truncate(need as usize);
                    keys.extend(merged.into_iter().map(|(t, c, g)| (false, t, c, g)));
                }
                if keys.is_empty() {
                    return Ok((Vec::new(), None));
                }

                // 2. The details of those rows only: the visible last message, the
                //    bounded unread count, the group's size, the other party's cursor.
                let mut qb = sqlx::QueryBuilder::<$db>::new("WITH k (cid, grp, ord) AS (");
                qb.push_values(keys.iter().enumerate(), |mut b, (i, k)| {
                    b.push_bind(k.2.as_str())
                        .push_bind(k.3 as i32)
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
                qb.push_bind($crate::store::UNREAD_CAP as i64);
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
                let rows = qb.build().fetch_all(&self.read).await?;
                let mut out = Vec::with_capacity(rows.len());
                for r in &rows {
                    let cid: String = r.try_get("cid")?;
                    let grp: i32 = r.try_get("grp")?;
                    let last_seq: i64 = r.try_get("last_seq")?;
                    let size: Option<i32> = r.try_get("size")?;
                    let peer: Option<i64> = r.try_get("peer")?;
                    let unread: i64 = r.try_get("unread")?;
                    let seq: Option<i64> = r.try_get("seq")?;
                    let last_message = match seq {
                        Some(seq) => {
                            let mut payload: Vec<u8> = r.try_get("payload")?;
                            payload.truncate(preview_bytes);
                            let cmid: Option<String> = r.try_get("client_msg_id")?;
                            Some(im_proto::ChatMessage {
                                conversation_id: cid.clone(),
                                sender: r.try_get("sender")?,
                                payload: payload.into(),
                                send_time: r.try_get("send_time")?,
                                r#type: r.try_get("msg_type")?,
                                seq: seq as u64,
                                msg_id: r.try_get("msg_id")?,
                                client_msg_id: cmid.unwrap_or_default(),
                                ..Default::default()
                            })
                        }
                        None => None,
                    };
                    let (kind, name, size) = match im_proto::parse_conversation(&cid) {
                        Some(im_proto::ConversationRef::Group(g)) if grp == 1 => (
                            im_proto::ConversationKind::Group,
                            g.to_owned(),
                            size.unwrap_or(0).max(0) as u32,
                        ),
                        Some(im_proto::ConversationRef::Direct(a, b)) => (
                            im_proto::ConversationKind::Direct,
                            if a == user_id { b.to_owned() } else { a.to_owned() },
                            2,
                        ),
                        _ => (im_proto::ConversationKind::Direct, String::new(), 0),
                    };
                    let muted: i32 = r.try_get("muted")?;
                    let pinned: i32 = r.try_get("pinned")?;
                    let read_seq: i64 = r.try_get("read_seq")?;
                    out.push(im_proto::ConversationSummary {
                        conversation_id: cid,
                        kind: kind as i32,
                        name,
                        size,
                        last_message,
                        last_seq: last_seq.max(0) as u64,
                        last_time: r.try_get("last_time")?,
                        read_seq: read_seq.max(0) as u64,
                        unread: (unread.max(0) as u32).min($crate::store::UNREAD_CAP),
                        muted: muted != 0,
                        pinned: pinned != 0,
                        peer_read_seq: peer.unwrap_or(0).max(0) as u64,
                    });
                }
                // The next page starts after this page's last key (as ordered above).
                let next = match keys.last() {
                    Some((pinned, last_time, conversation_id, _)) if keys.len() >= limit => {
                        Some($crate::store::ListAfter {
                            pinned: *pinned,
                            last_time: *last_time,
                            conversation_id: conversation_id.clone(),
                        })
                    }
                    _ => None,
                };
                Ok((out, next))
            }

            async fn read_count(
                &self,
                conversation_id: &str,
                seq: u64,
            ) -> Result<(u32, String), $crate::store::StoreError> {
                let count: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM conversation_state \
                     WHERE conversation_id = $1 AND read_seq >= $2",
                )
                .bind(conversation_id)
                .bind(seq as i64)
                .fetch_one(&self.read)
                .await?;
                let sender: Option<String> = sqlx::query_scalar(
                    "SELECT sender FROM messages WHERE conversation_id = $1 AND seq = $2",
                )
                .bind(conversation_id)
                .bind(seq as i64)
                .fetch_optional(&self.read)
                .await?;
                Ok((count.clamp(0, u32::MAX as i64) as u32, sender.unwrap_or_default()))
            }

            async fn device_cursor(
                &self,
                user_id: &str,
                device_id: &str,
                conversation_id: &str,
            ) -> Result<(u64, u64), $crate::store::StoreError> {
                let row: Option<(i64, i64)> = sqlx::query_as(
                    "SELECT delivered_seq, read_seq FROM device_cursors \
                     WHERE user_id = $1 AND device_id = $2 AND conversation_id = $3",
                )
                .bind(user_id)
                .bind(device_id)
                .bind(conversation_id)
                .fetch_optional(&self.read)
                .await?;
                let (d, r) = row.unwrap_or((0, 0));
                Ok((d.max(0) as u64, r.max(0) as u64))
            }

            async fn history_page(
                &self,
                user_id: &str,
                conversation_id: &str,
                before_seq: u64,
                limit: u32,
                max_bytes: usize,
            ) -> Result<(Vec<$crate::store::StoredMessage>, bool), $crate::store::StoreError> {
                // The seq ranges the user may read, newest first: a group's membership
                // intervals (from the join event to the leave event), all of a one-to-one
                // conversation.
                let ranges: Vec<(i64, Option<i64>)> =
                    match im_proto::parse_conversation(conversation_id) {
                        Some(im_proto::ConversationRef::Group(g)) => sqlx::query_as(
                            "SELECT joined_seq, left_seq FROM group_intervals \
                             WHERE group_id = $1 AND user_id = $2 ORDER BY joined_seq DESC",
                        )
                        .bind(g)
                        .bind(user_id)
                        .fetch_all(&self.read)
                        .await?,
                        Some(_) => vec![(1, None)],
                        None => return Ok((Vec::new(), false)),
                    };
                let top = match before_seq {
                    0 => i64::MAX,
                    b => b.min(i64::MAX as u64) as i64 - 1,
                };
                let limit = limit as usize;
                let mut out = Vec::new();
                let mut bytes = 0usize;
                let mut more = false;
                'ranges: for (joined, left) in ranges {
                    let hi = top.min(left.unwrap_or(i64::MAX));
                    let lo = joined.max(1);
                    if hi < lo {
                        continue;
                    }
                    // One row past the room left says whether more remain, exactly (an
                    // empty older interval does not count).
                    let room = limit.saturating_sub(out.len());
                    let select = format!(
                        "SELECT {} FROM messages m \
                         WHERE m.conversation_id = $1 AND m.seq >= $2 AND m.seq <= $3 \
                         ORDER BY m.seq DESC LIMIT $4",
                        $crate::store::sql::MESSAGE_COLUMNS
                    );
                    let mut rows = sqlx::query(&select)
                    .bind(conversation_id)
                    .bind(lo)
                    .bind(hi)
                    .bind(room as i64 + 1)
                    .bind(user_id)
                    .fetch(&self.read);
                    while let Some(r) = futures_util::TryStreamExt::try_next(&mut rows).await? {
                        if out.len() >= limit {
                            more = true;
                            break 'ranges;
                        }
                        let m = Self::rendered(&r)?;
                        let size = $crate::store::message_bytes(&m);
                        if !out.is_empty() && bytes.saturating_add(size) > max_bytes {
                            more = true;
                            break 'ranges;
                        }
                        bytes = bytes.saturating_add(size);
                        out.push(m);
                    }
                }
                Ok((out, more))
            }

            async fn message_meta(
                &self,
                reader: &str,
                conversation_id: &str,
                seq: u64,
            ) -> Result<Option<$crate::store::MessageMeta>, $crate::store::StoreError> {
                if seq == 0 || seq > i64::MAX as u64 {
                    return Ok(None);
                }
                let row: Option<(String, i32, String, i32, i64)> = sqlx::query_as(
                    "SELECT sender, msg_type, msg_id, state, send_time FROM messages \
                     WHERE conversation_id = $1 AND seq = $2",
                )
                .bind(conversation_id)
                .bind(seq as i64)
                .fetch_optional(&self.read)
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
                    .fetch_optional(&self.read)
                    .await?;
                    if inside.is_none() {
                        return Ok(None);
                    }
                }
                Ok(Some($crate::store::MessageMeta {
                    sender,
                    msg_type,
                    msg_id,
                    state,
                    send_time,
                }))
            }

            async fn group_role(
                &self,
                group_id: &str,
                user_id: &str,
            ) -> Result<Option<i32>, $crate::store::StoreError> {
                Ok(sqlx::query_scalar(
                    "SELECT role FROM group_members WHERE group_id = $1 AND user_id = $2",
                )
                .bind(group_id)
                .bind(user_id)
                .fetch_optional(&self.read)
                .await?)
            }

            async fn find_client_msg(
                &self,
                conversation_id: &str,
                sender: &str,
                client_msg_id: &str,
            ) -> Result<Option<(u64, String)>, $crate::store::StoreError> {
                let row: Option<(i64, String)> = sqlx::query_as(
                    "SELECT seq, msg_id FROM messages WHERE sender = $1 \
                     AND conversation_id = $2 AND client_msg_id = $3",
                )
                .bind(sender)
                .bind(conversation_id)
                .bind(client_msg_id)
                .fetch_optional(&self.read)
                .await?;
                Ok(row.map(|(seq, id)| (seq.max(0) as u64, id)))
            }

            async fn hide_messages(
                &self,
                hidden: &[$crate::store::HiddenMessage],
            ) -> Result<(), $crate::store::StoreError> {
                let mut conn = self.writer().await?;
                let out = Self::hide_messages_on(&mut conn, hidden).await;
                if out.is_err() {
                    self.discard_writer(conn).await;
                }
                out
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

            async fn user_backlog(
                &self,
                user_id: &str,
                limit: u32,
            ) -> Result<Vec<$crate::store::UserBacklog>, $crate::store::StoreError> {
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
                .fetch_all(&self.read)
                .await?;
                Ok(rows
                    .into_iter()
                    .map(|(conversation_id, last_seq, cur)| $crate::store::UserBacklog {
                        conversation_id,
                        cursor: cur.max(0) as u64,
                        last_seq: last_seq.max(0) as u64,
                    })
                    .collect())
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
            /// A row selected with [`MESSAGE_COLUMNS`](crate::store::sql::MESSAGE_COLUMNS),
            /// rendered for its reader.
            fn rendered(
                r: &<$db as sqlx::Database>::Row,
            ) -> Result<$crate::store::StoredMessage, sqlx::Error> {
                use sqlx::Row;
                let hidden: i32 = r.try_get("hidden")?;
                let row = $crate::store::MessageRow {
                    conversation_id: r.try_get("conversation_id")?,
                    sender: r.try_get("sender")?,
                    payload: r.try_get("payload")?,
                    send_time: r.try_get("send_time")?,
                    msg_type: r.try_get("msg_type")?,
                    seq: r.try_get("seq")?,
                    msg_id: r.try_get("msg_id")?,
                    client_msg_id: r.try_get("client_msg_id")?,
                    ref_seq: r.try_get("ref_seq")?,
                    ref_msg_id: r.try_get("ref_msg_id")?,
                    state: r.try_get("state")?,
                    edit_time: r.try_get("edit_time")?,
                };
                Ok($crate::store::render_message(row, hidden != 0))
            }

            async fn hide_messages_on(
                conn: &mut sqlx::pool::PoolConnection<$db>,
                hidden: &[$crate::store::HiddenMessage],
            ) -> Result<(), $crate::store::StoreError> {
                let mut tx = sqlx::Connection::begin(&mut **conn).await?;
                for chunk in hidden.chunks($crate::store::sql::CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO hidden_messages (user_id, conversation_id, seq) ",
                    );
                    qb.push_values(chunk, |mut b, h| {
                        b.push_bind(h.user_id.as_str())
                            .push_bind(h.conversation_id.as_str())
                            .push_bind(h.seq.min(i64::MAX as u64) as i64);
                    });
                    qb.push(" ON CONFLICT DO NOTHING");
                    qb.build().execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn commit_state_on(
                conn: &mut sqlx::pool::PoolConnection<$db>,
                reads: &[$crate::store::ReadUpdate],
                flags: &[$crate::store::FlagsUpdate],
            ) -> Result<Vec<$crate::store::ReadMoved>, $crate::store::StoreError> {
                use std::collections::BTreeMap;
                use sqlx::Row;
                use $crate::store::sql::CHUNK;

                let mut tx = sqlx::Connection::begin(&mut **conn).await?;
                let now = im_proto::now_ms();
                // One row per key (a multi-row upsert may not touch a row twice), in key
                // order (the same lock order on every node).
                let mut users: BTreeMap<(&str, &str), i64> = BTreeMap::new();
                let mut devices: BTreeMap<(&str, &str, &str), i64> = BTreeMap::new();
                for r in reads {
                    let seq = r.seq.min(i64::MAX as u64) as i64;
                    let u = users
                        .entry((r.user_id.as_str(), r.conversation_id.as_str()))
                        .or_insert(0);
                    *u = (*u).max(seq);
                    let d = devices
                        .entry((
                            r.user_id.as_str(),
                            r.device_id.as_str(),
                            r.conversation_id.as_str(),
                        ))
                        .or_insert(0);
                    *d = (*d).max(seq);
                }
                let users: Vec<((&str, &str), i64)> = users.into_iter().collect();
                let mut moved = Vec::new();
                for chunk in users.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO conversation_state (user_id, conversation_id, read_seq, \
                         read_time) ",
                    );
                    qb.push_values(chunk, |mut b, ((user, conv), seq)| {
                        b.push_bind(*user)
                            .push_bind(*conv)
                            .push_bind(*seq)
                            .push_bind(now);
                    });
                    qb.push(
                        " ON CONFLICT (user_id, conversation_id) DO UPDATE \
                         SET read_seq = excluded.read_seq, read_time = excluded.read_time \
                         WHERE excluded.read_seq > conversation_state.read_seq \
                         RETURNING user_id, conversation_id, read_seq, read_time",
                    );
                    for row in qb.build().fetch_all(&mut *tx).await? {
                        let seq: i64 = row.try_get(2)?;
                        moved.push($crate::store::ReadMoved {
                            user_id: row.try_get(0)?,
                            conversation_id: row.try_get(1)?,
                            seq: seq.max(0) as u64,
                            read_time: row.try_get(3)?,
                        });
                    }
                }
                let devices: Vec<((&str, &str, &str), i64)> = devices.into_iter().collect();
                for chunk in devices.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO device_cursors (user_id, device_id, conversation_id, \
                         read_seq) ",
                    );
                    qb.push_values(chunk, |mut b, ((user, device, conv), seq)| {
                        b.push_bind(*user)
                            .push_bind(*device)
                            .push_bind(*conv)
                            .push_bind(*seq);
                    });
                    qb.push(
                        " ON CONFLICT (user_id, device_id, conversation_id) DO UPDATE \
                         SET read_seq = excluded.read_seq \
                         WHERE excluded.read_seq > device_cursors.read_seq",
                    );
                    qb.build().execute(&mut *tx).await?;
                }
                // Flags: the last request per key wins.
                let mut set: BTreeMap<(&str, &str), (bool, bool)> = BTreeMap::new();
                for f in flags {
                    set.insert(
                        (f.user_id.as_str(), f.conversation_id.as_str()),
                        (f.muted, f.pinned),
                    );
                }
                let set: Vec<((&str, &str), (bool, bool))> = set.into_iter().collect();
                for chunk in set.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO conversation_state (user_id, conversation_id, muted, \
                         pinned) ",
                    );
                    qb.push_values(chunk, |mut b, ((user, conv), (muted, pinned))| {
                        b.push_bind(*user)
                            .push_bind(*conv)
                            .push_bind(*muted as i32)
                            .push_bind(*pinned as i32);
                    });
                    qb.push(
                        " ON CONFLICT (user_id, conversation_id) DO UPDATE \
                         SET muted = excluded.muted, pinned = excluded.pinned",
                    );
                    qb.build().execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(moved)
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
                        "INSERT INTO conversations (conversation_id, last_seq, last_time) \
                         VALUES ($1, 1, $2) ON CONFLICT (conversation_id) DO UPDATE \
                         SET last_seq = conversations.last_seq + 1, last_time = $2 \
                         RETURNING last_seq",
                    )
                    .bind(conv.as_str())
                    .bind(now)
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

/// Expands the batch commit (`commit_batch_on`) for `$store` over database `$db`: the
/// Postgres one, where each statement is a network round trip and a multi-row statement
/// per table saves them. (SQLite commits on its own thread: `store::sqlite_commit`, the
/// same transaction statement for statement.)
macro_rules! sql_commit_impl {
    ($store:ty, $db:ty) => {
        impl $store {
            /// Applies a committed RECALL or EDIT event (at `seq`) to the message it
            /// names, inside the batch's transaction: the event row gets its reference;
            /// a recall empties the original (and the EDIT events of it), an edit
            /// replaces its payload unless it was recalled meanwhile (then the EDIT event
            /// itself is emptied, so a reader never finds the recalled text in it).
            async fn apply_change(
                tx: &mut sqlx::Transaction<'_, $db>,
                m: &$crate::store::NewMessage,
                r: &$crate::store::MessageRef,
                seq: u64,
                now: i64,
            ) -> Result<(), $crate::store::StoreError> {
                let conv = m.conversation_id.as_str();
                let target = r.seq.min(i64::MAX as u64) as i64;
                let empty: &[u8] = &[];
                sqlx::query(
                    "UPDATE messages SET ref_seq = $3, ref_msg_id = $4 \
                     WHERE conversation_id = $1 AND seq = $2",
                )
                .bind(conv)
                .bind(seq as i64)
                .bind(target)
                .bind(r.msg_id.as_str())
                .execute(&mut **tx)
                .await?;
                if m.msg_type == im_proto::MessageType::Recall as i32 {
                    sqlx::query(
                        "UPDATE messages SET state = 2, payload = $4, edit_time = 0 \
                         WHERE conversation_id = $1 AND seq = $2 AND msg_id = $3 \
                         AND msg_type NOT IN (3, 4, 5)",
                    )
                    .bind(conv)
                    .bind(target)
                    .bind(r.msg_id.as_str())
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
                } else if m.msg_type == im_proto::MessageType::Edit as i32 {
                    let changed = sqlx::query(
                        "UPDATE messages SET state = 1, payload = $4, edit_time = $5 \
                         WHERE conversation_id = $1 AND seq = $2 AND msg_id = $3 \
                         AND sender = $6 AND state <> 2 AND msg_type NOT IN (3, 4, 5)",
                    )
                    .bind(conv)
                    .bind(target)
                    .bind(r.msg_id.as_str())
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
                        .bind(seq as i64)
                        .bind(empty)
                        .execute(&mut **tx)
                        .await?;
                    }
                }
                Ok(())
            }

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
                        "INSERT INTO conversations (conversation_id, last_seq, last_time) ",
                    );
                    qb.push_values(chunk, |mut b, (conv, n, _)| {
                        b.push_bind(*conv).push_bind(*n as i64).push_bind(now);
                    });
                    qb.push(
                        " ON CONFLICT (conversation_id) DO UPDATE \
                         SET last_seq = conversations.last_seq + excluded.last_seq, \
                         last_time = excluded.last_time \
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
                        if let Some((a, b)) = direct {
                            // A one-to-one conversation: recorded for both parties, with
                            // its last activity (the conversation list's order).
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
                        "INSERT INTO user_conversations (user_id, conversation_id, last_time) ",
                    );
                    qb.push_values(chunk, |mut b, (user, conv)| {
                        b.push_bind(*user).push_bind(*conv).push_bind(now);
                    });
                    qb.push(
                        " ON CONFLICT (user_id, conversation_id) DO UPDATE \
                         SET last_time = excluded.last_time",
                    );
                    qb.build().execute(&mut *tx).await?;
                }
                $crate::store::batch::assign_seqs(messages, &fresh, &mut next, &mut results, now);

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

                $crate::store::batch::mark_duplicates(&mut results, &dup_of);

                // 4b. RECALL and EDIT events change the message they name, in this
                //     transaction, in seq order (a duplicate changed it when first stored).
                for &i in &fresh {
                    let m = &messages[i];
                    if let (Some(r), Some(c)) = (m.reference.as_ref(), results[i].as_ref()) {
                        if !c.duplicate {
                            Self::apply_change(&mut tx, m, r, c.seq, now).await?;
                        }
                    }
                }

                // 5. A sender has read their own messages: their read cursor moves to the
                //    last seq they sent in each conversation (forward only; rows locked
                //    in (user, conversation) order).
                let own: Vec<((&str, &str), i64)> =
                    $crate::store::batch::own_read_cursors(messages, &results)
                        .into_iter()
                        .collect();
                for chunk in own.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO conversation_state (user_id, conversation_id, read_seq, \
                         read_time) ",
                    );
                    qb.push_values(chunk, |mut b, ((user, conv), seq)| {
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
                    qb.build().execute(&mut *tx).await?;
                }

                // 6. Cursors move forward only: the device's, and the user's (the furthest
                //    of their devices). (The writer sends each (user, device,
                //    conversation) once per batch; rows are locked in key order, against
                //    deadlocks across nodes.)
                let mut devices: Vec<&$crate::store::CursorUpdate> = cursors.iter().collect();
                devices.sort_unstable_by(|a, b| {
                    (&a.user_id, &a.device_id, &a.conversation_id).cmp(&(
                        &b.user_id,
                        &b.device_id,
                        &b.conversation_id,
                    ))
                });
                devices.dedup_by(|a, b| {
                    (&a.user_id, &a.device_id, &a.conversation_id)
                        == (&b.user_id, &b.device_id, &b.conversation_id)
                });
                for chunk in devices.chunks(CHUNK) {
                    let mut qb = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO device_cursors (user_id, device_id, conversation_id, \
                         delivered_seq) ",
                    );
                    qb.push_values(chunk, |mut b, c| {
                        b.push_bind(c.user_id.as_str())
                            .push_bind(c.device_id.as_str())
                            .push_bind(c.conversation_id.as_str())
                            .push_bind(c.seq as i64);
                    });
                    qb.push(
                        " ON CONFLICT (user_id, device_id, conversation_id) DO UPDATE \
                         SET delivered_seq = excluded.delivered_seq \
                         WHERE excluded.delivered_seq > device_cursors.delivered_seq",
                    );
                    qb.build().execute(&mut *tx).await?;
                }
                let cursors: Vec<$crate::store::CursorUpdate> =
                    $crate::store::batch::furthest_cursors(cursors)
                    .into_iter()
                    .map(|((user_id, conversation_id), seq)| $crate::store::CursorUpdate {
                        user_id: user_id.to_owned(),
                        device_id: String::new(),
                        conversation_id: conversation_id.to_owned(),
                        seq,
                    })
                    .collect();
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
                Ok($crate::store::batch::answers(results, now))
            }
        }
    };
}

pub(crate) use sql_commit_impl;
