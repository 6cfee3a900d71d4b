//! [`Refusal`]: a request the server will not carry out, as the `Error` frame its
//! requester gets. The pipeline's checks and the writer's commit answers both produce
//! them; the gateway sends them and counts them.

use im_proto::{error_frame, Body, ErrorCode, Frame};

use crate::store::StoreError;

/// A frame the pipeline refused; the gateway sends it as `Error` and counts it.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The error code.
    pub code: ErrorCode,
    /// Human-readable message.
    pub message: String,
    /// Retry hint (OVERLOADED).
    pub retry_after_ms: u32,
    /// `im_bad_frames_total` reason, when it counts as bad input.
    pub bad_reason: Option<&'static str>,
}

impl Refusal {
    /// A malformed frame: BAD_FRAME, counted as `protocol`.
    pub(crate) fn bad(message: impl Into<String>) -> Self {
        Refusal {
            code: ErrorCode::BadFrame,
            message: message.into(),
            retry_after_ms: 0,
            bad_reason: Some("protocol"),
        }
    }

    /// A refusal with `code` and no retry hint.
    pub(crate) fn code(
        code: ErrorCode,
        message: impl Into<String>,
        bad_reason: Option<&'static str>,
    ) -> Self {
        Refusal {
            code,
            message: message.into(),
            retry_after_ms: 0,
            bad_reason,
        }
    }

    /// The answer to a store error: the client's own mistake, OVERLOADED with a retry
    /// hint for an unavailable store, else INTERNAL (logged).
    pub(crate) fn store(e: StoreError) -> Self {
        match e {
            StoreError::GroupNotFound(g) => {
                Refusal::code(ErrorCode::NotFound, format!("group {g} not found"), None)
            }
            StoreError::NotMember(g) => Refusal::code(
                ErrorCode::NotMember,
                format!("not a member of group {g}"),
                Some("not_member"),
            ),
            StoreError::GroupExists(g) => Refusal::bad(format!("group {g} already exists")),
            StoreError::GroupFull(g, n) => {
                Refusal::bad(format!("group {g} would exceed {n} members"))
            }
            StoreError::Forbidden(m) => Refusal::code(ErrorCode::Forbidden, m, Some("forbidden")),
            StoreError::BadRequest(m) => Refusal::bad(m),
            StoreError::Unavailable(reason) => Refusal {
                code: ErrorCode::Overloaded,
                message: format!("store unavailable ({reason}), retry"),
                retry_after_ms: 1000,
                bad_reason: None,
            },
            e @ StoreError::Timeout(_) => Refusal {
                code: ErrorCode::Overloaded,
                message: format!("{e}, retry"),
                retry_after_ms: 1000,
                bad_reason: None,
            },
            // Every pooled connection stayed busy past the acquire timeout (a flood of
            // reads, say every member of a large group syncing at once): the store is
            // busy, not broken, so the client is told to come back, and nothing is
            // logged per request (a flood of them would be a flood of lines).
            StoreError::Db(sqlx::Error::PoolTimedOut) => Refusal {
                code: ErrorCode::Overloaded,
                message: "store busy, retry".into(),
                retry_after_ms: 1000,
                bad_reason: None,
            },
            other => {
                tracing::error!(error = %other, "store error");
                Refusal::code(ErrorCode::Internal, "internal error", None)
            }
        }
    }

    /// A Send the store cannot take now (a store fault or low disk, `reason`):
    /// OVERLOADED, retried by the client with the same client_msg_id.
    pub(crate) fn store_unavailable(reason: &str, retry_after_ms: u32) -> Self {
        Refusal {
            code: ErrorCode::Overloaded,
            message: format!("store unavailable ({reason}), retry with the same client_msg_id"),
            retry_after_ms,
            bad_reason: None,
        }
    }

    /// The `Error` frame for this refusal.
    pub fn to_frame(&self, req_id: u64) -> Frame {
        let mut f = error_frame(req_id, self.code, self.message.clone());
        if let Some(Body::Error(e)) = f.body.as_mut() {
            e.retry_after_ms = self.retry_after_ms;
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_pool_is_overloaded_with_a_retry_hint_not_internal() {
        let r = Refusal::store(StoreError::Db(sqlx::Error::PoolTimedOut));
        assert_eq!(r.code, ErrorCode::Overloaded);
        assert!(r.retry_after_ms > 0);
        let r = Refusal::store(StoreError::Db(sqlx::Error::RowNotFound));
        assert_eq!(r.code, ErrorCode::Internal);
    }
}
