//! Region helpers: several regions on loopback, each with its own nats-server cluster
//! (one process per node, JetStream on), its own Postgres database (`test_region_<name>`,
//! a fresh schema per run) and its own `im-server` nodes. The regions' NATS clusters are
//! joined by gateways, and every gateway connection goes through a [`LatencyProxy`] (a
//! delay per chunk in each direction; it can cut the link and heal it), since these
//! machines have no netem.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::cluster::pg_url;
use super::nats::nats_server_bin;
use super::{spare_port, TestServer, WAIT};

/// A TCP proxy on loopback that delays every chunk by `delay` in each direction. `cut`
/// closes every open connection and refuses new ones until `heal`.
pub struct LatencyProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    target: Arc<std::sync::Mutex<SocketAddr>>,
    delay_us: Arc<AtomicU64>,
    up: Arc<AtomicBool>,
    generation: tokio::sync::watch::Sender<u64>,
    accepted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LatencyProxy {
    /// Listens on `port` (0: any) and forwards each connection to `target`. It runs on
    /// its own runtime thread, so a test that blocks its own runtime does not stall it.
    pub fn start(port: u16, target: SocketAddr, delay: Duration) -> LatencyProxy {
        let std_l = std::net::TcpListener::bind(("127.0.0.1", port)).expect("proxy bind");
        std_l.set_nonblocking(true).expect("nonblocking");
        let addr = std_l.local_addr().expect("proxy addr");
        let target = Arc::new(std::sync::Mutex::new(target));
        let delay_us = Arc::new(AtomicU64::new(delay.as_micros() as u64));
        let (target2, delay2) = (target.clone(), delay_us.clone());
        let up = Arc::new(AtomicBool::new(true));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let accepted = Arc::new(AtomicU64::new(0));
        let (up2, gen2, acc2) = (up.clone(), generation.clone(), accepted.clone());
        let task = proxy_runtime().spawn(async move {
            let l = tokio::net::TcpListener::from_std(std_l).expect("proxy listener");
            while let Ok((inbound, _)) = l.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                acc2.fetch_add(1, Ordering::Relaxed);
                let cut = gen2.subscribe();
                let target = *target2.lock().expect("proxy target");
                let delay = Duration::from_micros(delay2.load(Ordering::Relaxed));
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (ir, iw) = inbound.into_split();
                    let (or, ow) = outbound.into_split();
                    let a = tokio::spawn(pump(ir, ow, delay, cut.clone()));
                    let b = tokio::spawn(pump(or, iw, delay, cut));
                    let _ = tokio::join!(a, b);
                });
            }
        });
        LatencyProxy {
            addr,
            target,
            delay_us,
            up,
            generation,
            accepted,
            task,
        }
    }

    /// Closes every open connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Sends new connections to `target`.
    pub fn retarget(&self, target: SocketAddr) {
        *self.target.lock().expect("proxy target") = target;
    }

    /// Delays new connections' chunks by `delay` each way.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// Connections accepted and forwarded so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// The runtime every proxy runs on (one thread of its own).
fn proxy_runtime() -> &'static tokio::runtime::Handle {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("latency-proxy")
            .enable_all()
            .build()
            .expect("proxy runtime")
    })
    .handle()
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read, until either
/// side closes or the proxy is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    mut cut: tokio::sync::watch::Receiver<u64>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(1024);
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            n = from.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let at = tokio::time::Instant::now() + delay;
                    if tx.send((at, buf[..n].to_vec())).await.is_err() {
                        break;
                    }
                }
            },
            _ = cut.changed() => {
                writer.abort();
                return;
            }
        }
    }
    drop(tx);
    tokio::select! {
        _ = writer => {}
        _ = cut.changed() => {}
    }
}

/// Ports of one nats-server of a region.
#[derive(Clone, Copy, Debug)]
pub struct NatsPorts {
    /// Client port.
    pub client: u16,
    /// Cluster (route) port.
    pub cluster: u16,
    /// Gateway listener.
    pub gateway: u16,
    /// Monitoring HTTP port.
    pub monitor: u16,
    /// The latency proxy in front of its gateway listener (what it advertises).
    pub proxy: u16,
}

