//! The store-independent steps of a batch commit, shared by the SQLite commit thread
//! (`store::sqlite_commit`) and the Postgres transaction (`store::postgres_commit`):
//! sorting the batch into new messages and duplicates, the one-to-one parties' list
//! rows, handing out the reserved seqs, copying a batch-internal duplicate's result, the
//! RECALL and EDIT events to apply, the senders' own read cursors, the furthest cursor
//! per key, and the final answer per message. The statements that write them stay
//! with each backend.

use std::collections::{BTreeMap, HashMap};

use super::{Committed, CursorUpdate, MessageRef, NewMessage, StoreError};

/// A one-to-one conversation's two users.
pub(crate) type Parties = (String, String);

/// A batch sorted into new messages and duplicates, before any seq is reserved.
pub(crate) struct Sorted<'a> {
    /// The answer so far per message, in batch order (set for those stored before).
    pub results: Vec<Option<Committed>>,
    /// The new messages, in batch order.
    pub fresh: Vec<usize>,
    /// `(i, j)`: message `i` repeats message `j` of this batch.
    pub dup_of: Vec<(usize, usize)>,
    /// Per conversation, in id order (the order rows are locked in): its new messages,
    /// and its parties when one-to-one.
    pub counts: BTreeMap<&'a str, (u64, Option<&'a Parties>)>,
}

/// Sorts a batch: a message whose (sender, conversation, client_msg_id) came earlier
/// in the batch repeats that one; one that `stored` finds (the store's lookup of that
/// key) was committed before; the rest are new and counted per conversation.
pub(crate) fn sort<'a>(
    messages: &'a [NewMessage],
    mut stored: impl FnMut(&NewMessage) -> Result<Option<Committed>, StoreError>,
) -> Result<Sorted<'a>, StoreError> {
    let mut sorted = Sorted {
        results: vec![None; messages.len()],
        fresh: Vec::with_capacity(messages.len()),
        dup_of: Vec::new(),
        counts: BTreeMap::new(),
    };
    let mut first_of: HashMap<(&str, &str, &str), usize> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        if !m.client_msg_id.is_empty() {
            let key = (
                m.sender.as_str(),
                m.conversation_id.as_str(),
                m.client_msg_id.as_str(),
            );
            if let Some(&j) = first_of.get(&key) {
                sorted.dup_of.push((i, j));
                continue;
            }
            if let Some(found) = stored(m)? {
                sorted.results[i] = Some(found);
                continue;
            }
            first_of.insert(key, i);
        }
        sorted.fresh.push(i);
        sorted
            .counts
            .entry(m.conversation_id.as_str())
            .or_insert((0, m.direct.as_ref()))
            .0 += 1;
    }
    Ok(sorted)
}

/// The conversation list rows of the batch's one-to-one conversations: (user,
/// conversation) for both parties, sorted, without repeats.
pub(crate) fn direct_rows<'a>(
    counts: &BTreeMap<&'a str, (u64, Option<&'a Parties>)>,
) -> Vec<(&'a str, &'a str)> {
    let mut rows = Vec::new();
    for (&conv, &(_, direct)) in counts {
        if let Some((a, b)) = direct {
            rows.push((a.as_str(), conv));
            rows.push((b.as_str(), conv));
        }
    }
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// Gives each new message (`fresh`, in batch order) the next seq of its conversation's
/// reserved range (`next`: the first seq of each range, advanced as it is used).
pub(crate) fn assign_seqs(
    messages: &[NewMessage],
    fresh: &[usize],
    next: &mut HashMap<&str, u64>,
    results: &mut [Option<Committed>],
    now: i64,
) {
    for &i in fresh {
        let m = &messages[i];
        let Some(seq) = next.get_mut(m.conversation_id.as_str()) else {
            continue;
        };
        results[i] = Some(Committed {
            msg_id: m.msg_id.clone(),
            conversation_id: m.conversation_id.clone(),
            seq: *seq,
            server_time: now,
            duplicate: false,
        });
        *seq += 1;
    }
}

/// A message repeated within the batch (`(i, j)`: `i` repeats `j`) is answered with
/// `j`'s result, marked duplicate.
pub(crate) fn mark_duplicates(results: &mut [Option<Committed>], dup_of: &[(usize, usize)]) {
    for &(i, j) in dup_of {
        results[i] = results[j].clone().map(|c| Committed {
            duplicate: true,
            ..c
        });
    }
}

/// A sender has read their own messages: per (sender, conversation), the last seq they
/// sent in this batch, in key order (the order rows are locked in).
pub(crate) fn own_read_cursors<'a>(
    messages: &'a [NewMessage],
    results: &[Option<Committed>],
) -> BTreeMap<(&'a str, &'a str), i64> {
    let mut own = BTreeMap::new();
    for (m, r) in messages.iter().zip(results.iter()) {
        if let Some(c) = r.as_ref().filter(|c| c.seq > 0) {
            let e = own
                .entry((m.sender.as_str(), m.conversation_id.as_str()))
                .or_insert(0);
            *e = (*e).max(c.seq as i64);
        }
    }
    own
}

