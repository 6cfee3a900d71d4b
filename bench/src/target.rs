//! The server under test: where it listens ([`ServerArgs`]), how to mint tokens for it, its admin API
//! and (with `--spawn`) the child process that runs it. Connections are opened here
//! (`im_client::RawConn` with the bench's [`conn_options`]), logged in and handed to the
//! scenario's tasks.
//!
//! Against a loopback server, connection `i` binds local address
//! `127.0.0.(2 + i % sources)` before connecting (`--sources`, default 254, so
//! 127.0.0.2..127.0.0.255): each source address has its own ephemeral port range, so the
//! number of connections (and of TIME_WAIT sockets left by back-to-back runs) is not
//! capped by one address's ~28k ports.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use im_client::{ClientError, RawConn, RawConnOptions};
use im_proto::ErrorCode;
use im_token::TokenKeys;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::http::Uri;

use crate::admin::AdminClient;
use crate::spawn::{ServerLog, SpawnedServer};
use crate::util::parse_key_val;

/// JWT secret a spawned server is given, and the default `--secret`.
pub const DEFAULT_SECRET: &str = "im-bench-secret-of-at-least-32-bytes";

/// Where the server under test is.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Client WebSocket endpoint of a running server.
    #[arg(long, default_value = "ws://127.0.0.1:7070/ws")]
    pub url: String,
    /// Start this im-server binary instead (loopback, ephemeral ports, temp data dir),
    /// and kill it at the end.
    #[arg(long, value_name = "PATH_TO_IM_SERVER", conflicts_with = "url")]
    pub spawn: Option<PathBuf>,
    /// JWT secret used to mint client tokens (a spawned server gets the same one).
    #[arg(long, env = "IM_BENCH_SECRET", default_value = DEFAULT_SECRET, hide_env_values = true)]
    pub secret: String,
    /// Extra environment for the spawned server, e.g. IM_PERSIST_BATCH_MAX=64 (repeatable).
    #[arg(long = "server-env", value_name = "KEY=VALUE", value_parser = parse_key_val)]
    pub server_env: Vec<(String, String)>,
    /// Admin API of a running server (`http://HOST:PORT`), for its figures (automatic
    /// with --spawn).
    #[arg(long, conflicts_with = "spawn")]
    pub admin_url: Option<String>,
    /// Admin bearer token for --admin-url.
    #[arg(long, env = "IM_BENCH_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Loopback source addresses to spread connections over (127.0.0.2 onwards, at
    /// most 254); 0 lets the OS choose. Ignored for a server that is not on loopback.
    #[arg(long, default_value_t = 254, value_parser = clap::value_parser!(u32).range(0..=254))]
    pub sources: u32,
    /// With --spawn: give the server one webhook endpoint getting `message.created` for
    /// every message, served by a receiver in this process that answers after this many
    /// milliseconds (the cost of webhooks, and of a slow backend, on the message path).
    #[arg(long, value_name = "MS", requires = "spawn")]
    pub webhook_receiver_delay_ms: Option<u64>,
}

impl ServerArgs {
    /// The same flags aimed at another node of a cluster, `url`, with its admin API
    /// `admin_url` if known: nothing is spawned for it.
    pub fn for_node(&self, url: &str, admin_url: Option<String>) -> ServerArgs {
        ServerArgs {
            url: url.to_owned(),
            spawn: None,
            admin_url,
            server_env: Vec::new(),
            webhook_receiver_delay_ms: None,
            ..self.clone()
        }
    }
}

/// Admin token given to a spawned server.
pub const SPAWN_ADMIN_TOKEN: &str = "im-bench-admin-token-of-at-least-32-bytes";
/// Connections opened (connect + login) at the same time by [`Target::connect_all`].
const CONNECT_CONCURRENCY: usize = 64;
/// Lifetime of minted tokens.
const TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// Most loopback source addresses (127.0.0.2..=127.0.0.255).
pub const MAX_SOURCES: u32 = 254;
/// How long a login waits for `LoginOk`.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// WebSocket read buffer of a bench connection (grows for larger messages): tungstenite's
/// default of 128 KiB, allocated up front, would cost 2.4 GiB at 19,000 connections.
pub const READ_BUFFER: usize = 8 * 1024;
/// WebSocket write buffer of a bench connection.
pub const WRITE_BUFFER: usize = 4 * 1024;

