//! Listen's TLS: the rustls acceptor of one listener (ring provider, TLS 1.2 and 1.3,
//! ALPN `http/1.1`), its certificate (a [`CertifiedKey`] behind a lock that each
//! handshake reads once), the bounded handshake and the file watch that swaps in a
//! changed certificate for the next handshakes without touching open connections. A
//! bad new pair (unreadable, no certificate, a key that does not match) keeps the old
//! one and logs why.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::Listener;
use crate::config::Tls;

/// Why a certificate and key pair could not be loaded; names the config key and file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("config key `{key}` = {path}: {message}")]
    File {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the pair (key type unsupported, key and certificate disagree).
    #[error("config keys `{cert_key}` = {cert} and `{key_key}` = {key}: {message}")]
    Pair {
        /// The certificate's config key.
        cert_key: &'static str,
        /// The certificate file.
        cert: PathBuf,
        /// The key's config key.
        key_key: &'static str,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        message: String,
    },
    /// The server configuration could not be built.
    #[error("TLS set-up: {0}")]
    Setup(String),
}

/// A file's modification time, inode and size.
type Stamp = (Option<SystemTime>, u64, u64);

/// The files of one listener's certificate, with their config keys.
#[derive(Debug, Clone)]
struct Files {
    cert_key: &'static str,
    cert: PathBuf,
    key_key: &'static str,
    key: PathBuf,
}

impl Files {
    /// What identifies both files' contents cheaply: modification time, inode and size
    /// (a rename over the file changes the inode even within the clock's resolution);
    /// `None` for a file that cannot be read.
    fn stamp(&self) -> [Option<Stamp>; 2] {
        use std::os::unix::fs::MetadataExt;
        let stamp = |p: &Path| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok(), m.ino(), m.len()))
        };
        [stamp(&self.cert), stamp(&self.key)]
    }

    /// Reads and checks the pair.
    fn load(&self, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
        let file_err = |key, path: &Path, message: String| TlsError::File {
            key,
            path: path.to_owned(),
            message,
        };
        let chain = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|e| file_err(self.cert_key, &self.cert, e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file_err(self.cert_key, &self.cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(file_err(
                self.cert_key,
                &self.cert,
                "no CERTIFICATE in the file (PEM expected)".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| {
            file_err(
                self.key_key,
                &self.key,
                format!("{e} (a PEM private key expected: PKCS#8, PKCS#1 or SEC1)"),
            )
        })?;
        CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Pair {
            cert_key: self.cert_key,
            cert: self.cert.clone(),
            key_key: self.key_key,
            key: self.key.clone(),
            message: match e {
                rustls::Error::InconsistentKeys(_) => {
                    "the private key does not belong to the certificate (the first in its file)"
                        .into()
                }
                e => e.to_string(),
            },
        })
    }
}

/// The certificate the next handshakes use.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .map(|c| c.clone())
                .unwrap_or_else(|p| p.into_inner().clone()),
        )
    }
}

/// The listener's TLS series exported at 0 from the start, so rates and alerts see them
/// before the first event.
fn register_at_zero(listener: &'static str) {
    metrics::counter!("im_tls_handshakes_total", "listener" => listener).absolute(0);
    for reason in ["timeout", "error"] {
        metrics::counter!("im_tls_handshake_failures_total", "listener" => listener, "reason" => reason)
            .absolute(0);
    }
    for result in ["ok", "error"] {
        metrics::counter!("im_tls_reloads_total", "listener" => listener, "result" => result)
            .absolute(0);
    }
}

/// One listener's TLS: the acceptor, its swappable certificate, the handshake bound.
pub struct TlsListener {
    which: Listener,
    acceptor: TlsAcceptor,
    current: Arc<Current>,
    provider: Arc<CryptoProvider>,
    files: Files,
    handshake_timeout: Duration,
    reload_interval: Duration,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("listener", &self.which.label())
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// The TLS of listener `which` from `[tls]`, `None` when its files are not set;
    /// an error names the key and file at fault.
    pub fn from_config(tls: &Tls, which: Listener) -> Result<Option<Arc<TlsListener>>, TlsError> {
        let files = match which {
            Listener::Client if tls.client_on() => Files {
                cert_key: "tls.cert_file",
                cert: tls.cert_file.clone(),
                key_key: "tls.key_file",
                key: tls.key_file.clone(),
            },
            Listener::Admin if tls.admin_on() => Files {
                cert_key: "tls.admin_cert_file",
                cert: tls.admin_cert_file.clone(),
                key_key: "tls.admin_key_file",
                key: tls.admin_key_file.clone(),
            },
            _ => return Ok(None),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let first = files.load(&provider)?;
        register_at_zero(which.label());
        let current = Arc::new(Current(RwLock::new(Arc::new(first))));
        let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Arc::new(TlsListener {
            which,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            current,
            provider,
            files,
            handshake_timeout: Duration::from_secs(u64::from(tls.handshake_timeout_secs)),
            reload_interval: Duration::from_secs(u64::from(tls.reload_interval_secs)),
        })))
    }

    /// The TLS handshake on an accepted socket, within the handshake timeout; counted
    /// (`im_tls_handshakes_total`, `im_tls_handshake_failures_total{reason}`).
    pub async fn handshake(&self, tcp: TcpStream) -> Option<TlsStream<TcpStream>> {
        let listener = self.which.label();
        match tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => {
                metrics::counter!("im_tls_handshakes_total", "listener" => listener).increment(1);
                Some(stream)
            }
            Ok(Err(e)) => {
                metrics::counter!("im_tls_handshake_failures_total", "listener" => listener, "reason" => "error")
                    .increment(1);
                tracing::debug!(listener, error = %e, "tls handshake failed");
                None
            }
            Err(_) => {
                metrics::counter!("im_tls_handshake_failures_total", "listener" => listener, "reason" => "timeout")
                    .increment(1);
                None
            }
        }
    }

    /// Loads the pair again and, when it is good, serves it to the next handshakes;
    /// counted in `im_tls_reloads_total{result}`. Open connections keep their session.
    pub fn reload(&self) -> Result<(), TlsError> {
        let listener = self.which.label();
        match self.files.load(&self.provider) {
            Ok(key) => {
                let mut slot = self.current.0.write().unwrap_or_else(|p| p.into_inner());
                *slot = Arc::new(key);
                metrics::counter!("im_tls_reloads_total", "listener" => listener, "result" => "ok")
                    .increment(1);
                Ok(())
            }
            Err(e) => {
                metrics::counter!("im_tls_reloads_total", "listener" => listener, "result" => "error")
                    .increment(1);
                Err(e)
            }
        }
    }

    /// Checks the files (modification time, inode, size) every
    /// `tls.reload_interval_secs` and reloads on a change; a failed reload keeps the old certificate and is logged (the
    /// next change of either file tries again). Runs until aborted.
    pub async fn watch(self: Arc<Self>) {
        let mut seen = self.files.stamp();
        loop {
            tokio::time::sleep(self.reload_interval).await;
            let now = self.files.stamp();
            if now == seen {
                continue;
            }
            seen = now;
            self.reload_logged("file change");
        }
    }

    /// [`TlsListener::reload`], logged with what caused it.
    pub fn reload_logged(&self, cause: &'static str) {
        let listener = self.which.label();
        match self.reload() {
            Ok(()) => tracing::info!(
                listener,
                cause,
                cert = %self.files.cert.display(),
                "tls certificate reloaded: new handshakes use it"
            ),
            Err(e) => tracing::warn!(
                listener,
                cause,
                error = %e,
                "tls certificate not reloaded: the previous one stays in use"
            ),
        }
    }
}
