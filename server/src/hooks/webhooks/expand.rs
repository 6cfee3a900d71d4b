//! The expander: claims committed messages of the outbox (with a lease, so in a cluster
//! each is expanded by one node, and a dead node's are taken over when its lease runs
//! out) and turns each into per-endpoint events in one store transaction that also
//! deletes the outbox rows: `message.created`, `.edited`, `.recalled` and
//! `group.changed` once per message; `message.offline` per recipient who has no
//! connection on any node at this moment, with their unread count. Repeats for one
//! user within `webhooks.offline_window_ms` are collapsed: the first fires at once,
//! the later ones are merged into one event due at the window's end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::event::{self, Body};
use super::Webhooks;
use crate::store::outbox::{Merge, NewEvent, OutboxSource};
use crate::store::StoreError;

/// Whether a user has a connection on any node (the router's view, with cluster
/// presence).
pub type OnlineFn = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Committed messages expanded per transaction at most.
const BATCH: u32 = 256;
/// How long a claim of outbox rows holds, ms (a node that dies leaves them this long).
const LEASE_MS: i64 = 30_000;
/// The wait when the outbox is empty, or held less than a batch: rows gather for the
/// next claim, so the store sees few, larger writes (on SQLite they ride in the message
/// commits' transactions, `store::sqlite_outbox`).
const IDLE: Duration = Duration::from_millis(20);
/// The wait after a batch smaller than [`BATCH`].
const GATHER: Duration = Duration::from_millis(10);
/// A merge into a stored event this close to its due time starts a new event instead.
const GUARD_MS: i64 = 500;
/// Collapse windows remembered at most before the expired ones are dropped.
const MAX_WINDOWS: usize = 100_000;

/// One (endpoint, user)'s collapse window.
struct Window {
    /// When it ends, ms.
    until: i64,
    /// The merged event due at its end, if one was made.
    trailing: Option<Trailing>,
}

/// The merged event of a window: still in the batch being built, or stored.
struct Trailing {
    /// Index in the batch's events (pending) or row id (stored).
    at: i64,
    stored: bool,
    event_id: String,
    merged: u64,
}

/// The events and merges of one batch.
#[derive(Default)]
struct Plan {
    events: Vec<NewEvent>,
    merges: Vec<Merge>,
}

