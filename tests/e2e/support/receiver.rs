//! A real HTTP receiver for the webhook and before-send hook tests: an axum server on a
//! loopback port that verifies every request's `X-IM-Signature` with the endpoint's
//! secret (answering 401 to a bad one, as a real receiver would), records what arrived,
//! and answers with a reply the test sets (status, body, delay). It can go down and come
//! back on the same port. [`Receiver::start_tls`] serves it over https (a test CA's
//! certificate) instead.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use im_server::hooks::sign::{Signer, HEADER_EVENT_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// One request as the receiver saw it.
#[derive(Clone, Debug)]
pub struct Received {
    /// The request path.
    pub path: String,
    /// `X-IM-Event-Id`, if sent.
    pub event_id: Option<String>,
    /// `X-IM-Timestamp`, if sent and numeric.
    pub timestamp: Option<u64>,
    /// Whether the signature verified against the secret.
    pub signature_ok: bool,
    /// The body bytes.
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: Instant,
}

impl Received {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("receiver: body is not JSON")
    }
}

/// What the receiver answers.
#[derive(Clone, Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Response body (sent as `application/json`).
    pub body: String,
    /// Wait this long before answering.
    pub delay: Duration,
}

impl Default for Reply {
    fn default() -> Self {
        Reply {
            status: 200,
            body: "{}".into(),
            delay: Duration::ZERO,
        }
    }
}

#[derive(Clone)]
struct Shared {
    signer: Signer,
    log: Arc<Mutex<Vec<Received>>>,
    reply: Arc<Mutex<Reply>>,
    /// Cleared by [`Receiver::down`]: a request on a connection opened before it is
    /// answered 503 and not recorded (new connections are refused).
    up: Arc<std::sync::atomic::AtomicBool>,
}

/// A running receiver.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Shared,
    task: Option<tokio::task::JoinHandle<()>>,
    /// Set when it serves https: the TLS acceptor of every connection.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Receiver {
    /// Starts a receiver on a free loopback port, verifying with `secret`.
    pub async fn start(secret: &str) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("receiver: bind");
        let addr = listener.local_addr().expect("receiver: addr");
        let shared = Shared {
            signer: Signer::new(secret.as_bytes()),
            log: Arc::default(),
            reply: Arc::default(),
            up: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        };
        let mut r = Receiver {
            addr,
            shared,
            task: None,
            tls: None,
        };
        r.serve(listener);
        r
    }

    /// Starts a receiver serving https with the PEM certificate `cert` and key `key`
    /// (e.g. from `support::tls::Pki::issue`), verifying with `secret`.
    pub async fn start_tls(secret: &str, cert: &Path, key: &Path) -> Receiver {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("receiver: reading the certificate")
            .map(|c| c.expect("receiver: certificate"))
            .collect();
        let key = PrivateKeyDer::from_pem_file(key).expect("receiver: reading the key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("receiver: protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("receiver: certificate and key");
        let mut r = Receiver::start(secret).await;
        r.down();
        r.tls = Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)));
        r.up().await;
        r
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let shared = self.shared.clone();
        let app = axum::Router::new().fallback(
            move |uri: axum::http::Uri, headers: HeaderMap, body: Bytes| {
                let shared = shared.clone();
                async move { handle(shared, uri.path().to_owned(), headers, body).await }
            },
        );
        let Some(acceptor) = self.tls.clone() else {
            self.task = Some(tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            }));
            return;
        };
        self.task = Some(tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // A failed handshake (e.g. a client not trusting the CA) ends the
                    // connection; the client sees the error.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                        let mut app = app.clone();
                        tower_service::Service::call(&mut app, req.map(axum::body::Body::new))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        }));
    }

    /// The URL of `path` on this receiver (`https://localhost:PORT` when it serves TLS:
    /// the test certificates name localhost).
    pub fn url(&self, path: &str) -> String {
        match self.tls {
            Some(_) => format!("https://localhost:{}{path}", self.addr.port()),
            None => format!("http://{}{path}", self.addr),
        }
    }

    /// Sets what every following request gets.
    pub fn set_reply(&self, reply: Reply) {
        *self.shared.reply.lock().expect("reply lock") = reply;
    }

    /// Everything received so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.shared.log.lock().expect("log lock").clone()
    }

    /// Waits until `pred` holds over what was received, or panics after `timeout`.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.received();
            if pred(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "receiver: timed out waiting for {what}; got {} requests",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops listening (connections refused) until [`Receiver::up`].
    pub fn down(&mut self) {
        self.shared
            .up
            .store(false, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn up(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("receiver: rebind {}: {e}", self.addr),
            }
        };
        self.shared
            .up
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.serve(listener);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.down();
    }
}

async fn handle(shared: Shared, path: String, headers: HeaderMap, body: Bytes) -> Response {
    if !shared.up.load(std::sync::atomic::Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let timestamp = header(HEADER_TIMESTAMP).and_then(|t| t.parse::<u64>().ok());
    let signature_ok = match (timestamp, header(HEADER_SIGNATURE)) {
        (Some(ts), Some(sig)) => shared.signer.verify(ts, &body, &sig),
        _ => false,
    };
    shared.log.lock().expect("log lock").push(Received {
        path,
        event_id: header(HEADER_EVENT_ID),
        timestamp,
        signature_ok,
        body: body.to_vec(),
        at: Instant::now(),
    });
    if !signature_ok {
        return (StatusCode::UNAUTHORIZED, "bad signature").into_response();
    }
    let reply = shared.reply.lock().expect("reply lock").clone();
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        reply.body,
    )
        .into_response()
}
