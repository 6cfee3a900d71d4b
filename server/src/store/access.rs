//! The group access rules, as a pure decision: given the group, the actor's role and the
//! named users' roles and bans, what a [`GroupRequest`] changes or why it is refused. The
//! SQL in `store::sql::groups` gathers the inputs and applies the [`Plan`] in one transaction.
//!
//! Rules: CREATE makes the actor the owner. A private group gains members only through
//! ADD by an owner or admin (or by any member when it allows member invitations); anyone
//! may JOIN a public group, and any member may ADD to it. REMOVE, BAN, UNBAN and SET_ROLE
//! need an owner or admin and touch only users of a lower role than the actor's;
//! SET_ROLE gives MEMBER or ADMIN, never above the actor's role. TRANSFER and DISSOLVE are
//! the owner's. Anyone may LEAVE, but an owner with other members must transfer first.
//! A banned user cannot be added or join until unbanned.

use im_proto::group_op::{Kind, Op, Role};

use super::{GroupRequest, StoreError};

/// Most users listed in one SYSTEM event (the event also carries the full count).
pub const EVENT_USERS_MAX: usize = 256;

/// A stored group, as the rules need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Private or public.
    pub kind: Kind,
    /// Plain members may add others.
    pub members_can_invite: bool,
    /// Member count.
    pub size: u32,
}

/// One user named by the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The user.
    pub user: String,
    /// Their role (`None`: not a member).
    pub role: Role,
    /// Banned from the group.
    pub banned: bool,
}

/// What to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing (a no-op JOIN or ADD, INFO, an UNBAN of nobody banned).
    Nothing,
    /// Create the group with these members and roles.
    Create(Vec<(String, Role)>),
    /// Add these users as members.
    Add(Vec<String>),
    /// Remove these members (and ban every named user when `ban`).
    Remove {
        /// The members to remove.
        members: Vec<String>,
        /// Users to ban (members or not).
        ban: Vec<String>,
    },
    /// Lift these bans.
    Unban(Vec<String>),
    /// Give these members these roles.
    SetRoles(Vec<(String, Role)>),
    /// Every member leaves; the group is gone.
    Dissolve,
}

impl Plan {
    /// Whether the plan changes membership or roles (and so writes a SYSTEM event).
    pub fn has_event(&self) -> bool {
        match self {
            Plan::Nothing | Plan::Unban(_) => false,
            Plan::Remove { members, ban } => !members.is_empty() || !ban.is_empty(),
            Plan::Add(users) => !users.is_empty(),
            Plan::Create(_) | Plan::SetRoles(_) | Plan::Dissolve => true,
        }
    }
}

fn forbidden(message: impl Into<String>) -> StoreError {
    StoreError::Forbidden(message.into())
}

/// Decides a request on an existing group (`CREATE` is [`decide_create`]).
/// `targets` has one entry per distinct named user, in request order.
pub fn decide(
    group_id: &str,
    req: &GroupRequest,
    group: Group,
    actor: Role,
    targets: &[Target],
) -> Result<Plan, StoreError> {
    let d = Decision {
        group_id,
        req,
        group,
        actor,
        targets,
    };
    match req.op {
        Op::Create => Err(StoreError::GroupExists(group_id.to_owned())),
        Op::Info => {
            if actor == Role::None && group.kind != Kind::Public {
                return Err(d.not_member());
            }
            Ok(Plan::Nothing)
        }
        Op::Join => d.join(),
        Op::Add => d.add(),
        Op::Leave => d.leave(),
        Op::Remove | Op::Ban => d.remove(),
        Op::Unban => d.unban(),
        Op::SetRole => d.set_role(),
        Op::Transfer => d.transfer(),
        Op::Dissolve => {
            d.member()?;
            if actor != Role::Owner {
                return Err(forbidden("only the owner may dissolve the group"));
            }
            Ok(Plan::Dissolve)
        }
    }
}

/// One request on an existing group, with what [`decide`] knows of it.
struct Decision<'a> {
    group_id: &'a str,
    req: &'a GroupRequest,
    group: Group,
    actor: Role,
    targets: &'a [Target],
}

