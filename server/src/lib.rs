//! im-server: an observability-first IM server (WebSocket + protobuf).
//!
//! The message path, one module per stage or concern, in the order a message takes:
//! `gateway` (accept, read and write loops) -> `pipeline` (per-frame checks and
//! handlers) -> `persist` (the writer: commit, then ack) -> `route` (fan-out, presence,
//! receipts) -> `flow` (outbound queues) -> back out through `gateway`. `store` holds durable state, `obs` the metrics,
//! `admin` the admin API, `config` the typed config and `auth` tokens and secrets;
//! `cluster` links the node to the others and `route_api` answers `GET /v1/route`.
//! [`Node::start`] wires them together. Which module may call which is in
//! ARCHITECTURE.md, checked by `tests/modules.rs`.

pub mod admin;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod flow;
pub mod gateway;
pub mod hooks;
pub mod listen;
pub mod obs;
pub mod persist;
pub mod pipeline;
pub mod region;
pub mod region_fence;
pub mod region_home;
pub mod region_list;
pub mod region_repl;
pub mod region_serve;
pub mod reload;
pub mod route;
pub mod route_api;
pub mod store;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use auth::Secrets;
use config::Config;
use gateway::{Connections, Gateway};
use obs::Metrics;
use pipeline::Pipeline;
use store::membership::Relations;
use store::Store;

/// One running node: every long-lived part, owned here and shared by reference.
pub struct Node {
    /// This node's id.
    pub node_id: String,
    /// The config it runs with.
    pub config: Config,
    /// Token keys and admin token.
    pub secrets: Secrets,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The stages after decode.
    pub pipeline: Arc<Pipeline>,
    /// Live connections.
    pub conns: Arc<Connections>,
    /// Metric handles.
    pub metrics: Metrics,
    /// Prometheus render handle.
    pub prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// When the node started.
    pub started: Instant,
    /// Set while shutting down.
    pub draining: Arc<AtomicBool>,
    /// Cluster mode (`nats_url` set): registry, presence, cross-node delivery.
    pub cluster: Option<Arc<cluster::Cluster>>,
    /// `limits.max_connections` resolved at start (0: no cap).
    pub max_connections: usize,
    /// Event webhooks (`None`: no endpoint configured).
    pub webhooks: Option<Arc<hooks::webhooks::Webhooks>>,
    snapshot: Arc<RwLock<obs::sampler::Snapshot>>,
    /// Where a reload reads the config again (`reload`): the binary's file and flags.
    config_source: std::sync::OnceLock<reload::ConfigSource>,
}

impl Node {
    /// The sampler's latest snapshot.
    pub fn snapshot(&self) -> obs::sampler::Snapshot {
        self.snapshot.read().map(|s| s.clone()).unwrap_or_default()
    }
}

/// What the sampler reads from a node.
struct LiveFigures {
    conns: Arc<Connections>,
    pipeline: Arc<Pipeline>,
    max_connections: u64,
    /// The SQLite database's directory and the free-space floor, in bytes.
    disk: Option<(std::path::PathBuf, u64)>,
}

impl obs::sampler::Live for LiveFigures {
    fn connections(&self) -> u64 {
        self.conns.len() as u64
    }
    fn users_online(&self) -> u64 {
        self.pipeline.router.users_online() as u64
    }
    fn outbound(&self) -> (u64, u64) {
        self.conns
            .snapshot()
            .iter()
            .fold((0, 0), |(slow, bytes), o| {
                (
                    slow + u64::from(o.state() == flow::ConnState::Slow),
                    bytes + o.queued_bytes() as u64,
                )
            })
    }
    fn persist_queue(&self) -> (u64, u64) {
        (
            self.pipeline.persist.depth() as u64,
            self.pipeline.persist.capacity() as u64,
        )
    }
    fn max_connections(&self) -> u64 {
        self.max_connections
    }
    fn disk(&self) -> Option<obs::capacity::Disk> {
        let (dir, floor_bytes) = self.disk.as_ref()?;
        let (free_bytes, total_bytes) = obs::process::disk_space(dir)?;
        let disk = obs::capacity::Disk {
            free_bytes,
            total_bytes,
            floor_bytes: *floor_bytes,
        };
        let low = disk.low();
        if self.pipeline.health.set_disk_low(low) != low {
            if low {
                tracing::error!(
                    free_bytes,
                    floor_bytes,
                    dir = %dir.display(),
                    "free space under store.min_free_disk_mb: sends refused until space is freed"
                );
            } else {
                tracing::warn!(
                    free_bytes,
                    "free space above the floor again; sends accepted"
                );
            }
        }
        Some(disk)
    }
}

