//! TLS of the calls out (https:// webhooks and before-send hook): one rustls client
//! configuration on the ring provider, trusting the webpki roots plus an optional PEM
//! CA file (`webhooks.ca_file`, `hooks.before_send.ca_file`).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// Most CA certificates read from one `ca_file`.
const MAX_CA_CERTS: usize = 1024;

/// The rustls client configuration for https:// endpoints: the webpki roots, plus the
/// PEM certificates of `ca_file` when it is not empty. The error names the file.
pub fn client_config(ca_file: &str) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let ca_file = ca_file.trim();
    if !ca_file.is_empty() {
        let mut added = 0usize;
        let certs = CertificateDer::pem_file_iter(ca_file)
            .map_err(|e| format!("{ca_file}: cannot read PEM certificates: {e}"))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("{ca_file}: bad PEM certificate: {e}"))?;
            if added >= MAX_CA_CERTS {
                return Err(format!("{ca_file}: more than {MAX_CA_CERTS} certificates"));
            }
            roots
                .add(cert)
                .map_err(|e| format!("{ca_file}: unusable CA certificate: {e}"))?;
            added += 1;
        }
        if added == 0 {
            return Err(format!("{ca_file}: no PEM certificate in it"));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS protocol versions: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// `builder` with the TLS configuration of [`client_config`] (`ca_file` may be empty).
pub fn with_tls(
    builder: reqwest::ClientBuilder,
    ca_file: &str,
) -> Result<reqwest::ClientBuilder, String> {
    Ok(builder.tls_backend_preconfigured(client_config(ca_file)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_alone_build() {
        assert!(client_config("").is_ok());
    }

    #[test]
    fn missing_or_empty_ca_file_is_named() {
        let err = client_config("/nonexistent/ca.pem").unwrap_err();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        let dir = std::env::temp_dir().join(format!("im-hooks-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = client_config(empty.to_str().unwrap()).unwrap_err();
        assert!(err.contains("no PEM certificate"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
