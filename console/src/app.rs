//! App: the event loop. Pollers run as background tasks (one overview loop and one
//! view loop per node), commands (kick, filters, profile) as one-off tasks, the live log
//! tail as one long task (at most one at a time); all of them report through one channel, so the loop only ever waits on keys, results and a
//! redraw tick and the UI never blocks on a slow node.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossterm::event::{Event, EventStream, KeyEventKind};
use futures_util::StreamExt;
use ratatui::DefaultTerminal;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::MissedTickBehavior;

use crate::api::{AdminClient, ApiError, LogTail, MessageKind, PostMessage};
use crate::config::Settings;
use crate::state::{
    AppState, Command, Plan, Update, CONNECTIONS_LIMIT, PARKED_LIMIT, TAIL_BACKLOG,
    TOP_QUEUED_LIMIT, USER_BACKLOG, USER_MESSAGES,
};
use crate::{input, save, view};

/// How often the screen is redrawn when nothing else happens (progress, ages).
const REDRAW: Duration = Duration::from_millis(250);
/// A tail's lines are handed to the loop in batches: at most this long after the first.
const TAIL_BATCH_WAIT: Duration = Duration::from_millis(100);
/// ... and at most this many lines.
const TAIL_BATCH_LINES: usize = 500;

/// Why the console stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A node URL is unusable.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The terminal failed.
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
}

/// A result on its way from a task to the loop.
type Msg = (usize, Update);

/// Runs the console until `q`: draws into `terminal`, polls the nodes in `settings`.
pub async fn run(terminal: &mut DefaultTerminal, settings: Settings) -> Result<(), AppError> {
    let clients: Vec<Arc<AdminClient>> = settings
        .urls
        .iter()
        .map(|u| AdminClient::new(u, settings.token.clone(), settings.timeout).map(Arc::new))
        .collect::<Result<_, _>>()?;
    let mut state = AppState::new(
        clients.iter().map(|c| c.base_url().to_owned()),
        Instant::now(),
    );
    state.profile_settings.dir = settings.profile_dir.clone();
    if settings.token.is_none() {
        state.error("no admin token: pass --token, --token-file or set IM_ADMIN_TOKEN");
    }

    let (tx, mut rx) = mpsc::channel::<Msg>(1024);
    let mut tasks = JoinSet::new();
    let mut plans = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let (ptx, prx) = watch::channel(state.plan(i));
        plans.push(ptx);
        let poller = Poller {
            node: i,
            client: c.clone(),
            tx: tx.clone(),
            plan: prx,
            every: settings.interval,
        };
        tasks.spawn(poller.clone().overview());
        tasks.spawn(poller.view());
    }

    let mut tail_task: Option<AbortHandle> = None;
    let mut events = EventStream::new();
    let mut redraw = tokio::time::interval(REDRAW);
    redraw.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        terminal.draw(|f| view::render(f, &state))?;
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(Event::Key(key))) if key.kind != KeyEventKind::Release => {
                    state.tick(Instant::now());
                    if let Some(action) = input::map_key(key, &state.mode) {
                        for cmd in state.apply(action) {
                            match cmd {
                                Command::StartTail { node, uid, generation } => {
                                    if let Some(t) = tail_task.take() {
                                        t.abort();
                                    }
                                    if let Some(c) = clients.get(node).cloned() {
                                        tail_task = Some(tasks.spawn(tail_loop(
                                            node,
                                            c,
                                            uid,
                                            generation,
                                            tx.clone(),
                                        )));
                                    }
                                }
                                Command::StopTail => {
                                    if let Some(t) = tail_task.take() {
                                        t.abort();
                                    }
                                }
                                cmd => run_command(cmd, &clients, &state, &tx, &mut tasks),
                            }
                        }
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => state.error(format!("terminal input: {e}")),
                None => break,
            },
            Some((node, update)) = rx.recv() => state.on_update(node, update, Instant::now()),
            _ = redraw.tick() => state.tick(Instant::now()),
        }
        if state.quit {
            break;
        }
        for (i, p) in plans.iter().enumerate() {
            let want = state.plan(i);
            p.send_if_modified(|cur| {
                if *cur == want {
                    false
                } else {
                    *cur = want;
                    true
                }
            });
        }
        // Reap finished one-off tasks so the set does not grow.
        while tasks.try_join_next().is_some() {}
    }
    tasks.abort_all();
    Ok(())
}

/// The interval of a poller: a tick every `every`, missed ones skipped.
fn poll_interval(every: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    tick
}

/// Waits for a poller's next turn: its tick, or a change of plan (`r`, another view).
/// False once the app has gone (the plan's sender dropped).
async fn next_poll(tick: &mut tokio::time::Interval, plan: &mut watch::Receiver<Plan>) -> bool {
    tokio::select! {
        _ = tick.tick() => true,
        changed = plan.changed() => changed.is_ok(),
    }
}