impl NatsPorts {
    fn pick() -> NatsPorts {
        NatsPorts {
            client: spare_port(),
            cluster: spare_port(),
            gateway: spare_port(),
            monitor: spare_port(),
            proxy: spare_port(),
        }
    }
}

/// One region: its nats-servers, its gateway proxies, its Postgres schema, its nodes.
pub struct Region {
    /// Its name (also its NATS cluster and gateway name).
    pub name: String,
    /// Its nats-server ports, one per server.
    pub nats_ports: Vec<NatsPorts>,
    nats: Vec<Option<Child>>,
    /// The proxies in front of its servers' gateway listeners (all traffic into it).
    pub proxies: Vec<LatencyProxy>,
    /// Its public entry point (`regions.route_url`): a proxy to node 0's client
    /// listener, with no delay unless a test sets one ([`LatencyProxy::set_delay`]).
    pub entry: LatencyProxy,
    /// Its Postgres URL (own database, own schema).
    pub db_url: String,
    /// Its im-server nodes (a killed node stays in place, dead).
    pub nodes: Vec<TestServer>,
    /// The NATS prefix given to its nodes (with `multi_region`, the same for every
    /// region: the nodes append their region, and the start checks each region's nodes
    /// see only each other).
    pub prefix: String,
    dir: tempfile::TempDir,
}

