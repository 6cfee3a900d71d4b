//! A receiver that follows one conversation the way a client does, by pushes and by
//! sync (`broadcast` members, `chaos` receivers): pushed messages are taken in seq
//! order; a push gap (pushes dropped for a slow consumer), a notify-and-pull hint (an
//! unsolicited `SyncResponse{more: true}` with req_id 0) or a reconnect asks for a
//! `SyncRequest` of this conversation only after the last seq; pages are read until `more = false`, and a hint
//! that arrives while a sync is in flight asks for one more. The [`Stream`] underneath
//! counts what the server got wrong.

use im_proto::{Body, ChatMessage, Cursor, Frame, SyncRequest};

use crate::check::{Stream, Take, Verdict};

/// First req_id of this follower's sync requests (far from a sender's message numbers).
const SYNC_REQ_BASE: u64 = 1 << 48;

/// How a message reached the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Pushed in a `Deliver`.
    Push,
    /// Read in a sync page.
    Sync,
}

/// One receiver's state for one conversation.
#[derive(Debug)]
pub struct Follower {
    conversation: String,
    stream: Stream,
    limit: u32,
    /// The req_id of the sync in flight.
    in_flight: Option<u64>,
    /// A sync is wanted (gap, hint, more pages, reconnect).
    wanted: bool,
    /// No sync before this: the server's retry hint after a refused one.
    not_before: Option<std::time::Instant>,
    next_req: u64,
    /// Messages of another conversation.
    pub wrong: u64,
    /// Sync requests sent.
    pub syncs: u64,
    /// Notify-and-pull hints received.
    pub hints: u64,
    /// Messages accepted from pushes.
    pub pushed: u64,
    /// Messages accepted from sync pages.
    pub synced: u64,
}

impl Follower {
    /// Follows `conversation` from after seq `after`, syncing `limit` messages a page.
    pub fn new(conversation: String, after: u64, limit: u32) -> Self {
        Follower {
            conversation,
            stream: Stream::new(after),
            limit,
            in_flight: None,
            wanted: false,
            not_before: None,
            next_req: SYNC_REQ_BASE,
            wrong: 0,
            syncs: 0,
            hints: 0,
            pushed: 0,
            synced: 0,
        }
    }

    /// The conversation followed.
    pub fn conversation(&self) -> &str {
        &self.conversation
    }

    /// The highest seq accepted.
    pub fn last(&self) -> u64 {
        self.stream.last()
    }

    /// Whether no sync is in flight or wanted.
    pub fn settled(&self) -> bool {
        self.in_flight.is_none() && !self.wanted
    }

    /// After a reconnect: the sync in flight died with the old connection; sync again.
    pub fn reconnected(&mut self) {
        self.in_flight = None;
        self.wanted = true;
    }

    /// Takes one frame. Accepted messages go to `accepted`. Returns `false` for frames
    /// that are not this follower's (the caller handles them).
    pub fn on_frame(&mut self, f: &Frame, mut accepted: impl FnMut(&ChatMessage, Via)) -> bool {
        match &f.body {
            Some(Body::Deliver(d)) => {
                for m in &d.messages {
                    if m.conversation_id != self.conversation {
                        self.wrong += 1;
                        continue;
                    }
                    match self.stream.push(m.seq) {
                        Take::Accepted => {
                            self.pushed += 1;
                            accepted(m, Via::Push);
                        }
                        Take::Skipped => {}
                        Take::Gap => self.wanted = true,
                    }
                }
                true
            }
            Some(Body::SyncResp(r)) if f.req_id == 0 => {
                self.hints += 1;
                // Every hint is answered by a sync, even one naming a seq already held:
                // the server sends no other hint of the conversation until then.
                self.wanted = true;
                // A hint carries no messages; anything else would be misrouted.
                self.wrong += r.messages.len() as u64;
                true
            }
            Some(Body::SyncResp(r)) if Some(f.req_id) == self.in_flight => {
                self.in_flight = None;
                self.stream.page_start();
                for m in &r.messages {
                    if m.conversation_id != self.conversation {
                        self.wrong += 1;
                        continue;
                    }
                    if self.stream.synced(m.seq) == Take::Accepted {
                        self.synced += 1;
                        accepted(m, Via::Sync);
                    }
                }
                if r.more {
                    self.wanted = true;
                }
                true
            }
            Some(Body::Error(e)) if Some(f.req_id) == self.in_flight => {
                // The sync failed (e.g. OVERLOADED): try again, after the server's
                // retry hint if it gave one, as a client would.
                self.in_flight = None;
                self.wanted = true;
                if e.retry_after_ms > 0 {
                    self.not_before = Some(
                        std::time::Instant::now()
                            + std::time::Duration::from_millis(u64::from(e.retry_after_ms)),
                    );
                }
                false
            }
            _ => false,
        }
    }

