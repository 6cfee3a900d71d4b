//! Cluster helpers: several real `im-server` processes sharing the local Postgres (a
//! fresh schema per cluster, `IM_TEST_DATABASE_URL`) and the local NATS (a fresh subject
//! and bucket prefix per cluster, `IM_TEST_NATS_URL`, default `nats://127.0.0.1:4222`,
//! or a test's own [`super::nats::PrivateNats`] when the test breaks NATS).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use im_client::proto::ChatMessage;
use im_client::{Client, ClientConfig, Event};

use super::{TestServer, WAIT};

/// The Postgres the cluster tests use.
pub fn pg_url() -> String {
    std::env::var("IM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The NATS (with JetStream) the cluster tests use.
pub fn nats_url() -> String {
    std::env::var("IM_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// Nodes `n0`, `n1`, ... of one cluster.
pub struct TestCluster {
    /// The nodes, by index (a killed node stays in place, dead).
    pub nodes: Vec<TestServer>,
    /// The Postgres schema of this cluster.
    pub schema: String,
    /// The NATS prefix of this cluster.
    pub prefix: String,
    /// Registry TTL given to the nodes.
    pub ttl: Duration,
    /// Report interval given to the nodes.
    pub report_interval: Duration,
    /// The NATS the nodes use.
    pub nats: String,
}

impl TestCluster {
    /// Starts `n` nodes (registry TTL 3 s, reports every 300 ms; `IM_TEST_CLUSTER_TTL_SECS`
    /// and `IM_TEST_CLUSTER_REPORT_MS` change them for measurements) and waits until
    /// every node sees all of them healthy.
    pub async fn start(n: usize, extra: &[(&str, &str)]) -> TestCluster {
        Self::start_on(n, &nats_url(), extra).await
    }

    /// As [`TestCluster::start`], on the NATS at `nats`.
    pub async fn start_on(n: usize, nats: &str, extra: &[(&str, &str)]) -> TestCluster {
        Self::start_configured(n, nats, extra, None).await
    }

    /// As [`TestCluster::start`], every node also reading the TOML config `config` (for
    /// what env variables cannot say, e.g. webhook endpoints).
    pub async fn start_with_config(n: usize, config: &str, extra: &[(&str, &str)]) -> TestCluster {
        Self::start_configured(n, &nats_url(), extra, Some(config)).await
    }

    async fn start_configured(
        n: usize,
        nats: &str,
        extra: &[(&str, &str)],
        config: Option<&str>,
    ) -> TestCluster {
        let id = uuid::Uuid::now_v7().simple().to_string().to_lowercase();
        let schema = format!("t_{id}");
        let prefix = format!("t{id}");
        let admin = sqlx::PgPool::connect(&pg_url())
            .await
            .unwrap_or_else(|e| panic!("Postgres at {} is required: {e}", pg_url()));
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&admin)
            .await
            .expect("create schema");
        admin.close().await;
        sweep_stale_buckets(nats).await;
        let db = format!("{}?options[search_path]={schema}", pg_url());
        let ttl = Duration::from_secs(super::env_u64("IM_TEST_CLUSTER_TTL_SECS", 3));
        let ttl_s = ttl.as_secs().to_string();
        let report_interval =
            Duration::from_millis(super::env_u64("IM_TEST_CLUSTER_REPORT_MS", 300));
        let interval_ms = report_interval.as_millis().to_string();
        let mut nodes = Vec::new();
        for i in 0..n {
            let node_id = format!("n{i}");
            let mut env: Vec<(&str, &str)> = vec![
                ("IM_DATABASE_URL", &db),
                ("IM_NATS_URL", nats),
                ("IM_NODE_ID", &node_id),
                ("IM_CLUSTER_PREFIX", &prefix),
                ("IM_CLUSTER_TTL_SECS", &ttl_s),
                ("IM_CLUSTER_REPORT_INTERVAL_MS", &interval_ms),
                ("IM_OBS_SAMPLE_INTERVAL_MS", "200"),
            ];
            env.extend_from_slice(extra);
            nodes.push(match config {
                Some(toml) => TestServer::start_with_config(toml, &env),
                None => TestServer::start_with(&env),
            });
        }
        let c = TestCluster {
            nodes,
            schema,
            prefix,
            ttl,
            report_interval,
            nats: nats.to_owned(),
        };
        for i in 0..n {
            c.wait_for(i, &format!("node {i} to see {n} healthy nodes"), |o| {
                o["cluster"]["summary"]["healthy"] == n
            })
            .await;
        }
        c
    }

    /// Node `i`'s admin overview.
    pub fn overview(&self, i: usize) -> serde_json::Value {
        let (status, body) = self.nodes[i].admin_get("/admin/v1/overview");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("overview JSON")
    }

    /// Waits until node `i`'s overview satisfies `f`.
    pub async fn wait_for(&self, i: usize, what: &str, f: impl Fn(&serde_json::Value) -> bool) {
        let end = Instant::now() + WAIT;
        loop {
            let o = self.overview(i);
            if f(&o) {
                return;
            }
            if Instant::now() > end {
                panic!(
                    "timed out waiting for {what}; overview cluster: {}",
                    o["cluster"]
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every node in `live` knows the users on the other nodes: `total_users`
    /// less its own (online users are distinct per node in these tests).
    pub async fn wait_presence(&self, live: &[usize], total_users: u64) {
        for &i in live {
            self.wait_for(i, &format!("node {i} to see the other nodes' users"), |o| {
                let mine = o["users_online"].as_u64().unwrap_or(0);
                mine > 0 && o["cluster"]["users_on_other_nodes"] == total_users - mine
            })
            .await;
        }
    }

    /// `http://` base URLs of every node's client listener (route seeds).
    pub fn route_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("http://{}", n.client_addr))
            .collect()
    }

    /// An SDK client for `user` that connects through `/v1/route` (seeds: every node).
    pub async fn routed_client(&self, user: &str) -> Client {
        let mut cfg = ClientConfig::new("", self.nodes[0].token(user));
        cfg.route_urls = self.route_urls();
        cfg.reconnect_max = Duration::from_millis(500);
        Client::connect(cfg).await.expect("routed client connect")
    }

    /// Which node (index) serves `node_id`.
    pub fn index_of(&self, node_id: &str) -> usize {
        node_id
            .strip_prefix('n')
            .and_then(|i| i.parse().ok())
            .expect("node id n<i>")
    }

    /// `GET /readyz` of node `i`: (status, body).
    pub fn readyz(&self, i: usize) -> (u16, String) {
        super::http(self.nodes[i].admin_addr, "GET", "/readyz", None)
    }

    /// `GET /v1/route?avoid=<avoid>` on node `i`: the node id it offers (`None`: 503,
    /// none can take a connection).
    pub fn route(&self, i: usize, avoid: &str) -> Option<String> {
        let path = format!("/v1/route?avoid={avoid}");
        let (status, body) = super::http(self.nodes[i].client_addr, "GET", &path, None);
        if status == 503 {
            return None;
        }
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("route JSON");
        v["node_id"].as_str().map(str::to_owned)
    }

    /// Every stored message of this cluster: (conversation, seq, msg_id), by
    /// conversation and seq.
    pub async fn stored(&self) -> Vec<(String, i64, String)> {
        let admin = sqlx::PgPool::connect(&pg_url()).await.expect("pg");
        let rows = sqlx::query_as(&format!(
            "SELECT conversation_id, seq, msg_id FROM {}.messages ORDER BY conversation_id, seq",
            self.schema
        ))
        .fetch_all(&admin)
        .await
        .expect("query");
        admin.close().await;
        rows
    }

    /// Checks the store against `acked` (conversation, seq, msg_id as the SendAcks said):
    /// no message is stored twice, each acked one is stored at its acked seq, and every
    /// conversation's seqs run from 1 without a gap. Returns the stored row count.
    pub async fn check_stored(&self, acked: &[(String, u64, String)]) -> usize {
        let rows = self.stored().await;
        let mut at: HashMap<&str, (&str, i64)> = HashMap::new();
        let mut per_conv: HashMap<&str, Vec<i64>> = HashMap::new();
        for (conv, seq, id) in &rows {
            assert!(at.insert(id, (conv, *seq)).is_none(), "{id} stored twice");
            per_conv.entry(conv).or_default().push(*seq);
        }
        for (conv, seqs) in &per_conv {
            let want: Vec<i64> = (1..=seqs.len() as i64).collect();
            assert_eq!(seqs, &want, "{conv} has gaps or repeats");
        }
        for (conv, seq, id) in acked {
            assert_eq!(
                at.get(id.as_str()).copied(),
                Some((conv.as_str(), *seq as i64)),
                "acked {id} ({conv} seq {seq}) is not stored there"
            );
        }
        rows.len()
    }

    /// Stops the nodes, drops the schema and deletes the buckets.
    pub async fn cleanup(mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
        if let Ok(admin) = sqlx::PgPool::connect(&pg_url()).await {
            let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
                .execute(&admin)
                .await;
        }
        if let Ok(nc) = async_nats::connect(&self.nats).await {
            let js = async_nats::jetstream::new(nc);
            for b in ["nodes", "presence"] {
                let _ = js.delete_key_value(format!("{}-{b}", self.prefix)).await;
            }
        }
    }
}

/// Deletes KV buckets of test clusters more than an hour old (left by a failed run; their
/// uuid v7 names carry the creation time).
async fn sweep_stale_buckets(url: &str) {
    use futures_util::StreamExt;
    let Ok(nc) = async_nats::connect(url).await else {
        panic!("NATS at {url} is required");
    };
    let js = async_nats::jetstream::new(nc);
    let mut names = js.stream_names();
    let now_ms = im_client::proto::now_ms() as u64;
    let mut stale = Vec::new();
    while let Some(Ok(name)) = names.next().await {
        let Some(rest) = name.strip_prefix("KV_t") else {
            continue;
        };
        let created = rest
            .get(..12)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok());
        if created.is_some_and(|ms| now_ms.saturating_sub(ms) > 3_600_000) {
            stale.push(name["KV_".len()..].to_string());
        }
    }
    for bucket in stale {
        let _ = js.delete_key_value(bucket).await;
    }
}

/// Every message a client got, in arrival order, filled by a background task.
pub type Inbox = Arc<Mutex<Vec<ChatMessage>>>;

/// Collects `client`'s message events into an [`Inbox`].
pub fn collect(client: Arc<Client>) -> Inbox {
    let inbox: Inbox = Arc::default();
    let sink = inbox.clone();
    tokio::spawn(async move {
        while let Some(ev) = client.next_event().await {
            if let Event::Message(m) = ev {
                sink.lock().unwrap().push(m);
            }
        }
    });
    inbox
}

/// Whether `inbox` holds every msg id of `want` (conversation -> msg ids).
pub fn received_all(inbox: &Inbox, want: &HashMap<String, HashSet<String>>) -> bool {
    missing(inbox, want) == 0
}

/// How many msg ids of `want` (conversation -> msg ids) `inbox` does not hold.
pub fn missing(inbox: &Inbox, want: &HashMap<String, HashSet<String>>) -> usize {
    let got: HashSet<String> = inbox
        .lock()
        .unwrap()
        .iter()
        .map(|m| m.msg_id.clone())
        .collect();
    want.values()
        .flatten()
        .filter(|id| !got.contains(*id))
        .count()
}
