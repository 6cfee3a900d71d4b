//! Failures and exit codes: each SDK error becomes a sentence naming what went wrong
//! (and the URL when the server could not be reached), with the exit code of its kind.

use std::time::Duration;

use im_client::proto::ErrorCode;
use im_client::ClientError;

/// The exit codes (also listed in `im --help` and cli/README.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Anything not below: a protocol error, stdout failing.
    Failure = 1,
    /// Bad arguments, URL or token input.
    Usage = 2,
    /// The server could not be reached, the connection dropped, or no answer in time.
    Unreachable = 3,
    /// The server refused the login.
    Auth = 4,
    /// The server refused the request.
    Refused = 5,
}

/// An error with the exit code the process ends with.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    /// The exit code.
    pub exit: Exit,
    /// What went wrong, in a sentence.
    pub message: String,
}

impl Failure {
    /// A failure of kind `exit`.
    pub fn new(exit: Exit, message: impl Into<String>) -> Failure {
        Failure {
            exit,
            message: message.into(),
        }
    }
}

/// Where the error happened: the URL and the time allowed, for the messages.
#[derive(Debug, Clone)]
pub struct Context {
    /// The server's URL.
    pub url: String,
    /// The time allowed for an answer.
    pub timeout: Duration,
}

impl Context {
    /// The failure for an error of `Client::connect` (login errors are refusals of the
    /// login).
    pub fn connect_failed(&self, e: ClientError) -> Failure {
        match e {
            ClientError::Server {
                code: ErrorCode::Unauthenticated,
                message,
                ..
            } => Failure::new(
                Exit::Auth,
                format!("the server at {} refused the login: {message}", self.url),
            ),
            ClientError::Server { code, message, .. } => Failure::new(
                Exit::Auth,
                format!("login refused ({}): {message}", code.as_str_name()),
            ),
            e => self.request_failed(e),
        }
    }

    /// The failure for an error of a request on an open connection.
    pub fn request_failed(&self, e: ClientError) -> Failure {
        let url = &self.url;
        match e {
            ClientError::Server { code, message, .. } => {
                Failure::new(Exit::Refused, format!("{}: {message}", code.as_str_name()))
            }
            ClientError::WebSocket(ws) => match io_cause(&*ws) {
                Some(io) => Failure::new(
                    Exit::Unreachable,
                    format!("cannot connect to the server at {url}: {io}"),
                ),
                None => Failure::new(
                    Exit::Unreachable,
                    format!("cannot open a WebSocket to {url}: {ws}"),
                ),
            },
            ClientError::Timeout => self.timed_out(),
            ClientError::Closed { code, reason } => Failure::new(
                Exit::Unreachable,
                match code {
                    Some(c) => format!("the server at {url} closed the connection ({c}): {reason}"),
                    None => format!("the connection to {url} ended: {reason}"),
                },
            ),
            ClientError::Disconnected => {
                Failure::new(Exit::Unreachable, format!("lost the connection to {url}"))
            }
            ClientError::Route(r) => Failure::new(Exit::Unreachable, format!("route: {r}")),
            ClientError::Tls(t) => Failure::new(Exit::Usage, format!("tls: {t}")),
            e @ (ClientError::Decode(_) | ClientError::Protocol(_)) => {
                Failure::new(Exit::Failure, format!("{url}: {e}"))
            }
        }
    }

    /// No answer within the time allowed.
    pub fn timed_out(&self) -> Failure {
        Failure::new(
            Exit::Unreachable,
            format!(
                "no answer from {} within {:?} (see --timeout)",
                self.url, self.timeout
            ),
        )
    }
}

/// The I/O error under a WebSocket error (connection refused, unknown host, ...).
fn io_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        cur = err.source();
    }
    None
}

/// The exit code of an error that reached `main`: its `Failure`'s, else 1.
pub fn exit_code(e: &anyhow::Error) -> Exit {
    e.chain()
        .find_map(|c| c.downcast_ref::<Failure>())
        .map_or(Exit::Failure, |f| f.exit)
}

/// Whether the error is stdout closing under us (`im listen | head`): not a failure.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Context {
        Context {
            url: "ws://h:1/ws".into(),
            timeout: Duration::from_secs(2),
        }
    }

    #[test]
    fn login_refusals_are_auth_failures_with_the_server_text() {
        let f = ctx().connect_failed(ClientError::Server {
            code: ErrorCode::Unauthenticated,
            message: "token expired".into(),
            retry_after_ms: 0,
        });
        assert_eq!(f.exit, Exit::Auth);
        assert!(f.message.contains("token expired"), "{}", f.message);
    }

    #[test]
    fn request_refusals_name_the_code() {
        let f = ctx().request_failed(ClientError::Server {
            code: ErrorCode::NotMember,
            message: "not a member".into(),
            retry_after_ms: 0,
        });
        assert_eq!(f.exit, Exit::Refused);
        assert_eq!(f.message, "NOT_MEMBER: not a member");
    }

    #[test]
    fn exit_codes_are_found_through_context() {
        let e = anyhow::Error::new(Failure::new(Exit::Auth, "x")).context("while sending");
        assert_eq!(exit_code(&e), Exit::Auth);
        assert_eq!(exit_code(&anyhow::anyhow!("plain")), Exit::Failure);
        let pipe = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert!(is_broken_pipe(&anyhow::Error::new(pipe)));
    }
}