    /// The SyncRequest to send now, if one is wanted and none is in flight.
    pub fn sync_request(&mut self) -> Option<Frame> {
        if !self.wanted || self.in_flight.is_some() {
            return None;
        }
        if self
            .not_before
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            return None;
        }
        self.not_before = None;
        self.wanted = false;
        let req_id = self.next_req;
        self.next_req += 1;
        self.in_flight = Some(req_id);
        self.syncs += 1;
        Some(im_proto::frame(
            req_id,
            Body::Sync(SyncRequest {
                cursors: vec![Cursor {
                    conversation_id: self.conversation.clone(),
                    after_seq: self.stream.last(),
                }],
                limit: self.limit,
                // This conversation only: a node answers it from its window of a large
                // group's newest messages.
                only_cursors: true,
            }),
        ))
    }

    /// Checks what was received against the seqs acked to the sender(s), sorted.
    pub fn verdict(&self, acked_sorted: &[u64]) -> Verdict {
        self.stream.verdict(acked_sorted, self.wrong)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use im_proto::{Deliver, SyncResponse};

    use crate::scenarios::test_message as msg;

    fn deliver(conv: &str, seqs: &[u64]) -> Frame {
        im_proto::frame(
            0,
            Body::Deliver(Deliver {
                messages: seqs.iter().map(|&s| msg(conv, s)).collect(),
            }),
        )
    }

    fn page(req_id: u64, conv: &str, seqs: &[u64], more: bool) -> Frame {
        im_proto::frame(
            req_id,
            Body::SyncResp(SyncResponse {
                messages: seqs.iter().map(|&s| msg(conv, s)).collect(),
                more,
                ..Default::default()
            }),
        )
    }

    #[test]
    fn hints_gaps_and_pages_drive_syncs() {
        let c = "g:x";
        let mut f = Follower::new(c.into(), 0, 2);
        let mut got = Vec::new();
        assert!(f.on_frame(&deliver(c, &[1]), |m, v| got.push((m.seq, v))));
        assert!(f.sync_request().is_none());
        // A hint asks for a sync after seq 1.
        assert!(f.on_frame(&page(0, c, &[], true), |_, _| {}));
        let req = f.sync_request().unwrap();
        let Some(Body::Sync(s)) = &req.body else {
            panic!()
        };
        assert_eq!(s.cursors[0].after_seq, 1);
        // Another hint while it is in flight: no second request yet.
        f.on_frame(&page(0, c, &[], true), |_, _| {});
        assert!(f.sync_request().is_none());
        // The page: 2, 3, more. Then the next page.
        f.on_frame(&page(req.req_id, c, &[2, 3], true), |m, v| {
            got.push((m.seq, v))
        });
        let req2 = f.sync_request().unwrap();
        assert_ne!(req2.req_id, req.req_id);
        f.on_frame(&page(req2.req_id, c, &[4], false), |m, v| {
            got.push((m.seq, v))
        });
        assert!(f.settled());
        // A push of 4 (raced the sync) is skipped; 6 is a gap.
        f.on_frame(&deliver(c, &[4, 6]), |m, v| got.push((m.seq, v)));
        assert!(!f.settled());
        assert_eq!(
            got,
            vec![
                (1, Via::Push),
                (2, Via::Sync),
                (3, Via::Sync),
                (4, Via::Sync)
            ]
        );
        assert_eq!((f.hints, f.syncs), (2, 2));
        assert!(!f.on_frame(
            &im_proto::frame(5, Body::Pong(Default::default())),
            |_, _| {}
        ));
        // Other conversations are misrouted.
        f.on_frame(&deliver("g:y", &[1]), |_, _| {});
        let v = f.verdict(&[1, 2, 3, 4]);
        assert_eq!(
            (v.wrong_conversation, v.missing, v.push_gaps_synced),
            (1, 0, 1)
        );
        f.reconnected();
        assert!(f.sync_request().is_some());
    }

    #[test]
    fn a_refused_sync_waits_for_the_retry_hint() {
        let c = "g:x";
        let mut f = Follower::new(c.into(), 0, 100);
        f.on_frame(&page(0, c, &[], true), |_, _| {});
        let req = f.sync_request().unwrap();
        let busy = im_proto::frame(
            req.req_id,
            Body::Error(im_proto::Error {
                code: im_proto::ErrorCode::Overloaded as i32,
                message: "store busy, retry".into(),
                retry_after_ms: 200,
            }),
        );
        f.on_frame(&busy, |_, _| {});
        assert!(!f.settled());
        assert!(f.sync_request().is_none(), "asked again before the hint");
        std::thread::sleep(std::time::Duration::from_millis(250));
        assert!(f.sync_request().is_some());
    }
}
