//! TLS of `wss://` connections: the trust anchors. By default the Mozilla roots
//! (webpki-roots, through tungstenite), so a server with a public certificate needs
//! nothing; [`TlsConfig::from_ca_file`] trusts the CA certificates of a PEM file instead
//! (a private CA, a test CA). rustls on ring, as the server.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::ClientError;

/// The TLS client settings of `wss://` connections (cheap to clone).
#[derive(Clone)]
pub struct TlsConfig(pub(crate) Arc<rustls::ClientConfig>);

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsConfig")
    }
}

impl PartialEq for TlsConfig {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TlsConfig {}

impl TlsConfig {
    /// Trusts exactly the CA certificates in the PEM file `path`; the error names the
    /// file and what is wrong with it.
    pub fn from_ca_file(path: &Path) -> Result<TlsConfig, ClientError> {
        let bad = |m: String| ClientError::Tls(format!("CA file {}: {m}", path.display()));
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))? {
            let cert = cert.map_err(|e| bad(e.to_string()))?;
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(bad("no CERTIFICATE in the file (PEM expected)".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsConfig(Arc::new(config)))
    }
}
