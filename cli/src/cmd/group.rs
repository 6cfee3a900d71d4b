//! `im group ...`: create, membership (add, remove, ban, unban, join, leave), roles,
//! transfer, dissolve and info; each prints the group's state after the operation.

use im_client::proto::{group_op, GroupOp, GroupOpOk};
use serde_json::json;

use crate::args::{GroupCommand, RoleArg};
use crate::output::{escape, role_name, Out};
use crate::session::Session;

/// Runs one group operation and prints the group's state after it.
pub async fn run(s: &Session, out: &mut Out, command: GroupCommand) -> anyhow::Result<()> {
    let op = request(command);
    let ok = s.call(s.client.group_request(op)).await?;
    out.emit(|| state_text(&ok), || state_json(&ok))?;
    Ok(())
}

/// The `GroupOp` a command sends.
fn request(command: GroupCommand) -> GroupOp {
    use group_op::Op;
    let (op, group_id, members) = match command {
        GroupCommand::Create {
            gid,
            members,
            public,
            members_can_invite,
        } => {
            let kind = if public {
                group_op::Kind::Public
            } else {
                group_op::Kind::Private
            };
            return GroupOp {
                op: Op::Create as i32,
                group_id: gid.unwrap_or_default(),
                members,
                kind: kind as i32,
                members_can_invite,
                ..Default::default()
            };
        }
        GroupCommand::SetRole { gid, user, role } => {
            let role = match role {
                RoleArg::Admin => group_op::Role::Admin,
                RoleArg::Member => group_op::Role::Member,
            };
            return GroupOp {
                op: Op::SetRole as i32,
                group_id: gid,
                members: vec![user],
                role: role as i32,
                ..Default::default()
            };
        }
        GroupCommand::Add(g) => (Op::Add, g.gid, g.users),
        GroupCommand::Remove(g) => (Op::Remove, g.gid, g.users),
        GroupCommand::Ban(g) => (Op::Ban, g.gid, g.users),
        GroupCommand::Unban(g) => (Op::Unban, g.gid, g.users),
        GroupCommand::Transfer { gid, user } => (Op::Transfer, gid, vec![user]),
        GroupCommand::Join(g) => (Op::Join, g.gid, Vec::new()),
        GroupCommand::Leave(g) => (Op::Leave, g.gid, Vec::new()),
        GroupCommand::Info(g) => (Op::Info, g.gid, Vec::new()),
        GroupCommand::Dissolve(g) => (Op::Dissolve, g.gid, Vec::new()),
    };
    GroupOp {
        op: op as i32,
        group_id,
        members,
        ..Default::default()
    }
}

fn kind_name(kind: i32) -> &'static str {
    if kind == group_op::Kind::Public as i32 {
        "public"
    } else {
        "private"
    }
}

/// `team: 3 members, private, your role: owner, version 5`.
fn state_text(ok: &GroupOpOk) -> String {
    format!(
        "{}: {} members, {}{}, your role: {}, version {}",
        escape(&ok.group_id),
        ok.members,
        kind_name(ok.kind),
        if ok.members_can_invite {
            ", members may invite"
        } else {
            ""
        },
        role_name(ok.role),
        ok.version
    )
}

fn state_json(ok: &GroupOpOk) -> serde_json::Value {
    json!({
        "group": ok.group_id,
        "members": ok.members,
        "kind": kind_name(ok.kind),
        "role": role_name(ok.role),
        "members_can_invite": ok.members_can_invite,
        "version": ok.version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::GroupUsers;

    #[test]
    fn requests_carry_the_op_members_and_role() {
        let add = request(GroupCommand::Add(GroupUsers {
            gid: "t".into(),
            users: vec!["a".into(), "b".into()],
        }));
        assert_eq!(add.op, group_op::Op::Add as i32);
        assert_eq!(add.members, ["a", "b"]);
        let role = request(GroupCommand::SetRole {
            gid: "t".into(),
            user: "a".into(),
            role: RoleArg::Admin,
        });
        assert_eq!(role.role, group_op::Role::Admin as i32);
        let create = request(GroupCommand::Create {
            gid: None,
            members: vec![],
            public: true,
            members_can_invite: false,
        });
        assert_eq!(create.kind, group_op::Kind::Public as i32);
    }
}
