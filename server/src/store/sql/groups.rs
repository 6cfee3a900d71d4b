//! Groups in SQL: the change transaction (gather the inputs, let `store::access` decide,
//! apply the [`Plan`] with set-based statements and write its SYSTEM event) and the
//! group reads.

use std::collections::HashMap;

use im_proto::group_op::{Kind, Op, Role};
use sqlx::pool::PoolConnection;
use sqlx::{ColumnIndex, Database, Executor, IntoArguments, Pool, Row, Transaction};

use super::{Bind, Col, Sql, Statement, CHUNK};
use crate::store::access::{self, Group, Plan, Target};
use crate::store::{
    role_name, GroupInfo, GroupOutcome, GroupRequest, GroupState, StoreError, StoredMessage,
};

/// A role as stored, `None` for a non-member.
fn role_of(r: Option<i32>) -> Role {
    r.and_then(|r| Role::try_from(r).ok()).unwrap_or(Role::None)
}

/// What a plan changes in membership: who joins (with their role) and who leaves.
struct Membership {
    added: Vec<(String, Role)>,
    removed: Vec<String>,
}

impl Membership {
    /// The joins and leaves of `plan`; `everyone` is the member list a dissolve empties.
    fn of(plan: &Plan, everyone: &[String]) -> Self {
        let added = match plan {
            Plan::Create(m) => m.clone(),
            Plan::Add(users) => users.iter().map(|u| (u.clone(), Role::Member)).collect(),
            _ => Vec::new(),
        };
        let removed = match plan {
            Plan::Remove { members, .. } => members.clone(),
            Plan::Dissolve => everyone.to_vec(),
            _ => Vec::new(),
        };
        Membership { added, removed }
    }

    /// The member count change.
    fn delta(&self) -> i64 {
        self.added.len() as i64 - self.removed.len() as i64
    }
}