impl Decision<'_> {
    fn not_member(&self) -> StoreError {
        StoreError::NotMember(self.group_id.to_owned())
    }

    /// The actor must be a member.
    fn member(&self) -> Result<(), StoreError> {
        if self.actor == Role::None {
            return Err(self.not_member());
        }
        Ok(())
    }

    /// The actor must be a member and an owner or admin (`what` they may do).
    fn manager(&self, what: &str) -> Result<(), StoreError> {
        self.member()?;
        if self.actor < Role::Admin {
            return Err(forbidden(format!("only an owner or admin may {what}")));
        }
        Ok(())
    }

    /// The named users, filtered.
    fn users(&self, keep: impl Fn(&Target) -> bool) -> Vec<String> {
        self.targets
            .iter()
            .filter(|t| keep(t))
            .map(|t| t.user.clone())
            .collect()
    }

    /// No named user may have a role as high as the actor's.
    fn below_actor(&self) -> Result<(), StoreError> {
        if let Some(t) = self.targets.iter().find(|t| t.role >= self.actor) {
            return Err(forbidden(format!("{} has a role as high as yours", t.user)));
        }
        Ok(())
    }

    fn join(&self) -> Result<Plan, StoreError> {
        let (group_id, req) = (self.group_id, self.req);
        if self.actor != Role::None {
            return Ok(Plan::Nothing);
        }
        if self.group.kind != Kind::Public {
            return Err(forbidden(format!(
                "group {group_id} is private: an owner or admin must add you"
            )));
        }
        if self.targets.iter().any(|t| t.user == req.actor && t.banned) {
            return Err(forbidden(format!("you are banned from group {group_id}")));
        }
        Ok(Plan::Add(vec![req.actor.clone()]))
    }

    fn add(&self) -> Result<Plan, StoreError> {
        let group_id = self.group_id;
        self.member()?;
        let open = self.group.members_can_invite || self.group.kind == Kind::Public;
        if self.actor < Role::Admin && !open {
            return Err(forbidden(format!(
                "only an owner or admin may add members to group {group_id}"
            )));
        }
        let banned = self
            .targets
            .iter()
            .find(|t| t.banned && t.role == Role::None);
        if let Some(t) = banned {
            return Err(forbidden(format!(
                "{} is banned from group {group_id}",
                t.user
            )));
        }
        Ok(Plan::Add(self.users(|t| t.role == Role::None)))
    }

    fn leave(&self) -> Result<Plan, StoreError> {
        self.member()?;
        if self.actor == Role::Owner {
            if self.group.size > 1 {
                return Err(forbidden(
                    "the owner must transfer ownership (or dissolve the group) before leaving",
                ));
            }
            return Ok(Plan::Dissolve);
        }
        Ok(Plan::Remove {
            members: vec![self.req.actor.clone()],
            ban: Vec::new(),
        })
    }

    /// REMOVE and BAN.
    fn remove(&self) -> Result<Plan, StoreError> {
        self.manager("remove or ban")?;
        if let Some(t) = self.targets.iter().find(|t| t.user == self.req.actor) {
            return Err(forbidden(format!(
                "{} cannot remove or ban themselves: use LEAVE",
                t.user
            )));
        }
        self.below_actor()?;
        let members = self.users(|t| t.role != Role::None);
        let ban = if self.req.op == Op::Ban {
            self.users(|t| !t.banned)
        } else {
            Vec::new()
        };
        Ok(Plan::Remove { members, ban })
    }

    fn unban(&self) -> Result<Plan, StoreError> {
        if self.actor < Role::Admin {
            return Err(if self.actor != Role::None {
                forbidden("only an owner or admin may unban")
            } else {
                self.not_member()
            });
        }
        Ok(Plan::Unban(self.users(|t| t.banned)))
    }

    fn set_role(&self) -> Result<Plan, StoreError> {
        let role = self.req.role;
        self.manager("change roles")?;
        if !matches!(role, Role::Member | Role::Admin) {
            return Err(StoreError::BadRequest(
                "SET_ROLE gives MEMBER or ADMIN (use TRANSFER for the owner)".into(),
            ));
        }
        if role > self.actor {
            return Err(forbidden("you cannot give a role above your own"));
        }
        if let Some(t) = self.targets.iter().find(|t| t.role == Role::None) {
            return Err(self.not_named_member(t));
        }
        self.below_actor()?;
        Ok(Plan::SetRoles(
            self.users(|t| t.role != role)
                .into_iter()
                .map(|u| (u, role))
                .collect(),
        ))
    }

    fn transfer(&self) -> Result<Plan, StoreError> {
        self.member()?;
        if self.actor != Role::Owner {
            return Err(forbidden("only the owner may transfer ownership"));
        }
        let [t] = self.targets else {
            return Err(StoreError::BadRequest(
                "TRANSFER names exactly one member".into(),
            ));
        };
        if t.role == Role::None {
            return Err(self.not_named_member(t));
        }
        if t.user == self.req.actor {
            return Ok(Plan::Nothing);
        }
        Ok(Plan::SetRoles(vec![
            (t.user.clone(), Role::Owner),
            (self.req.actor.clone(), Role::Admin),
        ]))
    }

    /// A named user who should be a member is not.
    fn not_named_member(&self, t: &Target) -> StoreError {
        StoreError::BadRequest(format!(
            "{} is not a member of group {}",
            t.user, self.group_id
        ))
    }
}

/// Decides a CREATE: the actor owns it, the named users are members.
pub fn decide_create(req: &GroupRequest, created_by_actor: u64) -> Result<Plan, StoreError> {
    if req.max_groups_per_user > 0 && created_by_actor >= req.max_groups_per_user as u64 {
        return Err(forbidden(format!(
            "you already own {created_by_actor} groups (limit {})",
            req.max_groups_per_user
        )));
    }
    let mut members = vec![(req.actor.clone(), Role::Owner)];
    for u in &req.users {
        if !members.iter().any(|(m, _)| m == u) {
            members.push((u.clone(), Role::Member));
        }
    }
    Ok(Plan::Create(members))
}

