//! A private `nats-server` (with JetStream) for tests that break NATS: started on a
//! free loopback port with its own store dir, killed with SIGKILL and started again on
//! the same port. Never the machine's shared server.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The nats-server binary (`IM_TEST_NATS_SERVER`, default `/usr/sbin/nats-server`).
pub fn nats_server_bin() -> PathBuf {
    std::env::var("IM_TEST_NATS_SERVER")
        .unwrap_or_else(|_| "/usr/sbin/nats-server".to_owned())
        .into()
}

/// Whether the nats-server binary runs; when it does not, a test skips (saying so)
/// outside CI and fails under it ([`super::tool_available`]).
pub fn nats_server_available() -> bool {
    let bin = nats_server_bin();
    super::tool_available(
        &bin.to_string_lossy(),
        &["--version"],
        "apt-get install nats-server, or set IM_TEST_NATS_SERVER",
    )
}

/// One private nats-server process.
pub struct PrivateNats {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl PrivateNats {
    /// Starts a nats-server with JetStream on a free port; waits until it accepts.
    pub fn start() -> PrivateNats {
        let port = super::spare_port();
        let mut n = PrivateNats {
            child: None,
            port,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        n.spawn();
        n
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new(nats_server_bin())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", nats_server_bin().display()));
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < end,
                "nats-server did not listen on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and store dir (after [`PrivateNats::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.kill();
    }
}