/// A node built by [`Node::build`]: store open, cluster connected, pipeline running,
/// both listeners bound; nothing served yet. [`Built::serve`] starts the rest.
pub struct Built {
    /// The node.
    pub node: Arc<Node>,
    /// Bound client listener.
    pub client_addr: SocketAddr,
    /// Bound admin listener.
    pub admin_addr: SocketAddr,
    gateway: Arc<Gateway>,
    writer: JoinHandle<()>,
    relations: Arc<Relations>,
    group_rx: mpsc::UnboundedReceiver<(String, u64)>,
    sampler: obs::sampler::Sampler,
    client: TcpListener,
    admin: TcpListener,
    client_tls: Option<Arc<listen::TlsListener>>,
    admin_tls: Option<Arc<listen::TlsListener>>,
    ws_url: String,
}

/// A started node with its bound addresses.
pub struct Running {
    /// The node.
    pub node: Arc<Node>,
    /// Bound client listener.
    pub client_addr: SocketAddr,
    /// Bound admin listener.
    pub admin_addr: SocketAddr,
    gateway: Arc<Gateway>,
    writer: JoinHandle<()>,
    /// Stops both accept loops ([`listen::Stop`]).
    stop: tokio::sync::watch::Sender<bool>,
    /// The client and admin accept loops; each ends after `stop`.
    listeners: Vec<JoinHandle<()>>,
    /// Loops with no end of their own (sampler, log housekeeping, cluster tasks,
    /// revocation re-reads): aborted at the end of the drain.
    background: Vec<JoinHandle<()>>,
    compactor: Option<obs::compactor::CompactorHandle>,
    report: cluster::ReportFn,
}

/// Longest wait, after the drain, for the HTTP requests still in flight on the
/// listeners (at least a tenth of a second, at most what the drain deadline leaves).
const LISTENER_GRACE: Duration = Duration::from_secs(1);

impl Node {
    /// Builds and starts a node: [`Node::build`], then [`Built::serve`].
    pub async fn start(config: Config) -> anyhow::Result<Running> {
        Self::build(config).await?.serve().await
    }

