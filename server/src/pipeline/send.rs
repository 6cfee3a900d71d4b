//! Send: the validation of a client's message (type, client_msg_id, target), its
//! relation (who receives it: both parties of a direct chat, or the group's members,
//! of whom the sender must be one), the before-send hook when one is configured (allow,
//! reject, replace, or `on_error`), and its hand-off to the writer, traced when sampled
//! or when its sender or a recipient is under a log filter.

use std::time::Instant;

use im_proto::{send, ErrorCode, MessageType, Send};

use super::{announce, FrameKind, Pipeline, Refusal, Session, MAX_CLIENT_MSG_ID};
use crate::hooks::before_send::{Ask, Verdict};
use crate::obs::Stage;
use crate::persist::{PersistReq, WriteReq};
use crate::route::Recipients;
use crate::store::membership;
use crate::store::NewMessage;

impl Pipeline {
    /// A Send: checked, its recipients found, handed to the writer (acked after commit).
    pub(super) async fn on_send(
        &self,
        s: &Session,
        req_id: u64,
        mut send: Send,
        started: Instant,
    ) -> Result<(), Refusal> {
        let t = Instant::now();
        let decoded = t;
        s.take(FrameKind::Send, &self.limits)?;
        if let Some(reason) = self.health.refusal() {
            metrics::counter!("im_store_refused_sends_total", "reason" => reason).increment(1);
            return Err(Refusal::store_unavailable(reason, self.unhealthy_retry_ms));
        }
        match MessageType::try_from(send.r#type) {
            Err(_) => {
                return Err(Refusal::bad(format!(
                    "unknown message type {}",
                    send.r#type
                )))
            }
            Ok(MessageType::System) => {
                return Err(Refusal::code(
                    ErrorCode::Forbidden,
                    "SYSTEM messages are written by the server only",
                    Some("forbidden"),
                ))
            }
            Ok(MessageType::Recall | MessageType::Edit) => {
                return Err(Refusal::code(
                    ErrorCode::Forbidden,
                    "RECALL and EDIT events are made by the Recall and Edit frames",
                    Some("forbidden"),
                ))
            }
            Ok(_) => {}
        }
        if send.client_msg_id.len() > MAX_CLIENT_MSG_ID {
            return Err(Refusal::bad(format!(
                "client_msg_id longer than {MAX_CLIENT_MSG_ID} bytes"
            )));
        }
        let target = match send.target.take() {
            Some(send::Target::ToUser(u)) if u == announce::SYSTEM_SENDER => {
                return Err(Refusal::code(
                    ErrorCode::Forbidden,
                    "the system sender takes no messages",
                    Some("forbidden"),
                ))
            }
            Some(send::Target::ToUser(u)) if im_proto::valid_id(&u) => send::Target::ToUser(u),
            Some(send::Target::GroupId(g)) if im_proto::valid_id(&g) => send::Target::GroupId(g),
            Some(_) => return Err(Refusal::bad("invalid to_user or group_id")),
            None => return Err(Refusal::bad("send needs to_user or group_id")),
        };
        let at = (started, decoded);
        let Some((send, target)) = self.forward_elsewhere(s, req_id, send, target, at) else {
            return Ok(());
        };
        self.metrics.stage_since(Stage::Validate, t);
        let validated = Instant::now();

        let t = Instant::now();
        let (conversation_id, recipients, direct) = match target {
            send::Target::ToUser(to) => (
                im_proto::direct_conversation(&s.user_id, &to),
                Recipients::Direct(s.user_id.clone(), to.clone()),
                Some((s.user_id.clone(), to)),
            ),
            send::Target::GroupId(g) => {
                let members = self.group_members(&g).await?;
                if !membership::is_in(&members, &s.user_id) {
                    return Err(Refusal::code(
                        ErrorCode::NotMember,
                        format!("not a member of group {g}"),
                        Some("not_member"),
                    ));
                }
                (
                    im_proto::group_conversation(&g),
                    Recipients::Group(members),
                    None,
                )
            }
        };
        self.metrics.stage_since(Stage::Relation, t);
        let msg_id = uuid::Uuid::now_v7().simple().to_string();
        // One cheap check per message: None unless sampled, or the sender or a recipient
        // is filtered (decided once the recipients are known; the earlier stages are
        // filed from their timestamps).
        let mut trace = self.begin_trace(s, &recipients, started);
        if let Some(tr) = trace.as_deref_mut() {
            tr.stage(Stage::Decode, started, decoded);
            tr.stage(Stage::Validate, decoded, validated);
            tr.stage(Stage::Relation, t, Instant::now());
            tr.set_message(&msg_id, &conversation_id);
        }

        // No hook configured: one branch, nothing else.
        let payload = match &self.before_send {
            None => send.payload,
            Some(hook) => {
                let ask = Ask {
                    msg_id: &msg_id,
                    conversation_id: &conversation_id,
                    sender: &s.user_id,
                    device_id: &s.device_id,
                    to_user: direct.as_ref().map(|(_, to)| to.as_str()),
                    group_id: conversation_id.strip_prefix("g:"),
                    msg_type: send.r#type,
                    client_msg_id: &send.client_msg_id,
                    payload: &send.payload,
                };
                let t = Instant::now();
                let verdict = hook.check(&ask).await;
                self.metrics.stage_since(Stage::BeforeSend, t);
                if let Some(tr) = trace.as_deref_mut() {
                    tr.stage(Stage::BeforeSend, t, Instant::now());
                }
                apply_verdict(verdict, send.payload)?
            }
        };
        // Counted once accepted: a Send the hook rejected was not.
        self.metrics.message_received(send.r#type);

        let req = PersistReq {
            message: NewMessage {
                conversation_id,
                sender: s.user_id.clone(),
                client_msg_id: send.client_msg_id,
                msg_type: send.r#type,
                payload,
                msg_id,
                direct,
                reference: None,
                traced: trace.is_some(),
            },
            req_id,
            origin: s.out.clone(),
            recipients,
            started,
            enqueued: Instant::now(),
            trace,
        };
        self.submit(WriteReq::Message(req))
    }
}

impl Pipeline {
    /// The trace of a Send of `s` to `recipients` whose decode began at `started`:
    /// always for a forwarded request its region traces (`Session::trace_forced`),
    /// else the tracer's decision.
    #[inline]
    fn begin_trace(
        &self,
        s: &Session,
        recipients: &Recipients,
        started: Instant,
    ) -> Option<Box<crate::obs::trace::Trace>> {
        if s.trace_forced {
            return Some(Box::new(crate::obs::trace::Trace::new(&s.user_id, started)));
        }
        let receives = |uid: &str| recipients.includes(uid);
        self.metrics
            .tracer
            .begin_message(&s.user_id, receives, started)
    }

