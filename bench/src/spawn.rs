//! Running `im-server` as a child process for a self-contained bench (`--spawn PATH`).
//!
//! The child gets `IM_LISTEN=127.0.0.1:0`, `IM_ADMIN_LISTEN=127.0.0.1:0`, a fresh
//! temporary `IM_DATA_DIR`, `IM_JWT_SECRET` and `IM_ADMIN_TOKEN`, plus any extra
//! `KEY=VALUE` pairs. Its stderr is read line by line: the `listening client=ADDR
//! admin=ADDR` line gives the addresses, and afterwards WARN and ERROR lines are counted
//! (with the first few kept) so the report can say whether the server complained. The
//! child is killed when the bench stops it or drops it.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// How long the child may take to log its `listening` line.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// WARN/ERROR lines kept verbatim for the report.
const KEPT_LINES: usize = 10;
/// Stderr lines kept to explain a failed start.
const STARTUP_LINES: usize = 50;

/// What the server wrote to stderr after it started listening.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerLog {
    /// Lines logged at WARN level.
    pub warnings: u64,
    /// Lines logged at ERROR level.
    pub errors: u64,
    /// The first WARN/ERROR lines, verbatim.
    pub samples: Vec<String>,
}

impl ServerLog {
    fn observe(&mut self, line: &str) {
        let level = if line.contains(" ERROR ") {
            &mut self.errors
        } else if line.contains(" WARN ") {
            &mut self.warnings
        } else {
            return;
        };
        *level += 1;
        if self.samples.len() < KEPT_LINES {
            self.samples.push(line.to_owned());
        }
    }
}

/// A running `im-server` child process and its addresses.
#[derive(Debug)]
pub struct SpawnedServer {
    child: Child,
    /// The client WebSocket listener (`IP:PORT`).
    pub client_addr: String,
    /// The admin HTTP listener (`IP:PORT`).
    pub admin_addr: String,
    /// The admin bearer token the child was given.
    pub admin_token: String,
    log: Arc<Mutex<ServerLog>>,
    _data_dir: tempfile::TempDir,
}

/// Extracts `(client, admin)` from a line containing `listening client=ADDR admin=ADDR`.
pub fn parse_listening(line: &str) -> Option<(String, String)> {
    let rest = &line[line.find("listening client=")? + "listening ".len()..];
    let field = |name: &str| {
        let start = rest.find(name)? + name.len();
        let value: String = rest[start..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '\u{1b}' && *c != '"')
            .collect();
        (!value.is_empty()).then_some(value)
    };
    Some((field("client=")?, field("admin=")?))
}

impl SpawnedServer {
    /// Starts `binary` with the bench's environment and waits for its `listening` line.
    pub async fn start(
        binary: &Path,
        jwt_secret: &str,
        admin_token: &str,
        extra_env: &[(String, String)],
        extra_args: &[String],
    ) -> anyhow::Result<SpawnedServer> {
        let data_dir = tempfile::Builder::new()
            .prefix("im-bench-")
            .tempdir()
            .context("creating a temporary data dir")?;
        let mut cmd = Command::new(binary);
        cmd.args(extra_args)
            .env("IM_LISTEN", "127.0.0.1:0")
            .env("IM_ADMIN_LISTEN", "127.0.0.1:0")
            .env("IM_DATA_DIR", data_dir.path())
            .env("IM_JWT_SECRET", jwt_secret)
            .env("IM_ADMIN_TOKEN", admin_token)
            .envs(extra_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stderr = child.stderr.take().context("child has no stderr")?;

        let log = Arc::new(Mutex::new(ServerLog::default()));
        let (ready_tx, ready_rx) = oneshot::channel();
        tokio::spawn(read_stderr(stderr, log.clone(), ready_tx));

        let started = match tokio::time::timeout(START_TIMEOUT, ready_rx).await {
            Ok(Ok(Ok(addrs))) => addrs,
            Ok(Ok(Err(lines))) => {
                let status = child.wait().await.ok();
                bail!(
                    "{} exited before listening ({}):\n{}",
                    binary.display(),
                    status.map_or("unknown status".into(), |s| s.to_string()),
                    lines.join("\n")
                );
            }
            Ok(Err(_)) => bail!("{}: stderr reader stopped", binary.display()),
            Err(_) => {
                let _ = child.kill().await;
                bail!(
                    "{} did not log `listening client=... admin=...` within {:?}",
                    binary.display(),
                    START_TIMEOUT
                );
            }
        };
        Ok(SpawnedServer {
            child,
            client_addr: started.0,
            admin_addr: started.1,
            admin_token: admin_token.to_owned(),
            log,
            _data_dir: data_dir,
        })
    }

    /// The client endpoint URL, `ws://ADDR/ws`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.client_addr)
    }

    /// What the server logged at WARN/ERROR level so far.
    pub fn log(&self) -> ServerLog {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The child's process id (`None` once it has been reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the child, waits for it, removes its data dir and returns its log summary.
    pub async fn stop(mut self) -> ServerLog {
        let _ = self.child.kill().await;
        self.log()
    }
}

/// Reads the child's stderr: reports the addresses (or, at EOF before them, the lines
/// seen) through `ready`, then keeps reading so the pipe never fills up.
async fn read_stderr(
    stderr: tokio::process::ChildStderr,
    log: Arc<Mutex<ServerLog>>,
    ready: oneshot::Sender<Result<(String, String), Vec<String>>>,
) {
    let mut lines = BufReader::new(stderr).lines();
    let mut ready = Some(ready);
    let mut startup = Vec::new();
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) | Err(_) => break,
        };
        if ready.is_some() {
            if let Some(addrs) = parse_listening(&line) {
                if let Some(sender) = ready.take() {
                    let _ = sender.send(Ok(addrs));
                }
            } else if startup.len() < STARTUP_LINES {
                startup.push(line);
            }
            continue;
        }
        if let Ok(mut l) = log.lock() {
            l.observe(&line);
        }
    }
    if let Some(sender) = ready.take() {
        let _ = sender.send(Err(startup));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_line_is_parsed() {
        let line = "2026-01-02T03:04:05.678Z  INFO im_server: listening client=127.0.0.1:40123 \
                    admin=127.0.0.1:40124 node_id=n1 store=sqlite";
        assert_eq!(
            parse_listening(line),
            Some(("127.0.0.1:40123".into(), "127.0.0.1:40124".into()))
        );
        assert_eq!(
            parse_listening("listening client=[::1]:7070 admin=[::1]:7071\u{1b}[0m"),
            Some(("[::1]:7070".into(), "[::1]:7071".into()))
        );
        assert_eq!(parse_listening("INFO starting"), None);
        assert_eq!(parse_listening("listening client= admin=1.2.3.4:5"), None);
    }

    #[test]
    fn warnings_and_errors_are_counted() {
        let mut log = ServerLog::default();
        log.observe("2026-01-02T03:04:05Z  WARN im_server::flow: slow consumer");
        log.observe("2026-01-02T03:04:05Z ERROR im_server::store: commit failed");
        log.observe("2026-01-02T03:04:05Z  INFO im_server: fine");
        assert_eq!((log.warnings, log.errors, log.samples.len()), (1, 1, 2));
    }
}
