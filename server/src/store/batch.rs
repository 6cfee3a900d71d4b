//! The store-independent steps of a batch commit, shared by the SQLite commit thread
//! (`store::sqlite_commit`) and the Postgres transaction (`store::sql`): handing out the
//! reserved seqs, copying a batch-internal duplicate's result, the senders' own read
//! cursors, the users' furthest delivery cursors, and the final answer per message. The
//! statements that write them stay with each backend.

use std::collections::{BTreeMap, HashMap};

use super::{Committed, CursorUpdate, NewMessage};

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

/// Per (user, conversation), the furthest delivery cursor of any of the user's devices
/// in this batch, in key order.
pub(crate) fn furthest_cursors(cursors: &[CursorUpdate]) -> BTreeMap<(&str, &str), u64> {
    let mut furthest = BTreeMap::new();
    for c in cursors {
        let e = furthest
            .entry((c.user_id.as_str(), c.conversation_id.as_str()))
            .or_insert(0);
        *e = (*e).max(c.seq);
    }
    furthest
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