    /// Multi-region mode: forwards a Send homed in another region there (`None`: it is
    /// on its way), traced when its sender or a one-to-one recipient is filtered or it
    /// is sampled; hands it back when it is homed here or regions are off.
    fn forward_elsewhere(
        &self,
        s: &Session,
        req_id: u64,
        send: Send,
        target: send::Target,
        (started, decoded): (Instant, Instant),
    ) -> Option<(Send, send::Target)> {
        let Some(map) = &self.region else {
            return Some((send, target));
        };
        let conversation = crate::region::conversation_of(&s.user_id, &target);
        let Some((home, entry)) = map.elsewhere(&conversation) else {
            if !map.homes.ready() {
                // Not yet caught up with the other regions: one of them may have taken
                // this home over (region_home's start-up gate).
                let why = "has not read the other regions' streams since it started";
                let mut entries = map.route_urls.iter().zip(&map.names);
                let entry = entries
                    .find(|(_, n)| **n == map.local)
                    .map_or("", |(u, _)| u);
                s.out
                    .push(refuse(req_id, &conversation, &map.local, entry, why), true);
                return None;
            }
            return Some((send, target));
        };
        let to = Forward {
            conversation: conversation.clone(),
            home: home.to_owned(),
            entry: entry.to_owned(),
            metrics: self.metrics.clone(),
        };
        let receives = |uid: &str| matches!(&target, send::Target::ToUser(u) if u == uid);
        let trace = self
            .metrics
            .tracer
            .begin_message(&s.user_id, receives, started);
        let trace = trace.map(|mut tr| {
            let now = Instant::now();
            tr.stage(Stage::Decode, started, decoded);
            tr.stage(Stage::Validate, decoded, now);
            Traced {
                trace: tr,
                tracer: self.metrics.tracer.clone(),
            }
        });
        let send = Send {
            target: Some(target),
            ..send
        };
        let body = im_proto::Body::Send(send);
        forward(map.clone(), self.store.clone(), s, req_id, body, to, trace);
        None
    }
}

/// A forwarded request's trace: filed under the home's msg_id once its ack is here.
pub(super) struct Traced {
    /// The trace so far (decode, validate).
    trace: Box<crate::obs::trace::Trace>,
    /// Where it is filed.
    tracer: std::sync::Arc<crate::obs::trace::Tracer>,
}

impl Traced {
    /// The trace context the forward carries: this region and node.
    fn header(&self, region: &str) -> String {
        format!("{region}/{}", self.tracer.node())
    }