    /// Builds every part: opens the store, connects the cluster, spawns the writer and
    /// router, binds both listeners; serves nothing yet.
    pub async fn build(config: Config) -> anyhow::Result<Built> {
        let prometheus = obs::install_recorder();
        let metrics = Metrics::new(config.obs.probes);
        obs::runtime::set_task_monitors(config.obs.task_monitors);
        let secrets = Secrets::load(&config).context("loading secrets")?;
        let store = store::open(&config)
            .await
            .with_context(|| store_named(&config))?;
        let node_id = if config.node_id.is_empty() {
            default_node_id()
        } else {
            config.node_id.clone()
        };
        let webhooks = hooks::webhooks::Webhooks::new(&config, &node_id, store.clone())
            .context("starting the webhooks")?;
        metrics.tracer.configure(
            &node_id,
            config.obs.trace_sample_rate,
            config.obs.trace_max_recipients as usize,
            config.obs.trace_store_size as usize,
        );

        let cluster = if config.clustered() {
            Some(Arc::new(
                cluster::Cluster::connect(&config, &node_id)
                    .await
                    .context("starting cluster mode")?,
            ))
        } else {
            None
        };
        for (user, at) in store
            .revocations()
            .await
            .context("reading token revocations")?
        {
            secrets.keys.revocations.revoke(&user, at);
        }
        let relations = Arc::new(Relations::with_limits(
            store.clone(),
            config.cluster.membership_cache_groups as usize,
            cluster
                .is_some()
                .then(|| Duration::from_millis(config.cluster.membership_ttl_ms as u64)),
        ));
        let (group_tx, group_rx) = mpsc::unbounded_channel();
        if cluster.is_some() {
            relations.notify_changes(group_tx);
        }
        let before_send = hooks::before_send::BeforeSend::from_config(
            &config.hooks.before_send,
            config.limits.max_frame_bytes as usize,
        )?;
        let (pipeline, writer) = Pipeline::spawn_with(
            store.clone(),
            relations.clone(),
            cluster
                .as_ref()
                .map(|c| c.link.clone() as Arc<dyn route::Peers>),
            before_send,
            &config,
            metrics.clone(),
        );
        let conns = Arc::new(Connections::default());
        let max_connections = config.limits.max_connections_resolved();
        let draining = Arc::new(AtomicBool::new(false));
        let snapshot = Arc::new(RwLock::new(obs::sampler::Snapshot::default()));
        let sampler = obs::sampler::Sampler::new(
            metrics.clone(),
            Arc::new(LiveFigures {
                conns: conns.clone(),
                pipeline: pipeline.clone(),
                max_connections: max_connections as u64,
                disk: match config.database() {
                    Ok(config::Database::Sqlite(path)) => Some((
                        path.parent()
                            .filter(|d| !d.as_os_str().is_empty())
                            .unwrap_or(std::path::Path::new("."))
                            .to_path_buf(),
                        u64::from(config.store.min_free_disk_mb) << 20,
                    )),
                    _ => None,
                },
            }),
            snapshot.clone(),
            prometheus.clone(),
            config.obs.conn_bytes_estimate,
            config.obs.memory_limit_bytes,
        );
        let node = Arc::new(Node {
            node_id: node_id.clone(),
            config: config.clone(),
            secrets: secrets.clone(),
            store,
            pipeline: pipeline.clone(),
            conns: conns.clone(),
            metrics: metrics.clone(),
            prometheus,
            started: Instant::now(),
            draining: draining.clone(),
            cluster: cluster.clone(),
            max_connections,
            webhooks,
            snapshot,
            config_source: std::sync::OnceLock::new(),
        });
        let gateway = Gateway::new(
            pipeline,
            secrets.keys.clone(),
            config.limits.clone(),
            config.flow.clone(),
            node_id,
            conns,
            metrics,
            draining,
        );

        let Listeners {
            client,
            admin,
            client_addr,
            admin_addr,
            client_tls,
            admin_tls,
            ws_url,
        } = Listeners::bind(&config, cluster.is_some()).await?;
        Ok(Built {
            node,
            client_addr,
            admin_addr,
            gateway,
            writer,
            relations,
            group_rx,
            sampler,
            client,
            admin,
            client_tls,
            admin_tls,
            ws_url,
        })
    }
}

/// Both listeners, bound (serving nothing yet), their TLS and the advertised client URL.
struct Listeners {
    client: TcpListener,
    admin: TcpListener,
    client_addr: SocketAddr,
    admin_addr: SocketAddr,
    client_tls: Option<Arc<listen::TlsListener>>,
    admin_tls: Option<Arc<listen::TlsListener>>,
    ws_url: String,
}

