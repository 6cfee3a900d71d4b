//! Delivery state: DeliverAck (a delivered cursor moved, within the conversation's
//! seqs) and SyncRequest (a page of what a device missed, from its cursors; the answer
//! to a hint naming one large group, from the router's recent window when it can).

use im_proto::{
    parse_conversation, Body, ConversationRef, DeliverAck, ErrorCode, SyncRequest, SyncResponse,
};

use super::{Pipeline, Refusal, Session, DEFAULT_SYNC_LIMIT, MAX_SYNC_CURSORS};
use crate::persist::WriteReq;
use crate::route::recent::{Miss, Page};
use crate::store::CursorUpdate;

/// Most conversations a session remembers the last seq of (then the memory starts over).
const LAST_SEQS_MAX: usize = 1024;

impl Pipeline {
    /// A DeliverAck: the device's cursor moves (through the writer) when the caller may
    /// read the conversation and the seq is in it.
    pub(super) async fn on_deliver_ack(&self, s: &Session, ack: DeliverAck) -> Result<(), Refusal> {
        if !self.can_read(&s.user_id, &ack.conversation_id).await? {
            return Err(Refusal::code(
                ErrorCode::NotMember,
                format!("not a member of {}", ack.conversation_id),
                Some("not_member"),
            ));
        }
        // Only up to what the conversation holds: an ack for a conversation that does
        // not exist, or past its last seq, writes nothing.
        if !self.seq_exists(s, &ack.conversation_id, ack.seq).await? {
            return Err(Refusal::bad(format!(
                "no seq {} in {}",
                ack.seq, ack.conversation_id
            )));
        }
        // Cursors are advisory: if the queue is full this one is skipped and a later
        // (cumulative) ack carries it.
        let _ = self.persist.try_submit(WriteReq::Cursor(CursorUpdate {
            user_id: s.user_id.clone(),
            device_id: s.device_id.clone(),
            conversation_id: ack.conversation_id,
            seq: ack.seq,
        }));
        Ok(())
    }

    /// Whether `conversation_id` exists and holds `seq` (1 ..= its last seq); the last
    /// seq comes from what this node committed or from the store, and is remembered by
    /// the session while acks stay under it.
    pub(super) async fn seq_exists(
        &self,
        s: &Session,
        conversation_id: &str,
        seq: u64,
    ) -> Result<bool, Refusal> {
        if seq == 0 {
            return Ok(false);
        }
        let known = s
            .last_seqs
            .lock()
            .ok()
            .and_then(|m| m.get(conversation_id).copied());
        if known.is_some_and(|last| seq <= last) {
            return Ok(true);
        }
        // What this node just committed or routed (the usual case: an ack of a fresh
        // delivery; a large group's members ack what another node committed), before a
        // store read.
        let routed = self.router.recent().last_seq(conversation_id);
        let last = match self.persist.last_committed(conversation_id).max(routed) {
            Some(last) if seq <= last => Some(last),
            _ => self
                .store
                .last_seq(conversation_id)
                .await
                .map_err(Refusal::store)?,
        };
        let Some(last) = last else {
            return Ok(false);
        };
        if let Ok(mut m) = s.last_seqs.lock() {
            if m.len() >= LAST_SEQS_MAX {
                m.clear();
            }
            m.insert(conversation_id.to_owned(), last);
        }
        Ok(seq <= last)
    }

    /// A SyncRequest: one page of the messages after the cursors.
    pub(super) async fn on_sync(
        &self,
        s: &Session,
        req_id: u64,
        req: SyncRequest,
    ) -> Result<(), Refusal> {
        if req.cursors.len() > MAX_SYNC_CURSORS {
            return Err(Refusal::bad(format!(
                "more than {MAX_SYNC_CURSORS} cursors"
            )));
        }
        // Cleared before the read, so a message committed after it hints again.
        s.out.clear_sync_hint();
        let limit = match req.limit {
            0 => DEFAULT_SYNC_LIMIT.min(self.limits.sync_limit_max),
            n => n.min(self.limits.sync_limit_max),
        };
        let only = req.only_cursors && req.cursors.len() == 1;
        let mut cursors = Vec::with_capacity(req.cursors.len());
        for c in req.cursors {
            if !self.can_read(&s.user_id, &c.conversation_id).await? {
                return Err(Refusal::code(
                    ErrorCode::NotMember,
                    format!("not a member of {}", c.conversation_id),
                    Some("not_member"),
                ));
            }
            cursors.push((c.conversation_id, c.after_seq));
        }
        if only {
            if let Some(page) = self.recent_page(&cursors[0], limit) {
                return s.answer(
                    req_id,
                    Body::SyncResp(SyncResponse {
                        messages: page.messages,
                        more: page.more,
                        ..Default::default()
                    }),
                );
            }
        }
        // Anything the window cannot answer reads the store, every conversation of the
        // device (a superset of what `only_cursors` asked for).
        let (messages, more) = self
            .store
            .sync_device(
                &s.user_id,
                &s.device_id,
                &cursors,
                limit,
                self.sync_page_bytes,
            )
            .await
            .map_err(Refusal::store)?;
        s.answer(
            req_id,
            Body::SyncResp(SyncResponse {
                messages,
                more,
                ..Default::default()
            }),
        )
    }

    /// A page of a large group's newest messages from the router's recent window, when
    /// it can answer for this reader (the caller checked membership, which also loaded
    /// the group's version: no page reaches back past its last membership change).
    /// Counts the answer in `im_syncs_from_window_total`, or the miss in
    /// `im_sync_window_misses_total{reason}`.
    fn recent_page(&self, cursor: &(String, u64), limit: u32) -> Option<Page> {
        let (conversation_id, after_seq) = cursor;
        let Some(ConversationRef::Group(g)) = parse_conversation(conversation_id) else {
            return None;
        };
        let page = match self.relations.version_of(g) {
            Some(version) => self.router.recent().page(
                conversation_id,
                *after_seq,
                version,
                limit as usize,
                self.sync_page_bytes,
            ),
            None => Err(Miss::Membership),
        };
        match page {
            Ok(page) => {
                self.metrics.syncs_from_window.increment(1);
                Some(page)
            }
            Err(miss) => {
                metrics::counter!("im_sync_window_misses_total", "reason" => miss.label())
                    .increment(1);
                None
            }
        }
    }
}