/// Runs the expander until aborted.
pub(super) async fn run(hooks: Arc<Webhooks>, online: OnlineFn) {
    let mut windows: HashMap<(usize, String), Window> = HashMap::new();
    let owner = hooks.node_id.clone();
    loop {
        let rows = match hooks.store.outbox_claim(&owner, LEASE_MS, BATCH).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "claiming webhook outbox rows failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if rows.is_empty() {
            tokio::time::sleep(IDLE).await;
            continue;
        }
        let done: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let stored = match plan(&hooks, &online, &rows, &mut windows).await {
            Ok(p) => hooks
                .store
                .outbox_expand(&done, &p.events, &p.merges)
                .await
                .map(|ids| (p, ids)),
            Err(e) => Err(e),
        };
        match stored {
            Ok((p, ids)) => {
                settle_windows(&mut windows, &ids);
                hooks.wake(&p.events);
                metrics::counter!("im_webhook_expanded_total").increment(done.len() as u64);
            }
            Err(e) => {
                // The rows stay claimed until the lease ends (SQLite: a second), then
                // are tried again.
                windows.retain(|_, w| w.trailing.as_ref().is_none_or(|t| t.stored));
                tracing::warn!(error = %e, "expanding webhook outbox rows failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        if done.len() < BATCH as usize {
            tokio::time::sleep(GATHER).await;
        }
        if windows.len() > MAX_WINDOWS {
            let now = im_proto::now_ms();
            windows.retain(|_, w| w.until > now);
        }
    }
}

/// The pending merged events of this batch now have row ids.
fn settle_windows(windows: &mut HashMap<(usize, String), Window>, ids: &[i64]) {
    for w in windows.values_mut() {
        if let Some(t) = w.trailing.as_mut().filter(|t| !t.stored) {
            match ids.get(t.at as usize) {
                Some(id) => {
                    t.at = *id;
                    t.stored = true;
                }
                None => w.trailing = None,
            }
        }
    }
}

/// The events of a batch of committed messages.
async fn plan(
    hooks: &Webhooks,
    online: &OnlineFn,
    rows: &[OutboxSource],
    windows: &mut HashMap<(usize, String), Window>,
) -> Result<Plan, StoreError> {
    let mut plan = Plan::default();
    let mut members: HashMap<String, Vec<String>> = HashMap::new();
    let offline_wanted = hooks.wants("message.offline");
    for s in rows.iter().filter(|s| !s.msg_id.is_empty()) {
        let now = im_proto::now_ms();
        let kind = event::kind_of(s);
        if hooks.wants(kind) {
            let body = event::message(&hooks.node_id, kind, s, now);
            hooks.events_for(kind, &body, now, now, &mut plan.events);
        }
        if !offline_wanted || !event::pushes(s) {
            continue;
        }
        let recipients = recipients(hooks, s, &mut members).await?;
        let offline: Vec<&str> = recipients
            .iter()
            .map(String::as_str)
            .filter(|u| *u != s.sender && !online(u))
            .collect();
        if offline.is_empty() {
            continue;
        }
        let read: HashMap<String, u64> = hooks
            .store
            .read_positions(&s.conversation_id, &offline)
            .await?
            .into_iter()
            .collect();
        for user in offline {
            let unread = s.seq.saturating_sub(read.get(user).copied().unwrap_or(0));
            let body = event::offline(&hooks.node_id, s, user, unread, now);
            offline_events(hooks, user, body, now, windows, &mut plan);
        }
    }
    Ok(plan)
}

/// Who a message is for: the other party of a one-to-one conversation, or the group's
/// members (read once per batch).
async fn recipients(
    hooks: &Webhooks,
    s: &OutboxSource,
    members: &mut HashMap<String, Vec<String>>,
) -> Result<Vec<String>, StoreError> {
    if let Some(pair) = s.conversation_id.strip_prefix("u:") {
        return Ok(pair.split(':').map(str::to_owned).collect());
    }
    let Some(group) = s.conversation_id.strip_prefix("g:") else {
        return Ok(Vec::new());
    };
    if let Some(m) = members.get(group) {
        return Ok(m.clone());
    }
    let list = hooks
        .store
        .group_members(group)
        .await?
        .map(|(m, _)| m)
        .unwrap_or_default();
    members.insert(group.to_owned(), list.clone());
    Ok(list)
}

/// `message.offline` for `user` to every endpoint that wants it, through the collapse
/// window: a new window fires at once; within one, the first repeat makes an event due
/// at the window's end and later ones replace its body (same event id, `merged` + 1).
fn offline_events(
    hooks: &Webhooks,
    user: &str,
    body: Body,
    now: i64,
    windows: &mut HashMap<(usize, String), Window>,
    plan: &mut Plan,
) {
    let window = i64::from(hooks.config.offline_window_ms);
    for (i, e) in hooks.endpoints.iter().enumerate() {
        if !e.events.iter().any(|k| k == "message.offline") {
            continue;
        }
        let fresh = body.fresh();
        if window == 0 {
            plan.events.push(hooks.new_event(&e.name, fresh, now, now));
            continue;
        }
        let key = (i, user.to_owned());
        let w = windows.entry(key).or_insert(Window {
            until: 0,
            trailing: None,
        });
        if now >= w.until {
            *w = Window {
                until: now + window,
                trailing: None,
            };
            plan.events.push(hooks.new_event(&e.name, fresh, now, now));
            continue;
        }
        match w.trailing.as_mut() {
            Some(t) if !t.stored => {
                t.merged += 1;
                let merged = fresh.with_id(&t.event_id).merged(t.merged);
                if let Some(ev) = plan.events.get_mut(t.at as usize) {
                    ev.body = merged.json();
                }
            }
            Some(t) if now < w.until - GUARD_MS => {
                t.merged += 1;
                let merged = fresh.with_id(&t.event_id).merged(t.merged);
                plan.merges.push(Merge {
                    id: t.at,
                    body: merged.json(),
                });
            }
            Some(_) => plan
                .events
                .push(hooks.new_event(&e.name, fresh, now, w.until)),
            None => {
                w.trailing = Some(Trailing {
                    at: plan.events.len() as i64,
                    stored: false,
                    event_id: fresh.id().to_owned(),
                    merged: 0,
                });
                plan.events
                    .push(hooks.new_event(&e.name, fresh, now, w.until));
            }
        }
    }
}