impl<DB: Database> Sql<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    i64: Col<DB>,
    i32: Col<DB>,
    String: Col<DB>,
    for<'q> &'q str: Bind<'q, DB>,
    for<'q> &'q [u8]: Bind<'q, DB>,
{
    /// Applies a group operation in one transaction ([`Store::group_change`]); with
    /// `outbox`, its SYSTEM event also gets a webhook outbox row, with `region_outbox`
    /// a replication outbox row (`store::repl`).
    ///
    /// [`Store::group_change`]: crate::store::Store::group_change
    pub(crate) async fn group_change(
        conn: &mut PoolConnection<DB>,
        group_id: &str,
        req: &GroupRequest,
        outbox: bool,
        region_outbox: bool,
    ) -> Result<GroupOutcome, StoreError> {
        let mut tx = super::begin_write::<DB>(&mut **conn).await?;
        let now = im_proto::now_ms();
        let row: Option<(i32, i32, i64, i32, i32)> = sqlx::query_as(
            "SELECT kind, members_can_invite, version, dissolved, size \
             FROM chat_groups WHERE group_id = $1",
        )
        .bind(group_id)
        .fetch_optional(&mut *tx)
        .await?;
        let (group, version, plan) = if req.op == Op::Create {
            if row.is_some() {
                return Err(StoreError::GroupExists(group_id.to_owned()));
            }
            Self::create_group(&mut tx, group_id, req, now).await?
        } else {
            let Some((kind, invite, version, 0, size)) = row else {
                return Err(StoreError::GroupNotFound(group_id.to_owned()));
            };
            let group = Group {
                kind: Kind::try_from(kind).unwrap_or(Kind::Private),
                members_can_invite: invite != 0,
                size: size.max(0) as u32,
            };
            let plan = Self::decide_change(&mut tx, group_id, req, group).await?;
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
        let change = Membership::of(&plan, &everyone);
        let size = (group.size as i64 + change.delta()).max(0);
        if size > req.max_members as i64 {
            return Err(StoreError::GroupFull(group_id.to_owned(), req.max_members));
        }
        let event = Self::write_event(&mut tx, group_id, req, &plan, &everyone, now).await?;
        if let Some(e) = event.as_ref().filter(|_| outbox) {
            // The webhooks' group.changed, in the change's transaction (`store::outbox`).
            sqlx::query(
                "INSERT INTO webhook_outbox (conversation_id, seq, created_ms) VALUES ($1, $2, $3)",
            )
            .bind(e.conversation_id.as_str())
            .bind(e.seq as i64)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        if let Some(e) = event.as_ref().filter(|_| region_outbox) {
            sqlx::query("INSERT INTO region_outbox (conversation_id, seq) VALUES ($1, $2)")
                .bind(e.conversation_id.as_str())
                .bind(e.seq as i64)
                .execute(&mut *tx)
                .await?;
        }
        let version = event.as_ref().map_or(version, |e| e.seq);
        Self::apply_plan(&mut tx, group_id, req, &plan, &change, version as i64, now).await?;
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
            added: change.added.into_iter().map(|(u, _)| u).collect(),
            dissolved: plan == Plan::Dissolve,
            removed: change.removed,
        })
    }

    /// CREATE: decides it (the actor's live groups against the limit) and inserts the
    /// group row; the group starts empty at version 0.
    async fn create_group(
        tx: &mut Transaction<'_, DB>,
        group_id: &str,
        req: &GroupRequest,
        now: i64,
    ) -> Result<(Group, u64, Plan), StoreError> {
        let owned: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM chat_groups WHERE created_by = $1 AND dissolved = 0",
        )
        .bind(req.actor.as_str())
        .fetch_one(&mut **tx)
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
        .execute(&mut **tx)
        .await?;
        let group = Group {
            kind: req.kind,
            members_can_invite: req.members_can_invite,
            size: 0,
        };
        Ok((group, 0, plan))
    }

    /// Any other operation on a live group: the actor's role, every named user's role
    /// and ban (set-based, a join on the keys), then the decision.
    async fn decide_change(
        tx: &mut Transaction<'_, DB>,
        group_id: &str,
        req: &GroupRequest,
        group: Group,
    ) -> Result<Plan, StoreError> {
        let actor: Option<i32> = sqlx::query_scalar(
            "SELECT role FROM group_members WHERE group_id = $1 AND user_id = $2",
        )
        .bind(group_id)
        .bind(req.actor.as_str())
        .fetch_optional(&mut **tx)
        .await?;
        let named = access::named_users(req);
        let mut found: HashMap<String, (Option<i32>, bool)> = HashMap::new();
        for chunk in named.chunks(CHUNK) {
            let mut qb = Statement::<DB>::new("WITH k (u) AS (");
            qb.push_values(chunk, |b, u| {
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
            let (sql, args) = qb.finish()?;
            for r in sqlx::query_with(&sql, args).fetch_all(&mut **tx).await? {
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
        access::decide(group_id, req, group, role_of(actor), &targets)
    }

    /// The SYSTEM event recording the plan, at the next seq of the group's conversation
    /// (members who join read from it, members who leave read up to it); `None` when
    /// the plan changes nothing.
    async fn write_event(
        tx: &mut Transaction<'_, DB>,
        group_id: &str,
        req: &GroupRequest,
        plan: &Plan,
        everyone: &[String],
        now: i64,
    ) -> Result<Option<StoredMessage>, StoreError> {
        let Some(payload) = access::event(req, plan, everyone) else {
            return Ok(None);
        };
        let conv = im_proto::group_conversation(group_id);
        let seq: i64 = sqlx::query_scalar(
            "INSERT INTO conversations (conversation_id, last_seq, last_time) \
             VALUES ($1, 1, $2) ON CONFLICT (conversation_id) DO UPDATE \
             SET last_seq = conversations.last_seq + 1, last_time = $2 \
             RETURNING last_seq",
        )
        .bind(conv.as_str())
        .bind(now)
        .fetch_one(&mut **tx)
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
        .execute(&mut **tx)
        .await?;
        Ok(Some(im_proto::ChatMessage {
            conversation_id: conv,
            sender: String::new(),
            payload: payload.into(),
            send_time: now,
            r#type: im_proto::MessageType::System as i32,
            seq: seq as u64,
            msg_id,
            ..Default::default()
        }))
    }

    /// Writes the plan at version `v` (its event's seq): joins, leaves, bans, unbans,
    /// roles, and the group row's size and version.
    async fn apply_plan(
        tx: &mut Transaction<'_, DB>,
        group_id: &str,
        req: &GroupRequest,
        plan: &Plan,
        change: &Membership,
        v: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        Self::add_members(tx, group_id, &change.added, v, now).await?;
        if *plan == Plan::Dissolve {
            sqlx::query("DELETE FROM group_members WHERE group_id = $1")
                .bind(group_id)
                .execute(&mut **tx)
                .await?;
            sqlx::query(
                "UPDATE group_intervals SET left_seq = $2 \
                 WHERE group_id = $1 AND left_seq IS NULL",
            )
            .bind(group_id)
            .bind(v)
            .execute(&mut **tx)
            .await?;
        } else {
            Self::remove_members(tx, group_id, &change.removed, v).await?;
        }
        Self::apply_bans_and_roles(tx, group_id, req, plan, now).await?;
        if plan.has_event() {
            // Relative and forward-only, so two nodes changing one group at once
            // (serialised on the conversation row above) both count.
            sqlx::query(
                "UPDATE chat_groups SET size = size + $2, \
                 version = CASE WHEN version < $3 THEN $3 ELSE version END, \
                 dissolved = $4 WHERE group_id = $1",
            )
            .bind(group_id)
            .bind(change.delta() as i32)
            .bind(v)
            .bind((*plan == Plan::Dissolve) as i32)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    /// New members at version `v`: their rows, their open intervals, and their cursor
    /// just before the join event.
    async fn add_members(
        tx: &mut Transaction<'_, DB>,
        group_id: &str,
        added: &[(String, Role)],
        v: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        let conv = im_proto::group_conversation(group_id);
        for chunk in added.chunks(CHUNK) {
            let mut qb = Statement::<DB>::new(
                "INSERT INTO group_members (group_id, user_id, joined_at, role) ",
            );
            qb.push_values(chunk, |b, (u, r)| {
                b.push_bind(group_id)
                    .push_bind(u.as_str())
                    .push_bind(now)
                    .push_bind(*r as i32);
            });
            let (sql, args) = qb.finish()?;
            sqlx::query_with(&sql, args).execute(&mut **tx).await?;
            let mut qb = Statement::<DB>::new(
                "INSERT INTO group_intervals (group_id, user_id, joined_seq) ",
            );
            qb.push_values(chunk, |b, (u, _)| {
                b.push_bind(group_id).push_bind(u.as_str()).push_bind(v);
            });
            let (sql, args) = qb.finish()?;
            sqlx::query_with(&sql, args).execute(&mut **tx).await?;
            let mut qb =
                Statement::<DB>::new("INSERT INTO cursors (user_id, conversation_id, seq) ");
            qb.push_values(chunk, |b, (u, _)| {
                b.push_bind(u.as_str())
                    .push_bind(conv.as_str())
                    .push_bind(v - 1);
            });
            qb.push(" ON CONFLICT (user_id, conversation_id) DO UPDATE SET seq = excluded.seq");
            let (sql, args) = qb.finish()?;
            sqlx::query_with(&sql, args).execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Members who leave at version `v`: their rows go, their intervals close.
    async fn remove_members(
        tx: &mut Transaction<'_, DB>,
        group_id: &str,
        removed: &[String],
        v: i64,
    ) -> Result<(), StoreError> {
        for chunk in removed.chunks(CHUNK) {
            for closing in [false, true] {
                let mut qb = if closing {
                    let mut qb = Statement::<DB>::new("UPDATE group_intervals SET left_seq = ");
                    qb.push_bind(v);
                    qb.push(" WHERE left_seq IS NULL AND group_id = ");
                    qb
                } else {
                    Statement::<DB>::new("DELETE FROM group_members WHERE group_id = ")
                };
                qb.push_bind(group_id);
                qb.push(" AND user_id IN (");
                qb.push_list(chunk.iter().map(|u| u.as_str()));
                qb.push(")");
                let (sql, args) = qb.finish()?;
                sqlx::query_with(&sql, args).execute(&mut **tx).await?;
            }
        }
        Ok(())
    }

    /// The plan's bans (BAN), lifted bans (UNBAN) and roles (SET_ROLE, TRANSFER).
    async fn apply_bans_and_roles(
        tx: &mut Transaction<'_, DB>,
        group_id: &str,
        req: &GroupRequest,
        plan: &Plan,
        now: i64,
    ) -> Result<(), StoreError> {
        match plan {
            Plan::Remove { ban, .. } => {
                for chunk in ban.chunks(CHUNK) {
                    let mut qb = Statement::<DB>::new(
                        "INSERT INTO group_bans (group_id, user_id, banned_by, banned_at) ",
                    );
                    qb.push_values(chunk, |b, u| {
                        b.push_bind(group_id)
                            .push_bind(u.as_str())
                            .push_bind(req.actor.as_str())
                            .push_bind(now);
                    });
                    qb.push(" ON CONFLICT DO NOTHING");
                    let (sql, args) = qb.finish()?;
                    sqlx::query_with(&sql, args).execute(&mut **tx).await?;
                }
            }
            Plan::Unban(users) => {
                for u in users {
                    sqlx::query("DELETE FROM group_bans WHERE group_id = $1 AND user_id = $2")
                        .bind(group_id)
                        .bind(u.as_str())
                        .execute(&mut **tx)
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
                    .execute(&mut **tx)
                    .await?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Members of a live group and its version ([`Store::group_members`]).
    ///
    /// [`Store::group_members`]: crate::store::Store::group_members
    pub(crate) async fn group_members(
        read: &Pool<DB>,
        group_id: &str,
    ) -> Result<Option<(Vec<String>, u64)>, StoreError> {
        let row: Option<(i64, i32)> =
            sqlx::query_as("SELECT version, dissolved FROM chat_groups WHERE group_id = $1")
                .bind(group_id)
                .fetch_optional(read)
                .await?;
        let Some((version, 0)) = row else {
            return Ok(None);
        };
        let members = sqlx::query_scalar(
            "SELECT user_id FROM group_members WHERE group_id = $1 ORDER BY user_id",
        )
        .bind(group_id)
        .fetch_all(read)
        .await?;
        Ok(Some((members, version.max(0) as u64)))
    }

    /// The version of each named group that exists ([`Store::group_versions`]).
    ///
    /// [`Store::group_versions`]: crate::store::Store::group_versions
    pub(crate) async fn group_versions(
        read: &Pool<DB>,
        group_ids: &[&str],
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::with_capacity(group_ids.len());
        for chunk in group_ids.chunks(CHUNK) {
            let mut qb = Statement::<DB>::new(
                "SELECT group_id, version FROM chat_groups WHERE group_id IN (",
            );
            qb.push_list(chunk.iter().copied());
            qb.push(")");
            let (sql, args) = qb.finish()?;
            let rows: Vec<(String, i64)> = sqlx::query_as_with(&sql, args).fetch_all(read).await?;
            out.extend(rows.into_iter().map(|(g, v)| (g, v.max(0) as u64)));
        }
        Ok(out)
    }

    /// A group for operators ([`Store::group_info`]).
    ///
    /// [`Store::group_info`]: crate::store::Store::group_info
    pub(crate) async fn group_info(
        read: &Pool<DB>,
        group_id: &str,
        limit: u32,
    ) -> Result<Option<GroupInfo>, StoreError> {
        let row: Option<(String, i64, i32, i32, i64, i32, i32)> = sqlx::query_as(
            "SELECT created_by, created_at, kind, members_can_invite, version, \
             dissolved, size FROM chat_groups WHERE group_id = $1",
        )
        .bind(group_id)
        .fetch_optional(read)
        .await?;
        let Some((created_by, created_at, kind, invite, version, dissolved, size)) = row else {
            return Ok(None);
        };
        let members: Vec<(String, i32)> = sqlx::query_as(
            "SELECT user_id, role FROM group_members WHERE group_id = $1 \
             ORDER BY user_id LIMIT $2",
        )
        .bind(group_id)
        .bind(limit as i64)
        .fetch_all(read)
        .await?;
        let banned: Vec<String> = sqlx::query_scalar(
            "SELECT user_id FROM group_bans WHERE group_id = $1 ORDER BY user_id LIMIT $2",
        )
        .bind(group_id)
        .bind(limit as i64)
        .fetch_all(read)
        .await?;
        Ok(Some(GroupInfo {
            group_id: group_id.to_owned(),
            kind: if kind == Kind::Public as i32 {
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
                .map(|(u, r)| (u, role_name(r)))
                .collect(),
            banned,
        }))
    }

    /// A user's role in a group ([`Store::group_role`]).
    ///
    /// [`Store::group_role`]: crate::store::Store::group_role
    pub(crate) async fn group_role(
        read: &Pool<DB>,
        group_id: &str,
        user_id: &str,
    ) -> Result<Option<i32>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT role FROM group_members WHERE group_id = $1 AND user_id = $2",
        )
        .bind(group_id)
        .bind(user_id)
        .fetch_optional(read)
        .await?)
    }
}
