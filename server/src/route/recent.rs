//! The recent window: the newest messages of each large (notify-and-pull) group this
//! node routed, kept so that the members' syncs after a hint are answered from memory
//! instead of one store read per member. The router files every message of such a group
//! here before it hints; the pipeline's sync reads it for a `SyncRequest` with
//! `only_cursors` and one cursor.
//!
//! A group's window holds a run of consecutive seqs (a gap starts it over), in the form a
//! push carries them. It only answers what the store would: a page starting inside it,
//! after the group's last membership change (so no member reads before their join), with
//! no SYSTEM message in the window newer than the membership the caller was checked
//! against (a change whose notice has not reached this node's cache), and after every
//! message an edit, a recall or a delete-for-me changed (those read their stored state).
//! Anything else reads the store. Bounded in groups, messages and bytes.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use im_proto::{ChatMessage, MessageType};

/// Most groups with a window; the least recently filed goes first.
pub const MAX_GROUPS: usize = 64;
/// Most messages in one group's window.
pub const MAX_MESSAGES: usize = 512;
/// Most payload bytes in one group's window (its oldest messages go first).
pub const MAX_BYTES: usize = 1 << 20;

/// One group's run of consecutive messages.
#[derive(Default)]
struct Run {
    messages: VecDeque<ChatMessage>,
    bytes: usize,
    /// Messages at or below this seq are not served (their stored state may differ).
    floor: u64,
    /// Seqs of the SYSTEM messages in the run (membership changes among them).
    systems: VecDeque<u64>,
    /// Filing tick, for eviction.
    used: u64,
}

impl Run {
    fn first(&self) -> u64 {
        self.messages.front().map_or(0, |m| m.seq)
    }

    fn last(&self) -> u64 {
        self.messages.back().map_or(0, |m| m.seq)
    }

    fn file(&mut self, m: ChatMessage) {
        if !self.messages.is_empty() && m.seq != self.last() + 1 {
            if m.seq <= self.last() {
                return; // already here
            }
            self.messages.clear();
            self.systems.clear();
            self.bytes = 0;
        }
        if matches!(
            MessageType::try_from(m.r#type),
            Ok(MessageType::Recall | MessageType::Edit)
        ) {
            self.floor = self.floor.max(m.ref_seq);
        }
        if m.r#type == MessageType::System as i32 {
            self.systems.push_back(m.seq);
        }
        self.bytes += m.payload.len();
        self.messages.push_back(m);
        while self.messages.len() > MAX_MESSAGES || self.bytes > MAX_BYTES {
            match self.messages.pop_front() {
                Some(old) => {
                    self.bytes -= old.payload.len();
                    if self.systems.front() == Some(&old.seq) {
                        self.systems.pop_front();
                    }
                }
                None => break,
            }
        }
    }
}

/// Why a window could not answer a sync (the `reason` of
/// `im_sync_window_misses_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// No window of the conversation on this node.
    NoWindow,
    /// The cursor is before the group's last membership change, or a SYSTEM message
    /// in the window is newer than the membership the caller was checked against.
    Membership,
    /// A message after the cursor was edited, recalled or hidden since it was routed.
    Changed,
    /// The cursor is before the window's first message.
    Before,
    /// The cursor is past the window's last message.
    Ahead,
}

impl Miss {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Miss::NoWindow => "no_window",
            Miss::Membership => "membership",
            Miss::Changed => "changed",
            Miss::Before => "before_window",
            Miss::Ahead => "ahead_of_window",
        }
    }
}

/// What a window answered.
#[derive(Debug, PartialEq)]
pub struct Page {
    /// The messages after the cursor, in seq order.
    pub messages: Vec<ChatMessage>,
    /// More remain in the window past the page's limits.
    pub more: bool,
}

/// The windows of this node's large groups; the one owner of them.
#[derive(Default)]
pub struct Recent {
    groups: Mutex<HashMap<String, Run>>,
    tick: std::sync::atomic::AtomicU64,
}