/// The users a request names, without repeats, in request order (JOIN: the actor).
pub fn named_users(req: &GroupRequest) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let source: Vec<&String> = match req.op {
        Op::Join => vec![&req.actor],
        _ => req.users.iter().collect(),
    };
    source
        .into_iter()
        .filter(|u| seen.insert(u.as_str()))
        .cloned()
        .collect()
}

/// The SYSTEM event payload for a plan (`None` when nothing changes).
pub fn event(
    req: &GroupRequest,
    plan: &Plan,
    all_members: &[String],
) -> Option<im_proto::GroupEvent> {
    if !plan.has_event() {
        return None;
    }
    let (op, users): (Op, Vec<&String>) = match plan {
        Plan::Create(m) => (Op::Create, m.iter().map(|(u, _)| u).collect()),
        Plan::Add(users) => (req.op, users.iter().collect()),
        Plan::Remove { members, ban } => {
            let op = match req.op {
                Op::Ban => Op::Ban,
                Op::Leave => Op::Leave,
                _ => Op::Remove,
            };
            let named = if op == Op::Ban { ban } else { members };
            (op, named.iter().collect())
        }
        Plan::SetRoles(roles) => (req.op, roles.iter().map(|(u, _)| u).collect()),
        Plan::Dissolve => (Op::Dissolve, all_members.iter().collect()),
        Plan::Nothing | Plan::Unban(_) => return None,
    };
    let role = match plan {
        Plan::SetRoles(roles) if req.op == Op::SetRole => roles.first().map_or(Role::None, |r| r.1),
        Plan::SetRoles(_) => Role::Owner,
        _ => Role::None,
    };
    Some(im_proto::GroupEvent {
        op: op as i32,
        actor: req.actor.clone(),
        count: users.len() as u32,
        users: users.into_iter().take(EVENT_USERS_MAX).cloned().collect(),
        role: role as i32,
        kind: if matches!(plan, Plan::Create(_)) {
            req.kind as i32
        } else {
            0
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: Op, actor: &str, users: &[&str]) -> GroupRequest {
        GroupRequest {
            actor: actor.into(),
            op,
            users: users.iter().map(|u| u.to_string()).collect(),
            kind: Kind::Private,
            role: Role::Admin,
            members_can_invite: false,
            max_members: 100,
            max_groups_per_user: 2,
        }
    }

    fn t(user: &str, role: Role, banned: bool) -> Target {
        Target {
            user: user.into(),
            role,
            banned,
        }
    }

    const PRIVATE: Group = Group {
        kind: Kind::Private,
        members_can_invite: false,
        size: 3,
    };

    #[test]
    fn private_groups_need_an_invitation() {
        let r = req(Op::Join, "x", &[]);
        assert!(matches!(
            decide("g", &r, PRIVATE, Role::None, &[t("x", Role::None, false)]),
            Err(StoreError::Forbidden(_))
        ));
        let public = Group {
            kind: Kind::Public,
            ..PRIVATE
        };
        assert_eq!(
            decide("g", &r, public, Role::None, &[t("x", Role::None, false)]).unwrap(),
            Plan::Add(vec!["x".into()])
        );
        assert!(decide("g", &r, public, Role::None, &[t("x", Role::None, true)]).is_err());
        let add = req(Op::Add, "m", &["y"]);
        let y = [t("y", Role::None, false)];
        assert!(decide("g", &add, PRIVATE, Role::Member, &y).is_err());
        assert!(decide("g", &add, PRIVATE, Role::Admin, &y).is_ok());
        let inviting = Group {
            members_can_invite: true,
            ..PRIVATE
        };
        assert!(decide("g", &add, inviting, Role::Member, &y).is_ok());
    }

    #[test]
    fn roles_bound_removal_and_role_changes() {
        let rm = req(Op::Remove, "a", &["b"]);
        let admin_b = [t("b", Role::Admin, false)];
        assert!(decide("g", &rm, PRIVATE, Role::Admin, &admin_b).is_err());
        assert!(decide("g", &rm, PRIVATE, Role::Owner, &admin_b).is_ok());
        assert!(decide(
            "g",
            &rm,
            PRIVATE,
            Role::Member,
            &[t("b", Role::Member, false)]
        )
        .is_err());
        let mut set = req(Op::SetRole, "a", &["b"]);
        set.role = Role::Owner;
        assert!(decide(
            "g",
            &set,
            PRIVATE,
            Role::Owner,
            &[t("b", Role::Member, false)]
        )
        .is_err());
        let leave = req(Op::Leave, "o", &[]);
        assert!(decide("g", &leave, PRIVATE, Role::Owner, &[]).is_err());
        let alone = Group { size: 1, ..PRIVATE };
        assert_eq!(
            decide("g", &leave, alone, Role::Owner, &[]).unwrap(),
            Plan::Dissolve
        );
        let c = req(Op::Create, "a", &["b"]);
        assert!(decide_create(&c, 2).is_err());
        assert!(decide_create(&c, 1).is_ok());
    }
}