/// How the bench opens a connection to `addr`: from `local_ip` when set, small buffers,
/// WebSocket pongs surfaced (for heartbeat round trips).
pub fn conn_options(addr: SocketAddr, local_ip: Option<IpAddr>) -> RawConnOptions {
    RawConnOptions::new()
        .addr(addr)
        .bind(local_ip)
        .buffers(READ_BUFFER, WRITE_BUFFER)
        .ws_pongs(true)
}

/// A logged-in connection and the heartbeat interval the server asked for.
#[derive(Debug)]
pub struct Session {
    /// The connection, past `LoginOk`.
    pub conn: RawConn,
    /// `LoginOk.heartbeat_secs` as a duration (at least one second).
    pub heartbeat: Duration,
}

/// How long the two halves of opening a session took.
#[derive(Debug, Clone, Copy)]
pub struct OpenTimes {
    /// TCP connect plus WebSocket handshake.
    pub connect: Duration,
    /// Login to LoginOk.
    pub login: Duration,
}

/// The server a scenario runs against.
#[derive(Debug)]
pub struct Target {
    /// The client WebSocket URL.
    pub url: String,
    /// The address `url` resolves to.
    pub addr: SocketAddr,
    keys: TokenKeys,
    sources: Vec<IpAddr>,
    admin: Option<AdminClient>,
    server: Option<SpawnedServer>,
    /// The webhook receiver and the config file's folder (`--webhook-receiver-delay-ms`).
    _hooks: Option<(crate::hookrecv::HookReceiver, tempfile::TempDir)>,
}

/// Webhook endpoint secret given to a spawned server.
const HOOK_SECRET: &str = "im-bench-webhook-secret-of-32-bytes-or-more";

/// Starts the webhook receiver (answering after `delay_ms`) and writes a config file
/// with one endpoint for `message.created` pointing at it; returns the server's extra
/// arguments (`--config FILE`), the receiver and the file's folder.
async fn webhook_config(
    delay_ms: u64,
) -> anyhow::Result<(
    Vec<String>,
    (crate::hookrecv::HookReceiver, tempfile::TempDir),
)> {
    let receiver = crate::hookrecv::HookReceiver::start(Duration::from_millis(delay_ms)).await?;
    let dir = tempfile::Builder::new()
        .prefix("im-bench-hooks-")
        .tempdir()
        .context("creating a folder for the webhook config")?;
    let file = dir.path().join("webhooks.toml");
    let text = format!(
        "[[webhooks.endpoints]]\nname = \"bench\"\nurl = \"http://{}/hook\"\n\
         secret = \"{HOOK_SECRET}\"\nevents = [\"message.created\"]\n",
        receiver.addr
    );
    std::fs::write(&file, text).context("writing the webhook config")?;
    eprintln!(
        "im-bench: webhooks to {} (answers after {delay_ms} ms)",
        receiver.addr
    );
    Ok((
        vec!["--config".to_owned(), file.display().to_string()],
        (receiver, dir),
    ))
}

/// Host and port of a `ws://HOST:PORT/...` URL (brackets of an IPv6 host removed).
pub fn host_port(url: &str) -> anyhow::Result<(String, u16)> {
    let uri: Uri = url
        .parse()
        .with_context(|| format!("parsing URL {url:?}"))?;
    let host = uri
        .host()
        .with_context(|| format!("URL {url:?} has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(p), _) => p,
        (None, Some("wss")) => 443,
        (None, _) => 80,
    };
    Ok((host, port))
}

/// The loopback source addresses to spread `count` connections over when connecting to
/// `server` (empty: let the OS choose, e.g. for a server that is not on loopback).
pub fn source_ips(server: SocketAddr, count: u32) -> Vec<IpAddr> {
    match server.ip() {
        IpAddr::V4(ip) if ip.is_loopback() => (0..count.min(MAX_SOURCES))
            .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i as u8)))
            .collect(),
        _ => Vec::new(),
    }
}