/// One node's poller: the plan says what to poll, answers go out on `tx` tagged with
/// the node's index.
#[derive(Clone)]
struct Poller {
    node: usize,
    client: Arc<AdminClient>,
    tx: mpsc::Sender<Msg>,
    plan: watch::Receiver<Plan>,
    every: Duration,
}

impl Poller {
    /// Polls the overview every interval (and at once when the plan changes, e.g. `r`).
    async fn overview(mut self) {
        let mut tick = poll_interval(self.every);
        while next_poll(&mut tick, &mut self.plan).await {
            let r = self.client.overview().await.map(Box::new);
            if !self.send(vec![Update::Overview(r)]).await {
                return;
            }
        }
    }

    /// Polls what the shown view needs for this node (nothing when another node is shown).
    async fn view(mut self) {
        let mut tick = poll_interval(self.every);
        while next_poll(&mut tick, &mut self.plan).await {
            let p = self.plan.borrow_and_update().clone();
            let updates = view_updates(&self.client, &p).await;
            if !self.send(updates).await {
                return;
            }
        }
    }

    /// Hands the answers to the app; false once it has gone.
    async fn send(&self, updates: Vec<Update>) -> bool {
        for u in updates {
            if self.tx.send((self.node, u)).await.is_err() {
                return false;
            }
        }
        true
    }
}

/// The answers the plan `p` asks of one node for the shown view.
async fn view_updates(client: &AdminClient, p: &Plan) -> Vec<Update> {
    let mut updates = Vec::new();
    if let Some(sort) = &p.connections {
        updates.push(Update::Connections(
            client.connections(sort, CONNECTIONS_LIMIT).await,
        ));
    }
    if p.slow {
        updates.push(Update::Slow(client.slow_consumers().await));
    }
    if p.memory {
        let (m, q) = tokio::join!(
            client.memory(),
            client.connections("queued", TOP_QUEUED_LIMIT)
        );
        updates.push(Update::Memory(m));
        updates.push(Update::TopQueued(q));
    }
    if p.logs {
        let (f, l) = tokio::join!(client.log_filters(), client.logs());
        updates.push(Update::LogFilters(f));
        updates.push(Update::Logs(l));
    }
    if p.webhooks {
        let (w, parked) = tokio::join!(client.webhooks(), client.webhooks_parked("", PARKED_LIMIT));
        updates.push(Update::Webhooks(w));
        updates.push(Update::Parked(parked));
    }
    if let Some(uid) = &p.user {
        let result = client.user(uid, USER_BACKLOG, USER_MESSAGES).await;
        updates.push(Update::User {
            uid: uid.clone(),
            result,
        });
    }
    updates
}