impl Region {
    /// `nats://127.0.0.1:<client port>` of its server `i`.
    pub fn nats_url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nats_ports[i].client)
    }

    /// `http://` URL of its entry point (what `[[regions]]` lists for it).
    pub fn entry_url(&self) -> String {
        format!("http://{}", self.entry.addr)
    }

    /// `http://` base URLs of its nodes' client listeners.
    pub fn route_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("http://{}", n.client_addr))
            .collect()
    }

    /// Cuts every gateway connection into this region and refuses new ones.
    pub fn cut_gateway(&self) {
        self.proxies.iter().for_each(LatencyProxy::cut);
    }

    /// Lets gateway connections into this region again.
    pub fn heal_gateway(&self) {
        self.proxies.iter().for_each(LatencyProxy::heal);
    }

    /// Kills the whole region: its nodes, its nats-servers (SIGKILL), its gateway link.
    pub fn kill(&mut self) {
        self.nodes.iter_mut().for_each(TestServer::kill);
        for c in self.nats.iter_mut() {
            if let Some(mut c) = c.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        self.cut_gateway();
    }

    /// Brings a killed region's nats-servers back (their ports, config and JetStream
    /// store) and its gateway link. Does not wait; see [`Regions::revive`].
    pub fn revive_nats(&mut self) {
        for i in 0..self.nats_ports.len() {
            self.run_nats(i);
        }
        self.heal_gateway();
    }

    /// Starts a killed region's nodes again, on their data and client ports.
    pub fn revive_nodes(&mut self) {
        self.nodes.iter_mut().for_each(TestServer::restart);
        self.entry.retarget(self.nodes[0].client_addr);
    }

    /// `GET <path>` of its server `i`'s monitoring port, as JSON.
    pub fn monitor(&self, i: usize, path: &str) -> serde_json::Value {
        let addr: SocketAddr = ([127, 0, 0, 1], self.nats_ports[i].monitor).into();
        let (status, body) = super::http(addr, "GET", path, None);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).expect("monitor JSON")
    }

    fn spawn_nats(&mut self, i: usize, others: &[(String, Vec<NatsPorts>)]) {
        let p = self.nats_ports[i];
        let routes: Vec<String> = self
            .nats_ports
            .iter()
            .map(|q| format!("\"nats-route://127.0.0.1:{}\"", q.cluster))
            .collect();
        let gateways: Vec<String> = others
            .iter()
            .map(|(name, ports)| {
                let urls: Vec<String> = ports
                    .iter()
                    .map(|q| format!("\"nats://127.0.0.1:{}\"", q.proxy))
                    .collect();
                format!("{{ name: \"{name}\", urls: [{}] }}", urls.join(", "))
            })
            .collect();
        let store = self.dir.path().join(format!("js{i}"));
        let conf = format!(
            "server_name: \"{name}-{i}\"\nlisten: \"127.0.0.1:{client}\"\nhttp: \"127.0.0.1:{mon}\"\n\
             jetstream {{ store_dir: \"{store}\", max_memory_store: 256MB, max_file_store: 1GB }}\n\
             cluster {{ name: \"{name}\", listen: \"127.0.0.1:{cl}\", routes: [{routes}] }}\n\
             gateway {{ name: \"{name}\", listen: \"127.0.0.1:{gw}\", advertise: \"127.0.0.1:{px}\", gateways: [{gws}] }}\n",
            name = self.name,
            client = p.client,
            mon = p.monitor,
            store = store.display(),
            cl = p.cluster,
            routes = routes.join(", "),
            gw = p.gateway,
            px = p.proxy,
            gws = gateways.join(", "),
        );
        let file: PathBuf = self.dir.path().join(format!("nats{i}.conf"));
        std::fs::write(&file, conf).expect("write nats config");
        self.run_nats(i);
    }

    /// Where nats-server `i` writes its log (`nats<i>.log`).
    fn nats_log(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("nats{i}.log"))
    }

    /// The last lines of nats-server `i`'s log, for a failure message.
    pub fn nats_log_tail(&self, i: usize) -> String {
        let text = std::fs::read_to_string(self.nats_log(i)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// Starts nats-server `i` of the region from its config file (`nats<i>.conf`).
    fn run_nats(&mut self, i: usize) {
        let file: PathBuf = self.dir.path().join(format!("nats{i}.conf"));
        let log = std::fs::File::create(self.nats_log(i)).expect("nats log file");
        let child = Command::new(nats_server_bin())
            .arg("-c")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", nats_server_bin().display()));
        self.nats[i] = Some(child);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Regions joined by NATS gateways through latency proxies.
pub struct Regions {
    /// The regions, in the order given.
    pub regions: Vec<Region>,
    /// The one-way delay of each gateway proxy.
    pub delay: Duration,
}

/// A fresh schema in the database `test_region_<name>` (created when missing); its URL.
async fn region_db(name: &str, id: &str) -> String {
    let base = pg_url();
    let (server, _) = base.rsplit_once('/').expect("postgres URL with a database");
    let admin = sqlx::PgPool::connect(&base)
        .await
        .unwrap_or_else(|e| panic!("Postgres at {base} is required: {e}"));
    let db = format!("test_region_{name}");
    // Two tests may race to create it: "already exists" is fine either way.
    let _ = sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await;
    admin.close().await;
    let url = format!("{server}/{db}");
    let pool = sqlx::PgPool::connect(&url).await.expect("region database");
    let schema = format!("t_{id}");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&pool)
        .await
        .expect("create schema");
    pool.close().await;
    format!("{url}?options[search_path]={schema}")
}

/// What a test changes in the regions' nodes.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// Environment given to every node besides the harness's own.
    pub env: Vec<(&'static str, &'static str)>,
    /// A region whose nodes list the regions in reverse order (a different list).
    pub reversed_list: Option<&'static str>,
}

impl Regions {
    /// Starts one region per name, each with `servers` nats-servers and `nodes` im-server
    /// nodes (node `i` on server `i % servers`), gateways delayed by `delay` each way.
    /// With `multi_region` each node gets a config file naming its `region` and listing
    /// every region's entry point. Waits until every gateway is up and every region's
    /// nodes see each other (and no one else).
    pub async fn start(
        names: &[&str],
        servers: usize,
        nodes: usize,
        delay: Duration,
        multi_region: bool,
    ) -> Regions {
        Self::start_with(
            names,
            (servers, nodes),
            delay,
            multi_region,
            &Setup::default(),
        )
        .await
    }

    /// [`Regions::start`] with a test's [`Setup`].
    pub async fn start_with(
        names: &[&str],
        (servers, nodes): (usize, usize),
        delay: Duration,
        multi_region: bool,
        setup: &Setup,
    ) -> Regions {
        let id = uuid::Uuid::now_v7().simple().to_string().to_lowercase();
        let mut all = Regions {
            regions: Vec::new(),
            delay,
        };
        for name in names {
            all.regions.push(Region {
                name: (*name).to_owned(),
                nats_ports: (0..servers).map(|_| NatsPorts::pick()).collect(),
                nats: (0..servers).map(|_| None).collect(),
                proxies: Vec::new(),
                db_url: region_db(name, &id).await,
                nodes: Vec::new(),
                entry: LatencyProxy::start(0, ([127, 0, 0, 1], 9).into(), Duration::ZERO),
                // Multi-region nodes share one prefix (the server appends the region);
                // the others need their own.
                prefix: if multi_region {
                    format!("t{id}")
                } else {
                    format!("t{id}{name}")
                },
                dir: tempfile::tempdir().expect("temp dir"),
            });
        }
        let ports: Vec<(String, Vec<NatsPorts>)> = all
            .regions
            .iter()
            .map(|r| (r.name.clone(), r.nats_ports.clone()))
            .collect();
        for r in all.regions.iter_mut() {
            for p in r.nats_ports.clone() {
                let target = ([127, 0, 0, 1], p.gateway).into();
                r.proxies.push(LatencyProxy::start(p.proxy, target, delay));
            }
            let others: Vec<_> = ports.iter().filter(|o| o.0 != r.name).cloned().collect();
            for i in 0..servers {
                r.spawn_nats(i, &others);
            }
        }
        all.wait_gateways().await;
        all.start_nodes(nodes, multi_region, setup).await;
        // A region with another list refuses the other regions' records, so it never
        // reads their streams to the end: its homes are not waited for.
        if multi_region {
            for r in &all.regions {
                if setup.reversed_list != Some(r.name.as_str()) {
                    wait_homes_ready(r).await;
                }
            }
        }
        all
    }

    /// Brings killed region `name` back: its NATS first, and once the gateways and the
    /// JetStream meta group are up, its nodes; waits until they see each other and
    /// serve their homes (each read the other regions' streams to their end).
    pub async fn revive(&mut self, name: &str) {
        self.region_mut(name).revive_nats();
        self.wait_gateways().await;
        self.region_mut(name).revive_nodes();
        let r = self.region(name);
        for (i, n) in r.nodes.iter().enumerate() {
            wait_healthy(n, r.nodes.len(), &format!("{name} node {i}")).await;
        }
        wait_homes_ready(r).await;
    }

    /// The multi-region config file of region `name`'s nodes (the list reversed for
    /// `reversed`).
    fn region_config(&self, name: &str, reversed: bool) -> String {
        let mut toml = format!("region = \"{name}\"\n");
        let mut list: Vec<&Region> = self.regions.iter().collect();
        if reversed {
            list.reverse();
        }
        for r in list {
            toml.push_str(&format!(
                "[[regions]]\nname = \"{}\"\nroute_url = \"{}\"\n",
                r.name,
                r.entry_url()
            ));
        }
        toml
    }

    async fn start_nodes(&mut self, nodes: usize, multi_region: bool, setup: &Setup) {
        let configs: Vec<Option<String>> = self
            .regions
            .iter()
            .map(|r| {
                let reversed = setup.reversed_list == Some(r.name.as_str());
                multi_region.then(|| self.region_config(&r.name, reversed))
            })
            .collect();
        for (r, config) in self.regions.iter_mut().zip(configs) {
            let file = r.dir.path().join("im.toml");
            let mut args: Vec<&str> = Vec::new();
            let file_arg = file.to_string_lossy().into_owned();
            if let Some(c) = config {
                std::fs::write(&file, c).expect("write region config");
                args.extend(["--config", file_arg.as_str()]);
            }
            let servers = r.nats_ports.len();
            for i in 0..nodes {
                let node_id = format!("{}{i}", r.name);
                let nats = r.nats_url(i % servers);
                let mut env: Vec<(&str, &str)> = vec![
                    ("IM_DATABASE_URL", &r.db_url),
                    ("IM_NATS_URL", &nats),
                    ("IM_NODE_ID", &node_id),
                    ("IM_CLUSTER_PREFIX", &r.prefix),
                    ("IM_CLUSTER_TTL_SECS", "3"),
                    ("IM_CLUSTER_REPORT_INTERVAL_MS", "300"),
                    ("IM_OBS_SAMPLE_INTERVAL_MS", "200"),
                ];
                env.extend(setup.env.iter().copied());
                r.nodes.push(TestServer::start_with_args(&env, &args));
            }
            r.entry.retarget(r.nodes[0].client_addr);
        }
        for r in &self.regions {
            for (i, n) in r.nodes.iter().enumerate() {
                wait_healthy(n, nodes, &format!("{} node {i}", r.name)).await;
            }
        }
    }

    /// Waits until every nats-server has an outbound gateway to every other region and
    /// the JetStream meta group has a leader.
    pub async fn wait_gateways(&self) {
        let end = Instant::now() + WAIT * 2;
        for r in &self.regions {
            for i in 0..r.nats_ports.len() {
                let addr = ("127.0.0.1", r.nats_ports[i].client);
                while std::net::TcpStream::connect(addr).is_err() {
                    assert!(
                        Instant::now() < end,
                        "{} nats {i} did not listen; its log ends:\n{}",
                        r.name,
                        r.nats_log_tail(i)
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                loop {
                    let g = r.monitor(i, "/gatewayz");
                    let js = r.monitor(i, "/jsz");
                    let out = &g["outbound_gateways"];
                    let linked = self
                        .regions
                        .iter()
                        .filter(|o| o.name != r.name)
                        .all(|o| out.get(&o.name).is_some());
                    let leader = js["meta_cluster"]["leader"]
                        .as_str()
                        .is_some_and(|l| !l.is_empty());
                    if linked && leader {
                        break;
                    }
                    assert!(
                        Instant::now() < end,
                        "{} nats {i}: gateways {out} meta {}",
                        r.name,
                        js["meta_cluster"]
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// The region named `name`.
    pub fn region(&self, name: &str) -> &Region {
        self.regions
            .iter()
            .find(|r| r.name == name)
            .expect("region")
    }

    /// The region named `name`, mutably.
    pub fn region_mut(&mut self, name: &str) -> &mut Region {
        self.regions
            .iter_mut()
            .find(|r| r.name == name)
            .expect("region")
    }
}

/// Waits until node `n`'s overview shows `healthy` healthy cluster nodes.
async fn wait_healthy(n: &TestServer, healthy: usize, what: &str) {
    let end = Instant::now() + WAIT;
    loop {
        let (status, body) = n.admin_get("/admin/v1/overview");
        let o: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && o["cluster"]["summary"]["healthy"] == healthy {
            return;
        }
        assert!(
            Instant::now() < end,
            "{what}: waiting for {healthy} healthy nodes; cluster: {}",
            o["cluster"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every node of `r` serves its region's homes (`GET /admin/v1/homes`
/// says `ready`: it read every other region's stream to its end since it started).
pub async fn wait_homes_ready(r: &Region) {
    let end = Instant::now() + WAIT;
    for (i, n) in r.nodes.iter().enumerate() {
        loop {
            let (status, body) = n.admin_get("/admin/v1/homes");
            let h: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if status == 200 && h["ready"] == true {
                break;
            }
            assert!(
                Instant::now() < end,
                "{} node {i}: homes not ready: {status} {body}",
                r.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