impl Target {
    /// Connects to `--url`, or starts `--spawn` and uses its address.
    pub async fn open(args: &ServerArgs) -> anyhow::Result<Target> {
        let keys = TokenKeys::new(args.secret.as_bytes());
        let mut hooks = None;
        let (url, admin, server) = match &args.spawn {
            Some(binary) => {
                let (hook_args, h) = match args.webhook_receiver_delay_ms {
                    Some(ms) => {
                        let (a, h) = webhook_config(ms).await?;
                        (a, Some(h))
                    }
                    None => (Vec::new(), None),
                };
                hooks = h;
                let server = SpawnedServer::start(
                    binary,
                    &args.secret,
                    SPAWN_ADMIN_TOKEN,
                    &args.server_env,
                    &hook_args,
                )
                .await?;
                eprintln!(
                    "im-bench: spawned {} (client={} admin={})",
                    binary.display(),
                    server.client_addr,
                    server.admin_addr
                );
                let admin = AdminClient::new(
                    &format!("http://{}", server.admin_addr),
                    &server.admin_token,
                )?;
                (server.ws_url(), Some(admin), Some(server))
            }
            None => {
                let admin = match (&args.admin_url, &args.admin_token) {
                    (Some(u), Some(t)) => Some(AdminClient::new(u, t)?),
                    (Some(_), None) => {
                        bail!("--admin-url needs --admin-token (or IM_BENCH_ADMIN_TOKEN)")
                    }
                    _ => None,
                };
                (args.url.clone(), admin, None)
            }
        };
        let (host, port) = host_port(&url)?;
        let addr = tokio::net::lookup_host((host.as_str(), port))
            .await
            .with_context(|| format!("resolving {host}:{port}"))?
            .next()
            .with_context(|| format!("{host}:{port} resolves to no address"))?;
        Ok(Target {
            sources: source_ips(addr, args.sources),
            url,
            addr,
            keys,
            admin,
            server,
            _hooks: hooks,
        })
    }

    /// The admin API, when known (always with `--spawn`; with `--url`, given
    /// `--admin-url` and `--admin-token`).
    pub fn admin(&self) -> Option<&AdminClient> {
        self.admin.as_ref()
    }

    /// How many source addresses connections are spread over (0: the OS chooses).
    pub fn source_count(&self) -> usize {
        self.sources.len()
    }

    /// Mints a token for `user`.
    pub fn token(&self, user: &str) -> anyhow::Result<String> {
        self.keys
            .issue(user, TOKEN_TTL)
            .with_context(|| format!("minting a token for {user}"))
    }

    /// A cheap handle that opens more connections to the same server from other tasks.
    pub fn dialer(&self) -> Dialer {
        Dialer {
            url: self.url.clone().into(),
            addr: self.addr,
            sources: self.sources.clone().into(),
            keys: self.keys.clone(),
        }
    }

    /// Opens one connection per user, logged in, in the order given; at most
    /// `CONNECT_CONCURRENCY` handshakes are in flight at once. `first_idx` is the
    /// connection number of `users[0]` (it picks the source addresses).
    pub async fn connect_all(
        &self,
        users: &[String],
        first_idx: usize,
    ) -> anyhow::Result<Vec<Session>> {
        let limit = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
        let dialer = self.dialer();
        let mut set = JoinSet::new();
        for (idx, user) in users.iter().enumerate() {
            let token = self.token(user)?;
            let (dialer, user, limit) = (dialer.clone(), user.clone(), limit.clone());
            set.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let (session, _) = dialer
                    .open(first_idx + idx, &token)
                    .await
                    .map_err(explain_login_error)
                    .with_context(|| format!("connecting and logging in {user}"))?;
                anyhow::Ok((idx, session))
            });
        }
        let mut slots: Vec<Option<Session>> = (0..users.len()).map(|_| None).collect();
        while let Some(joined) = set.join_next().await {
            let (idx, session) = joined.context("connect task panicked")??;
            slots[idx] = Some(session);
        }
        Ok(slots.into_iter().flatten().collect())
    }

    /// The spawned server's process id (`None` with `--url`).
    pub fn server_pid(&self) -> Option<u32> {
        self.server.as_ref().and_then(SpawnedServer::pid)
    }

    /// Whether a spawned server is still running (always true with `--url`).
    pub fn server_alive(&mut self) -> bool {
        self.server.as_mut().is_none_or(SpawnedServer::is_running)
    }

    /// Stops a spawned server and returns what it logged (`None` with `--url`).
    pub async fn close(self) -> Option<ServerLog> {
        match self.server {
            Some(s) => Some(s.stop().await),
            None => None,
        }
    }
}

/// Opens sessions to the target from any task (cloned per task; shares its strings).
#[derive(Clone)]
pub struct Dialer {
    url: Arc<str>,
    addr: SocketAddr,
    sources: Arc<[IpAddr]>,
    keys: TokenKeys,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("url", &self.url)
            .field("addr", &self.addr)
            .field("sources", &self.sources.len())
            .finish_non_exhaustive()
    }
}

