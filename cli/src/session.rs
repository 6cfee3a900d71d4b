//! The session: the token from the flags, environment or a file, the SDK config built
//! from the global options, and the logged-in `Client` every command runs on.

use std::path::Path;

use im_client::{Client, ClientConfig};

use crate::args::Global;
use crate::failure::{Context, Exit, Failure};

/// Largest token file read (a JWT is a few hundred bytes).
const MAX_TOKEN_FILE: u64 = 64 * 1024;

/// A logged-in client and the context its errors are reported in.
pub struct Session {
    /// The SDK client.
    pub client: Client,
    /// The URL and timeout, for error messages.
    pub ctx: Context,
}

impl Session {
    /// Reads the token and logs in, within `--timeout`.
    pub async fn open(g: &Global) -> Result<Session, Failure> {
        let token = token(g)?;
        let ctx = Context {
            url: g.url.clone(),
            timeout: g.timeout,
        };
        let mut cfg = ClientConfig::new(g.url.clone(), token);
        cfg.device_id = g.device.clone();
        cfg.request_timeout = g.timeout;
        if let Some(ca) = &g.ca {
            let tls = im_client::TlsConfig::from_ca_file(ca)
                .map_err(|e| Failure::new(Exit::Usage, e.to_string()))?;
            cfg.tls = Some(tls);
        }
        let client = match tokio::time::timeout(g.timeout, Client::connect(cfg)).await {
            Err(_) => return Err(ctx.timed_out()),
            Ok(Err(e)) => return Err(ctx.connect_failed(e)),
            Ok(Ok(c)) => c,
        };
        Ok(Session { client, ctx })
    }

    /// Runs one request within `--timeout`, its SDK error turned into a `Failure`.
    pub async fn call<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, im_client::ClientError>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.ctx.timeout, request).await {
            Err(_) => Err(self.ctx.timed_out()),
            Ok(Err(e)) => Err(self.ctx.request_failed(e)),
            Ok(Ok(v)) => Ok(v),
        }
    }

    /// Flushes pending delivery acknowledgements and closes the connection.
    pub async fn close(self) {
        self.client.close().await;
    }
}

/// The token: `--token-file`, else `--token` / `IM_TOKEN`.
fn token(g: &Global) -> Result<String, Failure> {
    let token = match (&g.token_file, &g.token) {
        (Some(path), _) => read_token_file(path)?,
        (None, Some(t)) => t.trim().to_owned(),
        (None, None) => {
            return Err(Failure::new(
                Exit::Usage,
                "no token: pass --token, set IM_TOKEN or use --token-file \
                 (make one with `im-server token --user NAME`)",
            ))
        }
    };
    if token.is_empty() {
        return Err(Failure::new(Exit::Usage, "the token is empty"));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Failure::new(
            Exit::Usage,
            "the token has spaces or control characters in it (one JWT expected)",
        ));
    }
    Ok(token)
}

fn read_token_file(path: &Path) -> Result<String, Failure> {
    use std::io::Read as _;
    let shown = path.display();
    let unreadable = |e: std::io::Error| {
        Failure::new(
            Exit::Usage,
            format!("cannot read the token file {shown}: {e}"),
        )
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_TOKEN_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_TOKEN_FILE {
        return Err(Failure::new(
            Exit::Usage,
            format!("the token file {shown} is larger than {MAX_TOKEN_FILE} bytes"),
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| Failure::new(Exit::Usage, format!("the token file {shown} is not text")))?;
    Ok(text.trim().to_owned())
}
