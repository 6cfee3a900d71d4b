//! The server under test: where it listens, how to mint tokens for it, and (with
//! `--spawn`) the child process that runs it. Connections are opened here, logged in
//! and handed to the scenario's tasks.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use im_client::RawConn;
use im_server::auth::TokenKeys;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::scenarios::ServerArgs;
use crate::spawn::{ServerLog, SpawnedServer};

/// Admin token given to a spawned server.
pub const SPAWN_ADMIN_TOKEN: &str = "im-bench-admin";
/// Connections opened (connect + login) at the same time during setup.
const CONNECT_CONCURRENCY: usize = 64;
/// Lifetime of minted tokens.
const TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);

/// A logged-in connection and the heartbeat interval the server asked for.
#[derive(Debug)]
pub struct Session {
    /// The connection, past `LoginOk`.
    pub conn: RawConn,
    /// `LoginOk.heartbeat_secs` as a duration (at least one second).
    pub heartbeat: Duration,
}

/// The server a scenario runs against.
#[derive(Debug)]
pub struct Target {
    /// The client WebSocket URL.
    pub url: String,
    keys: TokenKeys,
    server: Option<SpawnedServer>,
}

impl Target {
    /// Connects to `--url`, or starts `--spawn` and uses its address.
    pub async fn open(args: &ServerArgs) -> anyhow::Result<Target> {
        let keys = TokenKeys::new(args.secret.as_bytes());
        match &args.spawn {
            Some(binary) => {
                let server =
                    SpawnedServer::start(binary, &args.secret, SPAWN_ADMIN_TOKEN, &args.server_env)
                        .await?;
                eprintln!(
                    "im-bench: spawned {} (client={} admin={})",
                    binary.display(),
                    server.client_addr,
                    server.admin_addr
                );
                Ok(Target {
                    url: server.ws_url(),
                    keys,
                    server: Some(server),
                })
            }
            None => Ok(Target {
                url: args.url.clone(),
                keys,
                server: None,
            }),
        }
    }

    /// Opens one connection per user, logged in, in the order given; at most
    /// `CONNECT_CONCURRENCY` handshakes are in flight at once.
    pub async fn connect_all(&self, users: &[String]) -> anyhow::Result<Vec<Session>> {
        let limit = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
        let mut set = JoinSet::new();
        for (idx, user) in users.iter().enumerate() {
            let token = self
                .keys
                .issue(user, TOKEN_TTL)
                .with_context(|| format!("minting a token for {user}"))?;
            let (url, user, limit) = (self.url.clone(), user.clone(), limit.clone());
            set.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let mut conn = RawConn::connect(&url)
                    .await
                    .with_context(|| format!("connecting {user} to {url}"))?;
                let ok = conn
                    .login(&token, "im-bench", false)
                    .await
                    .with_context(|| format!("logging in {user}"))?;
                let heartbeat = Duration::from_secs(u64::from(ok.heartbeat_secs.max(1)));
                anyhow::Ok((idx, Session { conn, heartbeat }))
            });
        }
        let mut slots: Vec<Option<Session>> = (0..users.len()).map(|_| None).collect();
        while let Some(joined) = set.join_next().await {
            let (idx, session) = joined.context("connect task panicked")??;
            slots[idx] = Some(session);
        }
        Ok(slots.into_iter().flatten().collect())
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