impl Dialer {
    /// Mints a token for `user`.
    pub fn token(&self, user: &str) -> anyhow::Result<String> {
        self.keys
            .issue(user, TOKEN_TTL)
            .with_context(|| format!("minting a token for {user}"))
    }

    /// Connects connection number `idx` (from its source address) and logs in with
    /// `token`; returns the session and how long each half took.
    pub async fn open(&self, idx: usize, token: &str) -> Result<(Session, OpenTimes), ClientError> {
        let local_ip = (!self.sources.is_empty()).then(|| self.sources[idx % self.sources.len()]);
        let opts = conn_options(self.addr, local_ip);
        let t0 = Instant::now();
        let mut conn = RawConn::connect_with(&self.url, &opts).await?;
        let t1 = Instant::now();
        let ok = conn
            .login_with(1, token, "im-bench", false, LOGIN_TIMEOUT)
            .await?;
        let t2 = Instant::now();
        let heartbeat = Duration::from_secs(u64::from(ok.heartbeat_secs.max(1)));
        Ok((
            Session { conn, heartbeat },
            OpenTimes {
                connect: t1 - t0,
                login: t2 - t1,
            },
        ))
    }
}

/// What to do when the server refuses the bench's token signatures.
const WRONG_SECRET_HINT: &str = "the server refused the bench's token (invalid signature): \
    the bench signs tokens with --secret / IM_BENCH_SECRET, which must be the server's JWT \
    secret: its jwt_secret setting (IM_JWT_SECRET) or the jwt_secret file in its data dir, \
    e.g. IM_BENCH_SECRET=$(cat ./data/jwt_secret)";

/// A connect/login error, with the fix spelled out when the server refused the token's
/// signature (the bench signs with its own secret unless given the server's).
pub fn explain_login_error(e: ClientError) -> anyhow::Error {
    let wrong_secret = matches!(
        &e,
        ClientError::Server { code: ErrorCode::Unauthenticated, message, .. }
            if message.contains("InvalidSignature")
    );
    if wrong_secret {
        anyhow::Error::new(e).context(WRONG_SECRET_HINT)
    } else {
        e.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error the client returns for the server's answer to a Login.
    fn refused(code: ErrorCode, message: &str) -> ClientError {
        ClientError::from_server(im_proto::Error {
            code: code as i32,
            message: message.into(),
            ..Default::default()
        })
    }

    #[test]
    fn a_refused_signature_names_the_secret_option_and_the_server_file() {
        let e = explain_login_error(refused(
            ErrorCode::Unauthenticated,
            "invalid token: InvalidSignature",
        ));
        let text = format!("{e:#}");
        for part in [
            "--secret",
            "IM_BENCH_SECRET",
            "jwt_secret",
            "InvalidSignature",
        ] {
            assert!(text.contains(part), "{part} missing from: {text}");
        }
        // Other refusals keep their own text, without the hint.
        let e = explain_login_error(refused(
            ErrorCode::Unauthenticated,
            "invalid token: ExpiredSignature",
        ));
        assert!(!format!("{e:#}").contains("IM_BENCH_SECRET"), "{e:#}");
        let e = explain_login_error(refused(ErrorCode::Overloaded, "InvalidSignature"));
        assert!(!format!("{e:#}").contains("IM_BENCH_SECRET"), "{e:#}");
    }

    #[test]
    fn urls_split_into_host_and_port() {
        assert_eq!(
            host_port("ws://127.0.0.1:7070/ws").unwrap(),
            ("127.0.0.1".into(), 7070)
        );
        assert_eq!(host_port("ws://[::1]:9/ws").unwrap(), ("::1".into(), 9));
        assert_eq!(
            host_port("ws://example.com/ws").unwrap(),
            ("example.com".into(), 80)
        );
        assert!(host_port("not a url").is_err());
    }

    #[test]
    fn sources_are_loopback_only() {
        let lo: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let ips = source_ips(lo, 300);
        assert_eq!(ips.len(), 254);
        assert_eq!(ips[0], "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(ips[253], "127.0.0.255".parse::<IpAddr>().unwrap());
        assert!(source_ips(lo, 0).is_empty());
        assert!(source_ips("10.0.0.1:7070".parse().unwrap(), 10).is_empty());
        assert!(source_ips("[::1]:7070".parse().unwrap(), 10).is_empty());
    }
}
