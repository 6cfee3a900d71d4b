//! Deployment helpers: Debian's nginx run unprivileged from a temp prefix with the
//! repository's site file (docs/deploy/nginx.conf, ports and paths rewritten), and the
//! repository root for the packaging scripts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository root (this package is `server/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_owned()
}

/// An nginx process, killed (by its PID) when dropped.
pub struct Nginx {
    child: Child,
    /// Its TLS port on 127.0.0.1.
    pub port: u16,
}

impl Nginx {
    /// Runs docs/deploy/nginx.conf in front of `upstream`, TLS with `cert`/`key`, on a
    /// spare port, from the temp prefix `prefix`; waits until it accepts.
    pub fn start(prefix: &Path, upstream: std::net::SocketAddr, cert: &Path, key: &Path) -> Nginx {
        let site = std::fs::read_to_string(repo_root().join("docs/deploy/nginx.conf"))
            .expect("reading docs/deploy/nginx.conf");
        let port = super::spare_port();
        let mut rewritten = String::new();
        for line in site.lines() {
            let t = line.trim();
            let line = if t.starts_with("listen [::]") {
                continue; // no IPv6 needed on the test machine
            } else if t == "listen 443 ssl;" {
                format!("    listen 127.0.0.1:{port} ssl;")
            } else if t == "server 127.0.0.1:7070;" {
                format!("    server {upstream};")
            } else if t.starts_with("ssl_certificate ") {
                format!("    ssl_certificate {};", cert.display())
            } else if t.starts_with("ssl_certificate_key ") {
                format!("    ssl_certificate_key {};", key.display())
            } else {
                line.to_owned()
            };
            rewritten.push_str(&line);
            rewritten.push('\n');
        }
        for needle in [
            "ssl_certificate ",
            "ssl_certificate_key ",
            "server 127.0.0.1:7070;",
        ] {
            assert!(
                site.contains(needle),
                "nginx.conf lost `{needle}`: update this helper"
            );
        }
        std::fs::create_dir_all(prefix.join("logs")).expect("prefix");
        std::fs::write(prefix.join("im.conf"), rewritten).expect("site file");
        let main = format!(
            "pid {p}/nginx.pid;\nerror_log {p}/logs/error.log;\nevents {{ worker_connections 256; }}\n\
             http {{\n  access_log {p}/logs/access.log;\n  client_body_temp_path {p}/body;\n  \
             proxy_temp_path {p}/proxy;\n  fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  \
             scgi_temp_path {p}/scgi;\n  include {p}/im.conf;\n}}\n",
            p = prefix.display()
        );
        std::fs::write(prefix.join("nginx.conf"), main).expect("nginx.conf");
        let check = Command::new("nginx")
            .arg("-p")
            .arg(prefix)
            .arg("-e")
            .arg(prefix.join("logs/startup.log"))
            .arg("-c")
            .arg(prefix.join("nginx.conf"))
            .arg("-t")
            .output()
            .expect("nginx -t");
        assert!(
            check.status.success(),
            "nginx -t refused the site file: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let child = Command::new("nginx")
            .arg("-p")
            .arg(prefix)
            .arg("-e")
            .arg(prefix.join("logs/startup.log"))
            .arg("-c")
            .arg(prefix.join("nginx.conf"))
            .args(["-g", "daemon off; master_process off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting nginx");
        let mut n = Nginx { child, port };
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = n.child.try_wait() {
                let log =
                    std::fs::read_to_string(prefix.join("logs/error.log")).unwrap_or_default();
                panic!("nginx exited ({status}): {log}");
            }
            assert!(Instant::now() < end, "nginx did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        n.port = port;
        n
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
