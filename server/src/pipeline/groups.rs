//! GroupOp: the shape checks and the rate limits (the connection's bucket, taken with
//! the frame, and the user's on this node), then the change handed to the writer, whose
//! answer (the group's state after it) is the `GroupOpOk`. Who may do what is decided by
//! the store in the change's transaction (`store::access`).

use std::time::{Duration, Instant};

use im_proto::{frame, group_op, Body, GroupOp, GroupOpOk};

use super::{FrameKind, Pipeline, Refusal, Session};
use crate::persist::WriteReq;
use crate::store::GroupRequest;

/// Users whose GroupOp buckets are kept before idle ones are dropped.
pub(super) const GROUP_OP_USERS_MAX: usize = 100_000;

impl Pipeline {
    /// Takes a GroupOp token from the user's bucket on this node (the connection's was
    /// taken with the frame, in [`Pipeline::handle`]).
    fn group_op_allowed(&self, s: &Session) -> Result<(), Refusal> {
        let now = Instant::now();
        let limited = |retry_after_ms| FrameKind::GroupOp.refusal(retry_after_ms);
        let l = &self.limits;
        if l.group_op_rate_per_sec == 0 {
            return Ok(());
        }
        if let Ok(mut users) = self.group_op_users.lock() {
            if users.len() >= GROUP_OP_USERS_MAX && !users.contains_key(&s.user_id) {
                // Buckets idle long enough to be full again carry no state: drop them.
                let full = Duration::from_secs_f64(
                    l.group_op_burst as f64 / l.group_op_rate_per_sec.max(1) as f64,
                );
                users.retain(|_, b| now.saturating_duration_since(b.at) < full);
                if users.len() >= GROUP_OP_USERS_MAX {
                    return Err(limited(1000));
                }
            }
            users
                .entry(s.user_id.clone())
                .or_insert_with(|| FrameKind::GroupOp.full_bucket(l))
                .take(now)
                .map_err(limited)?;
        }
        Ok(())
    }

    /// A GroupOp: checked, rate-limited, committed by the writer, answered `GroupOpOk`.
    pub(super) async fn on_group_op(
        &self,
        s: &Session,
        req_id: u64,
        op: GroupOp,
    ) -> Result<(), Refusal> {
        let kind = group_op::Op::try_from(op.op)
            .map_err(|_| Refusal::bad(format!("unknown group op {}", op.op)))?;
        let group_kind = group_op::Kind::try_from(op.kind)
            .map_err(|_| Refusal::bad(format!("unknown group kind {}", op.kind)))?;
        let role = group_op::Role::try_from(op.role)
            .map_err(|_| Refusal::bad(format!("unknown role {}", op.role)))?;
        let group_id = if op.group_id.is_empty() && kind == group_op::Op::Create {
            format!("grp-{}", uuid::Uuid::now_v7().simple())
        } else if im_proto::valid_id(&op.group_id) {
            op.group_id
        } else {
            return Err(Refusal::bad("invalid group_id"));
        };
        if let Some(bad) = op.members.iter().find(|m| !im_proto::valid_id(m)) {
            return Err(Refusal::bad(format!("invalid member id {bad:?}")));
        }
        if op.members.len() > self.limits.max_group_members as usize {
            return Err(Refusal::bad(format!(
                "more than {} members",
                self.limits.max_group_members
            )));
        }
        self.group_op_allowed(s)?;
        if let Some(map) = &self.region {
            let conversation = im_proto::group_conversation(&group_id);
            if let Some((home, entry)) = map.elsewhere(&conversation) {
                let to = super::send::Forward {
                    conversation: conversation.clone(),
                    home: home.to_owned(),
                    entry: entry.to_owned(),
                    metrics: self.metrics.clone(),
                };
                let op = GroupOp { group_id, ..op };
                super::send::forward(
                    map.clone(),
                    self.store.clone(),
                    s,
                    req_id,
                    Body::GroupOp(op),
                    to,
                    None,
                );
                return Ok(());
            }
        }
        // JOIN naming others is how older clients added members: it means ADD.
        let kind = match kind {
            group_op::Op::Join if op.members.iter().any(|m| *m != s.user_id) => group_op::Op::Add,
            k => k,
        };
        let req = GroupRequest {
            actor: s.user_id.clone(),
            op: kind,
            users: op.members,
            kind: group_kind,
            role,
            members_can_invite: op.members_can_invite,
            max_members: self.limits.max_group_members,
            max_groups_per_user: self.limits.max_groups_per_user,
        };
        let (reply, rx) = tokio::sync::oneshot::channel();
        let write = WriteReq::Group {
            group_id: group_id.clone(),
            req,
            reply,
        };
        let state = self.submit_and_wait(write, rx, "group change").await?;
        s.reply(&frame(
            req_id,
            Body::GroupOpOk(GroupOpOk {
                group_id,
                members: state.members,
                kind: state.kind as i32,
                role: state.role as i32,
                members_can_invite: state.members_can_invite,
                version: state.version,
            }),
        ));
        Ok(())
    }
}
