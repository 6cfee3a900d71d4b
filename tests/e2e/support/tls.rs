//! TLS helpers: a test CA and server certificates made with the `openssl` CLI in a temp
//! dir, and a `wss://` client (tokio-rustls trusting only that CA, tungstenite over it)
//! that speaks `im.v1` frames and reports the certificate the server showed.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use im_client::proto::{self, Body, Frame};
use prost::Message as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::WAIT;

/// Whether the `openssl` CLI is here (else the TLS tests skip, or fail under CI).
pub fn openssl_available() -> bool {
    super::tool_available("openssl", &["version"], "apt-get install openssl")
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("running openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA in a directory; [`Pki::issue`] signs server certificates for 127.0.0.1 and
/// localhost.
pub struct Pki {
    /// The directory holding every file.
    pub dir: PathBuf,
    /// The CA certificate (PEM).
    pub ca: PathBuf,
}

impl Pki {
    /// A new CA (P-256, valid two days) in `dir`.
    pub fn new(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).expect("pki dir");
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=im test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        std::fs::write(
            dir.join("leaf.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("leaf.ext");
        Pki {
            dir: dir.to_owned(),
            ca: dir.join("ca.pem"),
        }
    }

    /// A new server key and certificate signed by the CA: `<name>.key`, `<name>.pem`.
    pub fn issue(&self, name: &str) -> (PathBuf, PathBuf) {
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                "/CN=localhost",
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                "leaf.ext",
            ],
        );
        (self.dir.join(pem), self.dir.join(key))
    }
}

/// The DER of the first certificate in a PEM file.
pub fn cert_der(pem: &Path) -> Vec<u8> {
    CertificateDer::pem_file_iter(pem)
        .expect("reading the certificate")
        .next()
        .expect("a certificate in the file")
        .expect("a parsable certificate")
        .to_vec()
}

/// Installs `src` at `dst` the way a certificate manager does: write beside, rename.
pub fn install(src: &Path, dst: &Path) {
    let tmp = dst.with_extension("new");
    std::fs::copy(src, &tmp).expect("copy");
    std::fs::rename(&tmp, dst).expect("rename");
}

/// A TLS client configuration trusting only `ca`.
pub fn client_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).expect("reading the CA") {
        roots
            .add(c.expect("CA certificate"))
            .expect("adding the CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// The TLS handshake alone to `addr` (name `localhost`), trusting `ca`.
pub async fn tls_connect(addr: SocketAddr, ca: &Path) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(client_config(ca));
    let name = ServerName::try_from("localhost").expect("server name");
    connector.connect(name, tcp).await
}

/// A `wss://` connection speaking `im.v1` frames.
pub struct Wss {
    ws: WebSocketStream<TlsStream<TcpStream>>,
    queue: VecDeque<Frame>,
    /// The DER of the certificate the server presented.
    pub peer_cert: Vec<u8>,
}

impl Wss {
    /// Connects to `wss://localhost:<port>/ws` at `addr`, trusting `ca`.
    pub async fn connect(addr: SocketAddr, ca: &Path) -> Wss {
        let tls = tls_connect(addr, ca).await.expect("tls handshake");
        let peer_cert = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec())
            .expect("the server's certificate");
        let url = format!("wss://localhost:{}/ws", addr.port());
        let (ws, _) = tokio_tungstenite::client_async(url, tls)
            .await
            .expect("websocket handshake over tls");
        Wss {
            ws,
            queue: VecDeque::new(),
            peer_cert,
        }
    }

    /// Connects and logs in as `user`.
    pub async fn login(addr: SocketAddr, ca: &Path, user: &str) -> Wss {
        let mut c = Wss::connect(addr, ca).await;
        c.send(&super::login_frame(&super::token_with_ttl(
            user,
            Duration::from_secs(3600),
        )))
        .await;
        loop {
            match c.recv().await.body {
                Some(Body::LoginOk(_)) => return c,
                Some(Body::Error(e)) => panic!("login refused: {e:?}"),
                _ => {}
            }
        }
    }

    /// Sends one frame.
    pub async fn send(&mut self, f: &Frame) {
        self.ws
            .send(Message::Binary(f.encode_to_vec().into()))
            .await
            .expect("send over wss");
    }

    /// The next frame (batches unwrapped), within [`WAIT`].
    pub async fn recv(&mut self) -> Frame {
        loop {
            if let Some(f) = self.queue.pop_front() {
                return f;
            }
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a frame in time")
                .expect("connection open")
                .expect("websocket read");
            if let Message::Binary(b) = msg {
                self.push(Frame::decode(&b[..]).expect("a frame"));
            }
        }
    }

    fn push(&mut self, f: Frame) {
        match f.body {
            Some(Body::Batch(b)) => b.frames.into_iter().for_each(|f| self.push(f)),
            _ => self.queue.push_back(f),
        }
    }

    /// Sends `text` to `to` and waits for its ack; returns the seq.
    pub async fn chat(&mut self, req_id: u64, to: &str, text: &str) -> u64 {
        self.send(&super::send_to_user(req_id, to, text.as_bytes(), text))
            .await;
        loop {
            let f = self.recv().await;
            if let (true, Some(Body::SendAck(a))) = (f.req_id == req_id, &f.body) {
                return a.seq;
            }
        }
    }

    /// Waits for the chat message carrying `text`.
    pub async fn expect_message(&mut self, text: &str) -> proto::ChatMessage {
        loop {
            if let Some(Body::Deliver(d)) = self.recv().await.body {
                if let Some(m) = d
                    .messages
                    .into_iter()
                    .find(|m| m.payload[..] == *text.as_bytes())
                {
                    return m;
                }
            }
        }
    }
}

/// A server with TLS on both listeners, its files in the PKI's dir (`server.pem`,
/// `server.key`), checked for changes every second.
pub fn tls_server(pki: &Pki, extra: &[(&str, &str)]) -> super::TestServer {
    let (cert, key) = pki.issue("first");
    let (live_cert, live_key) = (pki.dir.join("server.pem"), pki.dir.join("server.key"));
    install(&cert, &live_cert);
    install(&key, &live_key);
    let (c, k) = (live_cert.to_str().unwrap(), live_key.to_str().unwrap());
    let mut env = vec![
        ("IM_TLS_CERT_FILE", c),
        ("IM_TLS_KEY_FILE", k),
        ("IM_TLS_ADMIN_CERT_FILE", c),
        ("IM_TLS_ADMIN_KEY_FILE", k),
        ("IM_TLS_RELOAD_INTERVAL_SECS", "1"),
    ];
    env.extend_from_slice(extra);
    super::TestServer::start_with(&env)
}