impl Listeners {
    /// Loads the TLS files, binds both listeners and works out the client URL the
    /// cluster advertises (`clustered`: warn when it would be a wildcard address).
    async fn bind(config: &Config, clustered: bool) -> anyhow::Result<Listeners> {
        let client_tls = listen::TlsListener::from_config(&config.tls, listen::Listener::Client)?;
        let admin_tls = listen::TlsListener::from_config(&config.tls, listen::Listener::Admin)?;
        let client = bind(config.listen_addr(), config.flow.listen_backlog)
            .with_context(|| format!("binding listen = {}", config.listen))?;
        let admin = TcpListener::bind(config.admin_addr())
            .await
            .with_context(|| format!("binding admin_listen = {}", config.admin_listen))?;
        let client_addr = client.local_addr()?;
        let admin_addr = admin.local_addr()?;
        warn_if_exposed(config, client_addr, admin_addr);
        let ws_url = if config.cluster.advertise_url.is_empty() {
            if client_addr.ip().is_unspecified() && clustered {
                tracing::warn!(
                    listen = %config.listen,
                    "cluster.advertise_url is empty and the client listener is on a wildcard address: other nodes will route clients to ws://{client_addr}/ws; set cluster.advertise_url"
                );
            }
            let scheme = if client_tls.is_some() { "wss" } else { "ws" };
            format!("{scheme}://{client_addr}/ws")
        } else {
            config.cluster.advertise_url.clone()
        };
        Ok(Listeners {
            client,
            admin,
            client_addr,
            admin_addr,
            client_tls,
            admin_tls,
            ws_url,
        })
    }
}

impl Built {
    /// Starts serving: the sampler and log housekeeping, the cluster tasks (cluster
    /// mode), then both listeners.
    pub async fn serve(self) -> anyhow::Result<Running> {
        let node = self.node;
        let config = &node.config;
        let mut background = vec![tokio::spawn(
            self.sampler
                .run(Duration::from_millis(config.obs.sample_interval_ms as u64)),
        )];
        let route_api = route_api::RouteApi {
            node_id: node.node_id.clone(),
            ws_url: self.ws_url.clone(),
            registry: node.cluster.as_ref().map(|c| c.link.registry.clone()),
            draining: node.draining.clone(),
            region: config.region.clone(),
            regions: config
                .regions
                .iter()
                .map(|r| im_admin_api::RouteRegion {
                    name: r.name.clone(),
                    route_url: r.route_url.clone(),
                })
                .collect(),
        };
        let client_app = self.gateway.router().merge(route_api::router(route_api));
        let admin_app = admin::router(node.clone());
        let opts = listen::SocketOpts {
            send_buffer: config.flow.socket_send_buffer_bytes as usize,
            recv_buffer: config.flow.socket_recv_buffer_bytes as usize,
        };
        let (log_tasks, compactor) = start_log_tasks(config, snapshot_of(&node));
        background.push(log_tasks);
        let admin_scheme = if self.admin_tls.is_some() {
            "https"
        } else {
            "http"
        };
        let admin_url = format!("{admin_scheme}://{}", self.admin_addr);
        let report = load_report(&node, self.ws_url, admin_url);
        if let Some(c) = &node.cluster {
            let tasks = c
                .start(
                    node.pipeline.router.clone(),
                    self.relations,
                    self.group_rx,
                    revoked_fn(&node),
                    report.clone(),
                )
                .await
                .context("starting cluster mode")?;
            background.extend(tasks);
            background.push(
                c.serve_queries(user_query_fn(&node))
                    .await
                    .context("starting cluster mode")?,
            );
            background.push(tokio::spawn(reload_revocations(
                node.store.clone(),
                node.secrets.keys.clone(),
            )));
            if let Some(map) = &node.pipeline.region {
                let client = c.link.nats_client();
                let _ = map.nats.set(client.clone());
                background.push(tokio::spawn(region_serve::run(
                    client.clone(),
                    map.clone(),
                    node.pipeline.clone(),
                    Arc::new(config.clone()),
                )));
                let repl = region_repl::Repl::new(
                    client,
                    map.clone(),
                    node.store.clone(),
                    node.pipeline.router.clone(),
                    node.pipeline.relations.clone(),
                    (config.cluster.prefix.clone(), node.metrics.clone()),
                    node.pipeline.receipts.clone(),
                );
                background.extend(repl.iter().flat_map(|r| r.spawn()));
                background.push(tokio::spawn(cluster::region_trace::serve(
                    c.link.clone(),
                    node.metrics.tracer.clone(),
                    map.local.clone(),
                )));
                let homes = region_home::HomeTasks {
                    map: map.clone(),
                    store: node.store.clone(),
                    pipeline: node.pipeline.clone(),
                    config: Arc::new(config.clone()),
                    prefix: config.cluster.prefix.clone(),
                    client: c.link.nats_client(),
                };
                background.extend(homes.spawn());
            }
        }
        let hangup = [&self.client_tls, &self.admin_tls];
        let hangup = hangup.into_iter().flatten().cloned().collect();
        background.push(tokio::spawn(listen::reload_on_hangup(hangup)));
        if let Some(w) = &node.webhooks {
            background.extend(start_webhooks(&node, w));
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let listeners = vec![
            tokio::spawn(listen::serve_client(
                self.client,
                client_app,
                self.gateway.clone(),
                config.http.clone(),
                opts,
                self.client_tls,
                stopped.clone(),
            )),
            tokio::spawn(listen::serve_admin(
                self.admin,
                admin_app,
                config.http.clone(),
                self.admin_tls,
                stopped,
            )),
        ];
        Ok(Running {
            node,
            client_addr: self.client_addr,
            admin_addr: self.admin_addr,
            gateway: self.gateway,
            writer: self.writer,
            stop,
            listeners,
            background,
            compactor,
            report,
        })
    }
}

/// Starts the webhooks' tasks: the presence check is the router's (this node and, in
/// cluster mode, the others), and the router tells them of first and last connections.
fn start_webhooks(node: &Arc<Node>, w: &Arc<hooks::webhooks::Webhooks>) -> Vec<JoinHandle<()>> {
    let router = node.pipeline.router.clone();
    let online: hooks::webhooks::OnlineFn = Arc::new(move |user: &str| router.devices(user) > 0);
    if w.wants("user.online") || w.wants("user.offline") {
        let hooks = w.clone();
        node.pipeline
            .router
            .set_presence_hook(Arc::new(move |user: &str, up: bool| {
                hooks.presence(user, up)
            }));
    }
    w.spawn(online)
}

/// Cluster mode: re-reads the stored revocations every few seconds, so a revocation made
/// on another node whose notice was lost is still refused at login here.
async fn reload_revocations(store: Arc<dyn Store>, keys: auth::TokenKeys) {
    let mut every = tokio::time::interval(Duration::from_secs(3));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match store.revocations().await {
            Ok(list) => {
                for (user, at) in list {
                    keys.revocations.revoke(&user, at);
                }
            }
            Err(e) => tracing::debug!(error = %e, "reading revocations failed"),
        }
    }
}

