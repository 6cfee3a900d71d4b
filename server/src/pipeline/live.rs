//! Live state between users, never stored as messages: presence subscriptions
//! (`PresenceSubscribe`), hiding one's presence (`SetPresence`, kept in the store's
//! `presence_settings` through the persistence writer) and typing notices (`Typing`,
//! pushed and forgotten). This module owns the three handlers and their per-connection
//! rate limits; the subscriber table is `route::presence`'s, owned by the router,
//! and typing reaches other nodes through the router's ephemeral forwarding.

use im_proto::{
    frame, parse_conversation, Body, ConversationRef, Done, ErrorCode, PresenceSubscribe,
    SetPresence, Typing,
};

use super::{FrameKind, Pipeline, Refusal, Session};
use crate::persist::WriteReq;
use crate::store::membership;

fn done(s: &Session, req_id: u64) {
    s.reply(&frame(req_id, Body::Done(Done {})));
}

impl Pipeline {
    /// `PresenceSubscribe`: replaces the connection's presence subscriptions. Users the
    /// caller shares no conversation with are dropped silently (the answer is the same
    /// Done, and they get no push, whether they exist, are online or not).
    pub(super) async fn on_presence_subscribe(
        &self,
        s: &Session,
        req_id: u64,
        p: PresenceSubscribe,
    ) -> Result<(), Refusal> {
        s.take(FrameKind::PresenceSubscribe, &self.limits)?;
        let max = self.limits.presence_subscriptions_max as usize;
        if p.users.len() > max {
            return Err(Refusal::bad(format!(
                "more than {max} users (limits.presence_subscriptions_max)"
            )));
        }
        if let Some(bad) = p.users.iter().find(|u| !im_proto::valid_id(u)) {
            return Err(Refusal::bad(format!("invalid user id {bad:?}")));
        }
        let mut users = p.users;
        users.sort_unstable();
        users.dedup();
        let others: Vec<&str> = users
            .iter()
            .map(String::as_str)
            .filter(|u| *u != s.user_id)
            .collect();
        let mut allowed = if others.is_empty() {
            Vec::new()
        } else {
            self.store
                .presence_peers(&s.user_id, &others)
                .await
                .map_err(Refusal::store)?
        };
        if users.contains(&s.user_id) {
            allowed.push(s.user_id.clone());
        }
        let hidden = if allowed.is_empty() {
            Vec::new()
        } else {
            let names: Vec<&str> = allowed.iter().map(String::as_str).collect();
            self.store
                .presence_hidden(&names)
                .await
                .map_err(Refusal::store)?
        };
        let targets: Vec<(String, bool)> = allowed
            .into_iter()
            .map(|u| {
                let h = hidden.contains(&u);
                (u, h)
            })
            .collect();
        done(s, req_id);
        self.router.presence_subscribe(&s.out, targets);
        Ok(())
    }

    /// `SetPresence`: stores the flag (through the writer), then shows the change to
    /// the user's subscribers here and tells the other nodes.
    pub(super) async fn on_set_presence(
        &self,
        s: &Session,
        req_id: u64,
        p: SetPresence,
    ) -> Result<(), Refusal> {
        s.take(FrameKind::SetPresence, &self.limits)?;
        let (reply, rx) = tokio::sync::oneshot::channel();
        let write = WriteReq::SetPresence {
            user_id: s.user_id.clone(),
            hidden: p.hidden,
            reply,
        };
        self.submit_and_wait(write, rx, "presence change").await?;
        self.router.presence_hidden(&s.user_id, p.hidden);
        self.router
            .publish_presence_hidden(&s.user_id, p.hidden)
            .await;
        done(s, req_id);
        Ok(())
    }

    /// `Typing`: from a member of the conversation, pushed (never stored) to its other
    /// members' connections and the sender's other devices, here and on the other
    /// nodes, except slow connections; groups above `limits.typing_group_max` members
    /// get no fan-out. Answered Done either way.
    pub(super) async fn on_typing(
        &self,
        s: &Session,
        req_id: u64,
        t: Typing,
    ) -> Result<(), Refusal> {
        s.take(FrameKind::Typing, &self.limits)?;
        let users: Vec<String> = match parse_conversation(&t.conversation_id) {
            Some(c @ ConversationRef::Direct(a, b)) => {
                if !c.is_direct_party(&s.user_id) {
                    return Err(not_member(&t.conversation_id));
                }
                let mut u = vec![a.to_owned()];
                if a != b {
                    u.push(b.to_owned());
                }
                u
            }
            Some(ConversationRef::Group(g)) => {
                let members = self.relations.members(g).await.map_err(Refusal::store)?;
                let Some(members) = members else {
                    return Err(not_member(&t.conversation_id));
                };
                if !membership::is_in(&members, &s.user_id) {
                    return Err(not_member(&t.conversation_id));
                }
                let max = self.limits.typing_group_max as usize;
                if members.len() > max {
                    metrics::counter!("im_typing_skipped_large_group_total").increment(1);
                    done(s, req_id);
                    return Ok(());
                }
                members.to_vec()
            }
            None => {
                return Err(Refusal::bad(format!(
                    "invalid conversation id {:?}",
                    t.conversation_id
                )))
            }
        };
        let bytes = im_proto::encode(&frame(
            0,
            Body::Typing(Typing {
                conversation_id: t.conversation_id,
                typing: t.typing,
                user_id: s.user_id.clone(),
            }),
        ));
        metrics::counter!("im_typing_total").increment(1);
        self.router
            .deliver_ephemeral(&users, &bytes, s.out.conn_id)
            .await;
        done(s, req_id);
        Ok(())
    }
}

fn not_member(conversation_id: &str) -> Refusal {
    Refusal::code(
        ErrorCode::NotMember,
        format!("not a member of {conversation_id}"),
        Some("not_member"),
    )
}
