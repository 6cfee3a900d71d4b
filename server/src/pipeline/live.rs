//! Live state between users, never stored as messages: presence subscriptions
//! (`PresenceSubscribe`), hiding one's presence (`SetPresence`, kept in the store's
//! `presence_settings` through the persistence writer) and typing notices (`Typing`,
//! pushed and forgotten). This module owns the three handlers and their per-connection
//! rate limits; the subscriber table is `route::presence`'s, owned by the router,
//! and typing reaches other nodes through the router's ephemeral forwarding.

use std::time::{Duration, Instant};

use im_proto::{
    frame, parse_conversation, Body, ConversationRef, Done, ErrorCode, PresenceSubscribe,
    SetPresence, Typing,
};

use super::{Pipeline, Refusal, Session, TokenBucket};
use crate::config::Limits;
use crate::persist::WriteReq;
use crate::store::membership as relation;

/// The per-connection token buckets of the live frames.
#[derive(Debug)]
pub struct LiveBuckets {
    subscribe: TokenBucket,
    set_presence: TokenBucket,
    typing: TokenBucket,
}

impl LiveBuckets {
    /// Full buckets with the configured rates.
    pub fn new(l: &Limits) -> Self {
        LiveBuckets {
            subscribe: TokenBucket::new(
                l.presence_subscribe_rate_per_sec,
                l.presence_subscribe_burst,
            ),
            set_presence: TokenBucket::new(l.set_presence_rate_per_sec, l.set_presence_burst),
            typing: TokenBucket::new(l.typing_rate_per_sec, l.typing_burst),
        }
    }
}

/// Which live bucket a frame takes from.
#[derive(Clone, Copy)]
enum Kind {
    Subscribe,
    SetPresence,
    Typing,
}

impl Session {
    /// Takes a token of a live frame's bucket; RATE_LIMITED when it is empty.
    fn live_limit(&self, kind: Kind) -> Result<(), Refusal> {
        let now = Instant::now();
        let Ok(mut b) = self.live.lock() else {
            return Ok(());
        };
        let (taken, what) = match kind {
            Kind::Subscribe => (b.subscribe.take(now), "subscribing to presence"),
            Kind::SetPresence => (b.set_presence.take(now), "setting presence"),
            Kind::Typing => (b.typing.take(now), "typing notices"),
        };
        taken.map_err(|retry_after_ms| Refusal {
            code: ErrorCode::RateLimited,
            message: format!("{what} too fast"),
            retry_after_ms,
            bad_reason: Some("rate_limited"),
        })
    }
}

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
        s.live_limit(Kind::Subscribe)?;
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
        s.live_limit(Kind::SetPresence)?;
        let (reply, rx) = tokio::sync::oneshot::channel();
        let write = WriteReq::SetPresence {
            user_id: s.user_id.clone(),
            hidden: p.hidden,
            reply,
        };
        if self.persist.try_submit(write).is_err() {
            return Err(self.overloaded("persistence queue full"));
        }
        match tokio::time::timeout(Duration::from_secs(30), rx).await {
            Ok(Ok(result)) => result.map_err(Refusal::store)?,
            _ => {
                return Err(Refusal::code(
                    ErrorCode::Internal,
                    "presence change timed out",
                    None,
                ))
            }
        }
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
        s.live_limit(Kind::Typing)?;
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
                if !relation::is_in(&members, &s.user_id) {
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