/// How this node answers another's per-user diagnosis query: its own part
/// (`admin::users::local_part`); empty once the node is gone.
fn user_query_fn(node: &Arc<Node>) -> cluster::query::AnswerFn {
    let weak = Arc::downgrade(node);
    Arc::new(move |uid: &str, messages: usize| match weak.upgrade() {
        Some(node) => admin::users::local_part(&node, uid, messages),
        None => im_admin_api::UserNode::default(),
    })
}

/// What a revocation notice from another node does here: record it, close the user's
/// sessions on this node.
fn revoked_fn(node: &Arc<Node>) -> cluster::RevokedFn {
    let keys = node.secrets.keys.clone();
    let conns = node.conns.clone();
    Arc::new(move |user: &str, at: i64| {
        keys.revocations.revoke(user, at);
        let closed = conns.close_user(
            user,
            flow::CloseReason::new(flow::CloseReason::TOKEN_EXPIRED, "token revoked"),
        );
        tracing::info!(user, closed, "token revocation from another node");
    })
}

impl Running {
    /// Graceful stop, in this order: refuse new connections (HTTP 503, `/readyz` 503, out
    /// of the cluster's rotation); stop reading client frames; commit everything the
    /// persistence queue holds, so each of those sends is acked; flush every outbound
    /// queue and close each connection with 1001 "server shutting down" (clients
    /// reconnect elsewhere and sync); wait for the connections to end. Everything is
    /// bounded by `deadline`; what is acked is committed whatever happens to the rest.
    pub async fn shutdown(self, deadline: Duration) -> ShutdownReport {
        let node = self.node;
        let end = Instant::now() + deadline;
        let started = Instant::now();
        node.draining.store(true, Ordering::Relaxed);
        let connections = node.conns.len();
        tracing::info!(
            connections,
            queued = node.pipeline.persist.depth(),
            deadline_ms = deadline.as_millis() as u64,
            "draining"
        );
        if let Some(c) = &node.cluster {
            // Out of rotation at once; other nodes stop routing new clients here.
            let _ =
                tokio::time::timeout(Duration::from_secs(1), c.report_now(&(self.report)())).await;
        }
        let end_at = tokio::time::Instant::from_std(end);
        // No new frames: a frame being handled finishes, then its read loop stops.
        self.gateway.set_drain(gateway::Drain::StopReading);
        let _ = tokio::time::timeout_at(end_at, self.gateway.readers_stopped()).await;
        // The open batch and everything queued behind it: committed, acks queued.
        let committed = tokio::time::timeout(
            end.saturating_duration_since(Instant::now()),
            node.pipeline.persist.flush(),
        )
        .await
        .is_ok();
        // Every connection waits in its drain for this phase: it writes what is queued
        // (acks among it), then closes 1001.
        self.gateway.set_drain(gateway::Drain::Close);
        let _ = tokio::time::timeout_at(end_at, node.conns.until_empty()).await;
        let left_open = node.conns.len();
        // The listeners stop the way axum's `with_graceful_shutdown` does: no more
        // accepts, requests in flight answered, connections closed (see `listen::Stop`).
        let _ = self.stop.send(true);
        let grace = end
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(100), LISTENER_GRACE);
        let grace_end = tokio::time::Instant::now() + grace;
        for mut l in self.listeners {
            if tokio::time::timeout_at(grace_end, &mut l).await.is_err() {
                // A request still running (e.g. a long CPU profile): cut, with its
                // connection (the loop's `JoinSet` aborts them when dropped).
                l.abort();
            }
        }
        for t in &self.background {
            t.abort();
        }
        if let Some(c) = self.compactor {
            tokio::task::spawn_blocking(move || c.stop());
        }
        if let Some(c) = &node.cluster {
            let left = end.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
            let _ = tokio::time::timeout(left, c.leave()).await;
        }
        drop(self.writer);
        ShutdownReport {
            connections,
            committed,
            left_open,
            took: started.elapsed(),
        }
    }
}