impl Recent {
    /// Files a committed message of a large group (in commit order; a duplicate is
    /// ignored, a gap starts the window over).
    pub fn file(&self, m: &ChatMessage) {
        let tick = self.tick.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Ok(mut groups) = self.groups.lock() else {
            return;
        };
        if !groups.contains_key(&m.conversation_id) && groups.len() >= MAX_GROUPS {
            if let Some(oldest) = groups
                .iter()
                .min_by_key(|(_, r)| r.used)
                .map(|(k, _)| k.clone())
            {
                groups.remove(&oldest);
            }
        }
        let run = groups.entry(m.conversation_id.clone()).or_default();
        run.used = tick;
        run.file(m.clone());
    }

    /// A message at or below `seq` of `conversation_id` changed for someone (a
    /// delete-for-me): it and those before it are read from the store from now on.
    pub fn changed(&self, conversation_id: &str, seq: u64) {
        if let Ok(mut groups) = self.groups.lock() {
            if let Some(run) = groups.get_mut(conversation_id) {
                run.floor = run.floor.max(seq);
            }
        }
    }

    /// Forgets every window (the cluster link was down: messages may have been missed).
    pub fn clear(&self) {
        if let Ok(mut groups) = self.groups.lock() {
            groups.clear();
        }
    }

    /// The messages of `conversation_id` after `after_seq`, at most `limit` and
    /// stopping before `max_bytes` of payload (the first always goes in), when the window
    /// can answer for a reader who may see everything after `visible_after` (the group's
    /// last membership change); a [`Miss`] sends the caller to the store.
    pub fn page(
        &self,
        conversation_id: &str,
        after_seq: u64,
        visible_after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, Miss> {
        let groups = self.groups.lock().map_err(|_| Miss::NoWindow)?;
        let run = groups
            .get(conversation_id)
            .filter(|r| !r.messages.is_empty())
            .ok_or(Miss::NoWindow)?;
        // A SYSTEM message newer than the membership the caller checked may be a change
        // that node's cache has not seen yet (a notice lost between nodes): the store
        // decides, until that message leaves the window.
        if run.systems.back().is_some_and(|&s| s > visible_after) || after_seq < visible_after {
            return Err(Miss::Membership);
        }
        if after_seq < run.floor {
            return Err(Miss::Changed);
        }
        if after_seq + 1 < run.first() {
            return Err(Miss::Before);
        }
        if after_seq > run.last() {
            return Err(Miss::Ahead);
        }
        let skip = usize::try_from(after_seq + 1 - run.first()).map_err(|_| Miss::Before)?;
        let mut messages = Vec::new();
        let mut bytes = 0;
        for m in run.messages.iter().skip(skip) {
            if !messages.is_empty()
                && (messages.len() >= limit || bytes + m.payload.len() > max_bytes)
            {
                return Ok(Page {
                    messages,
                    more: true,
                });
            }
            bytes += m.payload.len();
            messages.push(m.clone());
        }
        Ok(Page {
            messages,
            more: false,
        })
    }

    /// The newest seq of `conversation_id` this node routed, while it has a window of it:
    /// a committed seq (a DeliverAck up to it names a message that exists).
    pub fn last_seq(&self, conversation_id: &str) -> Option<u64> {
        let groups = self.groups.lock().ok()?;
        groups
            .get(conversation_id)
            .map(Run::last)
            .filter(|&last| last > 0)
    }

    /// Groups with a window, and the messages they hold.
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        self.groups.lock().map_or((0, 0), |g| {
            (g.len(), g.values().map(|r| r.messages.len()).sum())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(seq: u64, kind: MessageType, ref_seq: u64) -> ChatMessage {
        ChatMessage {
            conversation_id: "g:big".into(),
            seq,
            r#type: kind as i32,
            ref_seq,
            payload: vec![b'x'; 10].into(),
            ..Default::default()
        }
    }

    fn seqs(p: Result<Page, Miss>) -> Option<(Vec<u64>, bool)> {
        p.ok()
            .map(|p| (p.messages.iter().map(|m| m.seq).collect(), p.more))
    }

    /// The seqs of "g:big" after `after` for a reader visible after `visible` (10 a page).
    fn at(r: &Recent, after: u64, visible: u64) -> Option<(Vec<u64>, bool)> {
        seqs(r.page("g:big", after, visible, 10, 1000))
    }

    #[test]
    fn answers_inside_the_run_and_after_the_membership_change_only() {
        let r = Recent::default();
        for s in 5..=9 {
            r.file(&msg(s, MessageType::Text, 0));
        }
        assert_eq!(at(&r, 6, 0), Some((vec![7, 8, 9], false)));
        assert_eq!(at(&r, 4, 0), Some((vec![5, 6, 7, 8, 9], false)));
        assert_eq!(at(&r, 9, 0), Some((vec![], false)));
        assert_eq!(at(&r, 3, 0), None, "starts before the run");
        assert_eq!(at(&r, 10, 0), None, "past what it has");
        assert_eq!(at(&r, 6, 7), None, "before the last join");
        assert_eq!(seqs(r.page("g:other", 6, 0, 10, 1000)), None);
        assert_eq!(r.page("g:big", 3, 0, 10, 1000).err(), Some(Miss::Before));
        assert_eq!(r.page("g:big", 10, 0, 10, 1000).err(), Some(Miss::Ahead));
        assert_eq!(
            r.page("g:big", 6, 7, 10, 1000).err(),
            Some(Miss::Membership)
        );
        assert_eq!(r.page("g:none", 6, 0, 10, 1000).err(), Some(Miss::NoWindow));
        assert_eq!(
            (r.last_seq("g:big"), r.last_seq("g:other")),
            (Some(9), None)
        );
        assert_eq!(
            seqs(r.page("g:big", 4, 0, 2, 1000)),
            Some((vec![5, 6], true))
        );
        assert_eq!(
            seqs(r.page("g:big", 4, 0, 10, 25)),
            Some((vec![5, 6], true))
        );
        assert_eq!(
            seqs(r.page("g:big", 4, 0, 10, 1)),
            Some((vec![5], true)),
            "the first always goes in"
        );
    }

    #[test]
    fn a_gap_starts_over_and_a_duplicate_is_ignored() {
        let r = Recent::default();
        r.file(&msg(1, MessageType::Text, 0));
        r.file(&msg(2, MessageType::Text, 0));
        r.file(&msg(2, MessageType::Text, 0));
        assert_eq!(at(&r, 0, 0), Some((vec![1, 2], false)));
        r.file(&msg(5, MessageType::Text, 0));
        assert_eq!(at(&r, 2, 0), None, "3 and 4 were missed");
        assert_eq!(at(&r, 4, 0), Some((vec![5], false)));
    }

    #[test]
    fn changed_messages_are_read_from_the_store() {
        let r = Recent::default();
        for s in 1..=4 {
            r.file(&msg(s, MessageType::Text, 0));
        }
        r.file(&msg(5, MessageType::Edit, 2));
        assert_eq!(at(&r, 1, 0), None, "2 was edited");
        assert_eq!(at(&r, 2, 0), Some((vec![3, 4, 5], false)));
        r.changed("g:big", 3);
        assert_eq!(at(&r, 2, 0), None, "3 was hidden for someone");
        assert_eq!(at(&r, 3, 0), Some((vec![4, 5], false)));
    }

    #[test]
    fn a_membership_change_the_cache_has_not_seen_sends_every_page_to_the_store() {
        let r = Recent::default();
        r.file(&msg(1, MessageType::Text, 0));
        r.file(&msg(2, MessageType::System, 0));
        r.file(&msg(3, MessageType::Text, 0));
        assert_eq!(at(&r, 2, 1), None, "checked against version 1");
        assert_eq!(at(&r, 2, 2), Some((vec![3], false)));
        // Once the SYSTEM message leaves the window, the window answers again.
        for s in 4..=(MAX_MESSAGES as u64 + 3) {
            r.file(&msg(s, MessageType::Text, 0));
        }
        assert_eq!(at(&r, 10, 1).map(|p| p.0.len()), Some(10));
    }

    #[test]
    fn bounded_in_messages_and_groups() {
        let r = Recent::default();
        for s in 1..=(MAX_MESSAGES as u64 + 10) {
            r.file(&msg(s, MessageType::Text, 0));
        }
        assert_eq!(r.len(), (1, MAX_MESSAGES));
        assert_eq!(at(&r, 5, 0), None, "the oldest went");
        for g in 0..MAX_GROUPS + 5 {
            let mut m = msg(1, MessageType::Text, 0);
            m.conversation_id = format!("g:{g}");
            r.file(&m);
        }
        assert_eq!(r.len().0, MAX_GROUPS);
    }
}