    /// Records the forward's stages and files the part under the msg_id of the home's
    /// `answer` (a SendAck; nothing is filed for another answer).
    fn file(mut self, forward: (Instant, Instant), wait: (Instant, Instant), answer: &[u8]) {
        use im_proto::Message as _;
        let Ok(Some(im_proto::Body::SendAck(ack))) =
            im_proto::Frame::decode(answer).map(|f| f.body)
        else {
            return;
        };
        self.trace.stage(Stage::RegionForward, forward.0, forward.1);
        self.trace.stage(Stage::ApplyWait, wait.0, wait.1);
        self.trace.set_message(&ack.msg_id, &ack.conversation_id);
        self.trace.set_committed(&ack.msg_id, ack.seq);
        self.tracer.file((*self.trace).into_part());
    }
}

/// Where a request homed in another region goes.
pub(super) struct Forward {
    /// Its conversation.
    pub(super) conversation: String,
    /// The conversation's home region.
    pub(super) home: String,
    /// The home's entry point (named in a refusal).
    pub(super) entry: String,
    /// The stage histograms (region_forward, apply_wait).
    pub(super) metrics: crate::obs::Metrics,
}

/// Multi-region mode: forwards a request (a Send, GroupOp, Recall or Edit) homed in
/// region `to.home` there and queues its answer (the home's SendAck or GroupOpOk after
/// its durable commit, once this region has applied it too or [`APPLY_WAIT`] passed,
/// or its Error) to the sender; a home that does not answer gets the sender
/// `REGION_UNAVAILABLE` with a retry hint.
pub(super) fn forward(
    map: std::sync::Arc<crate::region::RegionMap>,
    store: std::sync::Arc<dyn crate::store::Store>,
    s: &Session,
    req_id: u64,
    body: im_proto::Body,
    to: Forward,
    trace: Option<Traced>,
) {
    let (out, sender) = (s.out.clone(), s.user_id.clone());
    tokio::spawn(async move {
        let frame = im_proto::encode(&im_proto::frame(req_id, body));
        let Forward {
            conversation,
            home,
            entry,
            metrics,
        } = to;
        let header = trace.as_ref().map(|t| t.header(&map.local));
        let t0 = Instant::now();
        let answer = match map.forward(&home, &sender, frame, header.as_deref()).await {
            Ok(bytes) if home_answer_ok(&bytes, req_id) => {
                let t1 = Instant::now();
                applied_here(&*store, &bytes).await;
                let t2 = Instant::now();
                metrics.stage(Stage::RegionForward, t1 - t0);
                metrics.stage(Stage::ApplyWait, t2 - t1);
                if let Some(t) = trace {
                    t.file((t0, t1), (t1, t2), &bytes);
                }
                bytes
            }
            Ok(_) => refuse(req_id, &conversation, &home, &entry, "gave a bad answer"),
            Err(e @ crate::region::ForwardError::ListsDiffer { .. }) => {
                tracing::warn!(home = %home, error = %e, "forward refused");
                let what = "has a different regions list (see im_region_config_mismatch)";
                refuse(req_id, &conversation, &home, &entry, what)
            }
            Err(e) => {
                tracing::warn!(home = %home, error = %e, "forwarded request unanswered");
                refuse(req_id, &conversation, &home, &entry, "did not answer")
            }
        };
        out.push(answer, true);
    });
}

/// Longest a forwarded request's ack waits for this region to apply what it acks.
pub const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Read-your-writes across regions: waits until this region's store holds the seq the
/// home's `answer` acks (a SendAck's seq, a GroupOpOk's version) and so every seq
/// before it, at most [`APPLY_WAIT`]. A client that syncs right after the ack reads
/// its message and what preceded it here, and never takes a seq not applied yet for
/// one that is not there. Past the wait the ack goes anyway (counted).
async fn applied_here(store: &dyn crate::store::Store, answer: &[u8]) {
    use im_proto::Message as _;
    let (conversation, seq) = match im_proto::Frame::decode(answer).map(|f| f.body) {
        Ok(Some(im_proto::Body::SendAck(a))) => (a.conversation_id, a.seq),
        Ok(Some(im_proto::Body::GroupOpOk(ok))) => {
            (im_proto::group_conversation(&ok.group_id), ok.version)
        }
        _ => return,
    };
    if seq == 0 {
        return;
    }
    let end = Instant::now() + APPLY_WAIT;
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        if matches!(store.last_seq(&conversation).await, Ok(Some(s)) if s >= seq) {
            return;
        }
        if Instant::now() + pause > end {
            metrics::counter!("im_region_ack_apply_wait_timeouts_total").increment(1);
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
    }
}

/// The home's answer is one frame for `req_id`: a SendAck, a GroupOpOk or an Error.
fn home_answer_ok(bytes: &[u8], req_id: u64) -> bool {
    use im_proto::Message as _;
    matches!(
        im_proto::Frame::decode(bytes),
        Ok(f) if f.req_id == req_id
            && matches!(
                f.body,
                Some(
                    im_proto::Body::SendAck(_)
                        | im_proto::Body::GroupOpOk(_)
                        | im_proto::Body::Error(_)
                )
            )
    )
}

/// The encoded `REGION_UNAVAILABLE` answer for a forward that failed.
fn refuse(req_id: u64, conversation: &str, home: &str, entry: &str, what: &str) -> bytes::Bytes {
    let mut r = Refusal::code(
        ErrorCode::RegionUnavailable,
        format!("conversation {conversation} is homed in region {home} ({entry}), which {what}"),
        None,
    );
    r.retry_after_ms = 1000;
    im_proto::encode(&r.to_frame(req_id))
}

/// The payload to store after the hook's `verdict`, or the refusal the sender gets.
fn apply_verdict(verdict: Verdict, sent: bytes::Bytes) -> Result<bytes::Bytes, Refusal> {
    match verdict {
        Verdict::Allow => Ok(sent),
        Verdict::Replace(payload) => Ok(payload.into()),
        Verdict::Reject(reason) => Err(Refusal::code(
            ErrorCode::RejectedByHook,
            if reason.is_empty() {
                "rejected by the before-send hook".to_owned()
            } else {
                format!("rejected by the before-send hook: {reason}")
            },
            None,
        )),
        Verdict::Unavailable {
            why,
            retry_after_ms,
        } => Err(Refusal {
            code: ErrorCode::Overloaded,
            message: format!(
                "not sent: the before-send hook is unavailable ({why}) and \
                 hooks.before_send.on_error is fail_closed; retry with the same client_msg_id"
            ),
            retry_after_ms,
            bad_reason: None,
        }),
    }
}
