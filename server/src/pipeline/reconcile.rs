//! Multi-region reconciliation's commit at the new home (`region_home`): a message the
//! old home acked above a home move's fence, re-sent here, is committed through the
//! persistence writer like a Send, with its original msg_id, sender, type, payload and
//! client_msg_id (the writer's de-duplication by client_msg_id holds), at this home's
//! next seq, and pushed to the conversation's members as any message is.

use std::time::{Duration, Instant};

use im_proto::{Body, ConversationRef, Frame, Message as _};

use super::Pipeline;
use crate::flow::Outbound;
use crate::persist::{PersistReq, WriteReq};
use crate::route::Recipients;
use crate::store::repl::Record;
use crate::store::NewMessage;

/// How long a re-sent message waits for room in a full persistence queue.
const QUEUE_WAIT: Duration = Duration::from_secs(2);

impl Pipeline {
    /// Commits re-sent message `rec` at its next seq here; the seq (the first commit's
    /// when it is a duplicate by client_msg_id), or why not.
    pub async fn commit_reconciled(
        &self,
        rec: &Record,
        (soft, hard): (u64, u64),
    ) -> Result<u64, String> {
        use base64::Engine as _;
        let payload = base64::engine::general_purpose::STANDARD
            .decode(&rec.payload)
            .map_err(|e| format!("payload: {e}"))?;
        let conv = rec.conversation_id.as_str();
        let (direct, recipients) = match im_proto::parse_conversation(conv) {
            Some(ConversationRef::Direct(a, b)) => (
                Some((a.to_owned(), b.to_owned())),
                Recipients::Direct(a.to_owned(), b.to_owned()),
            ),
            Some(ConversationRef::Group(g)) => {
                let members = self.group_members(g).await.map_err(|r| r.message)?;
                (None, Recipients::Group(members))
            }
            None => return Err(format!("{conv:?} is not a conversation id")),
        };
        let (out, mut rx) = Outbound::new(
            0,
            "region reconcile".into(),
            soft,
            hard,
            self.metrics.clone(),
        );
        let req = PersistReq {
            message: NewMessage {
                conversation_id: rec.conversation_id.clone(),
                sender: rec.sender.clone(),
                client_msg_id: rec.client_msg_id.clone().unwrap_or_default(),
                msg_type: rec.msg_type,
                payload: payload.into(),
                msg_id: rec.msg_id.clone(),
                direct,
                reference: None,
                traced: false,
            },
            req_id: 1,
            origin: out,
            recipients,
            started: Instant::now(),
            enqueued: Instant::now(),
            trace: None,
        };
        if self
            .persist
            .submit(WriteReq::Message(req), QUEUE_WAIT)
            .await
            .is_err()
        {
            return Err("persistence queue full".into());
        }
        let answer = tokio::time::timeout(crate::region::FORWARD_TIMEOUT, rx.frames.recv())
            .await
            .map_err(|_| "commit timed out".to_owned())?
            .ok_or("no answer from the writer")?;
        match Frame::decode(answer.bytes.as_ref()).map(|f| f.body) {
            Ok(Some(Body::SendAck(ack))) => Ok(ack.seq),
            Ok(Some(Body::Error(e))) => Err(e.message),
            _ => Err("an unexpected answer from the writer".into()),
        }
    }
}