/// A RECALL or EDIT event stored by this batch, and the message it changes.
pub(crate) struct Change<'a> {
    /// The event.
    pub event: &'a NewMessage,
    /// Its seq.
    pub seq: i64,
    /// The message it changes.
    pub target: &'a MessageRef,
}

impl Change<'_> {
    /// The changed message's seq, as stored.
    pub(crate) fn target_seq(&self) -> i64 {
        self.target.seq.min(i64::MAX as u64) as i64
    }

    /// Whether the event is a RECALL (else an EDIT; other types change nothing).
    pub(crate) fn kind(&self) -> Option<im_proto::MessageType> {
        use im_proto::MessageType::{Edit, Recall};
        [Recall, Edit]
            .into_iter()
            .find(|t| *t as i32 == self.event.msg_type)
    }
}

/// The RECALL and EDIT events among the batch's new messages that were stored now (not
/// duplicates), in batch order, so in seq order.
pub(crate) fn changes<'a>(
    messages: &'a [NewMessage],
    sorted: &'a Sorted<'_>,
) -> impl Iterator<Item = Change<'a>> {
    sorted.fresh.iter().filter_map(|&i| {
        let m = &messages[i];
        match (m.reference.as_deref(), sorted.results[i].as_ref()) {
            (Some(target), Some(c)) if !c.duplicate => Some(Change {
                event: m,
                seq: c.seq as i64,
                target,
            }),
            _ => None,
        }
    })
}

/// The (conversation, seq) of each message this batch stored now (not a duplicate), in
/// batch order: the webhook outbox's rows.
pub(crate) fn stored_now<'a>(sorted: &'a Sorted<'_>) -> impl Iterator<Item = (&'a str, i64)> {
    sorted.fresh.iter().filter_map(|&i| {
        sorted.results[i]
            .as_ref()
            .filter(|c| !c.duplicate && c.seq > 0)
            .map(|c| (c.conversation_id.as_str(), c.seq as i64))
    })
}

/// The (conversation, seq) of the traced messages stored now (`NewMessage::traced`).
pub(crate) fn traced_now<'a>(
    messages: &[NewMessage],
    sorted: &'a Sorted<'_>,
) -> Vec<(&'a str, i64)> {
    sorted
        .fresh
        .iter()
        .filter(|&&i| messages.get(i).is_some_and(|m| m.traced))
        .filter_map(|&i| {
            sorted.results[i]
                .as_ref()
                .filter(|c| !c.duplicate && c.seq > 0)
                .map(|c| (c.conversation_id.as_str(), c.seq as i64))
        })
        .collect()
}

/// The furthest seq per key, in key order (the order rows are locked in, against
/// deadlocks across nodes; a multi-row upsert may not touch a row twice).
pub(crate) fn furthest<K: Ord>(items: impl IntoIterator<Item = (K, u64)>) -> BTreeMap<K, u64> {
    let mut furthest = BTreeMap::new();
    for (k, seq) in items {
        let e = furthest.entry(k).or_insert(0);
        *e = (*e).max(seq);
    }
    furthest
}

/// Per (user, conversation): the furthest seq.
pub(crate) type UserCursors<'a> = BTreeMap<(&'a str, &'a str), u64>;

/// Per ((user, device), conversation): the furthest seq.
pub(crate) type DeviceCursors<'a> = BTreeMap<((&'a str, &'a str), &'a str), u64>;

/// Per (user, conversation), the furthest delivery cursor of any of the user's devices
/// in this batch; per (user, device, conversation), the device's.
pub(crate) fn delivery_cursors(cursors: &[CursorUpdate]) -> (UserCursors<'_>, DeviceCursors<'_>) {
    let users = furthest(
        cursors
            .iter()
            .map(|c| ((c.user_id.as_str(), c.conversation_id.as_str()), c.seq)),
    );
    let devices = furthest(cursors.iter().map(|c| {
        let device = (c.user_id.as_str(), c.device_id.as_str());
        ((device, c.conversation_id.as_str()), c.seq)
    }));
    (users, devices)
}

/// The answer per message, in batch order (a message without a result, which a
/// conversation missing from the seq reservation would leave, gets seq 0).
pub(crate) fn answers(results: Vec<Option<Committed>>, now: i64) -> Vec<Committed> {
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| Committed {
                msg_id: String::new(),
                conversation_id: String::new(),
                seq: 0,
                server_time: now,
                duplicate: false,
            })
        })
        .collect()
}