/// What a graceful shutdown did.
#[derive(Debug, Clone)]
pub struct ShutdownReport {
    /// Connections open when it began.
    pub connections: usize,
    /// Whether everything queued for persistence was committed before the deadline.
    pub committed: bool,
    /// Connections still open at the deadline (closed by the exit).
    pub left_open: usize,
    /// How long it took.
    pub took: Duration,
}

/// This node's load report for the cluster registry, built from the sampler's snapshot.
fn load_report(node: &Arc<Node>, ws_url: String, admin_url: String) -> cluster::ReportFn {
    let node = node.clone();
    let instance = uuid::Uuid::now_v7().simple().to_string();
    Arc::new(move || {
        let s = node.snapshot();
        cluster::registry::LoadReport {
            node_id: node.node_id.clone(),
            ws_url: ws_url.clone(),
            admin_url: admin_url.clone(),
            connections: node.conns.len() as u64,
            users_online: node.pipeline.router.users_online() as u64,
            msg_rate_in: s.msg_rate_in,
            msg_rate_out: s.msg_rate_out,
            rss_bytes: s.process.rss_bytes,
            cpu_busy: s.cpu_busy,
            headroom_connections: s.capacity.headroom_connections,
            limiting_resource: s.capacity.limiting_resource.to_string(),
            draining: node.draining.load(Ordering::Relaxed),
            uptime_secs: node.started.elapsed().as_secs(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            instance: instance.clone(),
        }
    })
}

fn snapshot_of(node: &Node) -> Arc<RwLock<obs::sampler::Snapshot>> {
    node.snapshot.clone()
}

/// Log housekeeping when this process's logging is managed (`obs::logfiles::init`):
/// a task that expires per-uid filters and exports the writer's dropped lines, and the
/// off-peak compactor thread, which reads the node's message rate from the snapshot.
fn start_log_tasks(
    config: &Config,
    snapshot: Arc<RwLock<obs::sampler::Snapshot>>,
) -> (JoinHandle<()>, Option<obs::compactor::CompactorHandle>) {
    let Some(logs) = obs::logfiles::control() else {
        return (tokio::spawn(async {}), None);
    };
    let dropped = metrics::counter!("im_log_lines_dropped_total");
    dropped.absolute(0);
    let housekeeping = {
        let logs = logs.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                logs.filters.sweep();
                dropped.absolute(logs.dropped_lines());
            }
        })
    };
    let compactor = logs.dir.clone().and_then(|dir| {
        let lc = &config.log;
        let cfg = obs::compactor::CompactorConfig {
            dir,
            prefix: logs.prefix.clone(),
            window: logs.window,
            retention: Duration::from_secs(lc.retention_hours as u64 * 3600),
            idle_msgs_per_sec: lc.idle_msgs_per_sec,
            idle_for: Duration::from_secs(lc.idle_minutes as u64 * 60),
            zstd_level: lc.zstd_level,
            cpu_share: lc.compress_cpu_share,
        };
        let rate = Box::new(move || {
            snapshot
                .read()
                .map(|s| s.msg_rate_in + s.msg_rate_out)
                .unwrap_or(f64::MAX)
        });
        let c = obs::compactor::Compactor::new(
            cfg,
            obs::compactor::SystemClock,
            rate,
            logs.stats.clone(),
        );
        match obs::compactor::spawn(c, Duration::from_secs(lc.compact_interval_secs as u64)) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "log compactor not started");
                None
            }
        }
    });
    (housekeeping, compactor)
}