/// Starts the task for one command; its result comes back on `tx`.
fn run_command(
    cmd: Command,
    clients: &[Arc<AdminClient>],
    state: &AppState,
    tx: &mpsc::Sender<Msg>,
    tasks: &mut JoinSet<()>,
) {
    let node = match &cmd {
        Command::Kick { node, .. }
        | Command::Revoke { node, .. }
        | Command::SetLogFilter { node, .. }
        | Command::DeleteLogFilter { node, .. }
        | Command::SetGlobalLevel { node, .. }
        | Command::Profile { node, .. }
        | Command::HeapProfile { node, .. }
        | Command::Announce { node, .. }
        | Command::FetchTrace { node, .. }
        | Command::TestFire { node, .. }
        | Command::Redeliver { node, .. } => *node,
        // The plan's generation changed; the pollers wake on their own.
        Command::Refresh => return,
        // The loop runs the tail itself.
        Command::StartTail { .. } | Command::StopTail => return,
    };
    let Some(client) = clients.get(node).cloned() else {
        return;
    };
    let node_name = state
        .nodes
        .get(node)
        .map_or_else(|| "node".to_owned(), |n| n.name().to_owned());
    let tx = tx.clone();
    tasks.spawn(async move {
        let update = match cmd {
            Command::Kick { conn_id, .. } => Update::Kicked {
                conn_id,
                result: client.kick(conn_id).await,
            },
            Command::Revoke { user, .. } => Update::Revoked {
                result: client.revoke(&user).await,
                user,
            },
            Command::SetLogFilter {
                uid,
                level,
                ttl_secs,
                ..
            } => {
                let result = client
                    .set_log_filter(&uid, &level, ttl_secs)
                    .await
                    .map(drop);
                Update::FilterSet {
                    uid,
                    level,
                    ttl_secs,
                    result,
                }
            }
            Command::DeleteLogFilter { uid, .. } => {
                let result = client.delete_log_filter(&uid).await.map(drop);
                Update::FilterDeleted { uid, result }
            }
            Command::SetGlobalLevel { level, .. } => Update::GlobalLevelSet(
                client
                    .set_global_level(&level)
                    .await
                    .map(|g| g.global_level),
            ),
            Command::Profile {
                seconds,
                frequency,
                dir,
                ..
            } => Update::Profile(match client.profile(seconds, frequency).await {
                Ok(bundle) => {
                    save_in_background("profile", move |unix| {
                        save::save_result(&dir, &node_name, bundle, unix)
                    })
                    .await
                }
                Err(e) => Err(e),
            }),
            Command::HeapProfile { seconds, dir, .. } => {
                Update::HeapProfile(match client.heap_profile(seconds).await {
                    Ok(bundle) => {
                        save_in_background("heap profile", move |unix| {
                            save::save_heap_result(&dir, &node_name, bundle, unix)
                        })
                        .await
                    }
                    Err(e) => Err(e),
                })
            }
            Command::Announce { group_id, text, .. } => {
                let body = PostMessage {
                    group_id: Some(group_id.clone()),
                    kind: MessageKind::System,
                    payload: Some(text),
                    ..PostMessage::default()
                };
                let key = announce_key();
                let result = client.post_message(&body, Some(&key)).await;
                Update::Announced { group_id, result }
            }
            Command::FetchTrace { msg_id, .. } => Update::Trace {
                result: client.message_trace(&msg_id).await,
                msg_id,
            },
            Command::TestFire { name, .. } => Update::TestFired {
                result: client.webhook_test(&name).await,
                name,
            },
            Command::Redeliver { name, .. } => {
                let body = crate::api::Redeliver {
                    endpoint: name.clone(),
                    ids: Vec::new(),
                };
                Update::Redelivered {
                    result: client.webhooks_redeliver(&body).await,
                    name,
                }
            }
            Command::Refresh | Command::StartTail { .. } | Command::StopTail => return,
        };
        let _ = tx.send((node, update)).await;
    });
}

/// Runs one live tail: opens it, hands its lines to the loop in small batches, reports
/// how it ended. Aborted when the operator stops it or opens another.
async fn tail_loop(
    node: usize,
    client: Arc<AdminClient>,
    uid: String,
    generation: u64,
    tx: mpsc::Sender<Msg>,
) {
    let result = match client.log_tail(&uid, None, TAIL_BACKLOG).await {
        Ok(tail) => pump_tail(node, tail, generation, &tx).await,
        Err(e) => Err(e),
    };
    let _ = tx
        .send((node, Update::TailEnded { generation, result }))
        .await;
}

/// Reads `tail` until it ends, sending its lines as [`Update::TailLines`] batches.
async fn pump_tail(
    node: usize,
    mut tail: LogTail,
    generation: u64,
    tx: &mpsc::Sender<Msg>,
) -> Result<(), ApiError> {
    let mut batch = Vec::new();
    let mut until: Option<tokio::time::Instant> = None;
    loop {
        let next = match until {
            None => Some(tail.next_line().await),
            Some(t) => tokio::time::timeout_at(t, tail.next_line()).await.ok(),
        };
        let end = match next {
            Some(Ok(Some(line))) => {
                batch.push(line);
                until.get_or_insert_with(|| tokio::time::Instant::now() + TAIL_BATCH_WAIT);
                if batch.len() < TAIL_BATCH_LINES {
                    continue;
                }
                None
            }
            Some(Ok(None)) => Some(Ok(())),
            Some(Err(e)) => Some(Err(e)),
            // The batch's time is up.
            None => None,
        };
        until = None;
        if !batch.is_empty() {
            let lines = std::mem::take(&mut batch);
            if tx
                .send((node, Update::TailLines { generation, lines }))
                .await
                .is_err()
            {
                return Ok(());
            }
        }
        if let Some(r) = end {
            return r;
        }
    }
}

/// A fresh Idempotency-Key for one announcement: the process id, the wall clock in
/// nanoseconds and a counter, so two submits never share one.
fn announce_key() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("im-console-{}-{nanos}-{n}", std::process::id())
}

/// Runs a profile's `save` (given the time now, in Unix seconds) off the runtime's
/// threads; a save that panicked is an error naming `what`.
async fn save_in_background<R: Send + 'static>(
    what: &str,
    save: impl FnOnce(u64) -> R + Send + 'static,
) -> Result<R, ApiError> {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    tokio::task::spawn_blocking(move || save(unix))
        .await
        .map_err(|e| ApiError::Decode {
            path: what.into(),
            reason: format!("saving failed: {e}"),
        })
}