/// Start-up warnings for listeners reachable from other hosts with no TLS (native,
/// `[tls]`, or in front: `behind_tls` says there is): the admin token and client tokens would cross the
/// network in clear.
fn warn_if_exposed(config: &Config, client: SocketAddr, admin: SocketAddr) {
    if config.behind_tls {
        return;
    }
    if !admin.ip().is_loopback() && !config.tls.admin_on() {
        tracing::warn!(
            admin_listen = %admin,
            "the admin listener is reachable from other hosts over plain HTTP: the admin token crosses the network in clear; bind it to loopback, or put TLS in front and set behind_tls = true"
        );
    }
    if !client.ip().is_loopback() && !config.tls.client_on() {
        tracing::warn!(
            listen = %client,
            "the client listener is reachable from other hosts over plain ws://: client tokens cross the network in clear; put TLS (wss://) in front and set behind_tls = true"
        );
    }
}

/// Binds a listener with an explicit accept backlog (std's default is 128, too small for a
/// reconnect storm; the kernel caps it at `net.core.somaxconn`).
fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// "opening the store (`database_url` = ...)", the URL's password hidden, or the SQLite
/// file an empty `database_url` means: what start-up failed on, named as the config names it.
fn store_named(config: &Config) -> String {
    if config.database_url.trim().is_empty() {
        format!(
            "opening the store (`database_url` empty: SQLite at {})",
            config.data_dir.join("im.db").display()
        )
    } else {
        format!(
            "opening the store (`database_url` = {})",
            config::redact_url(config.database_url.trim())
        )
    }
}

fn default_node_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| im_proto::valid_id(h))
        .unwrap_or_else(|| "node".to_owned());
    host
}
