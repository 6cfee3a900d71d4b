//! `POST /admin/v1/messages`: the operator's SYSTEM or bot message to a user, a group or
//! a list of users. The body ([`PostMessage`], unknown fields refused by name) is checked
//! here and turned into a [`ServerMessage`]; the pipeline commits it through the
//! persistence writer and pushes it (`pipeline::announce`). The `Idempotency-Key` header
//! becomes each message's client_msg_id, so a retry answers the first commit.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use im_admin_api::{MessageKind, PostMessage, PostedMessage, PostedMessages, IDEMPOTENCY_KEY};

use super::diag::{self, Refused};
use super::error;
use crate::pipeline::announce::{Author, PostError, Posted, ServerMessage, Target, MAX_USERS};
use crate::Node;

/// Largest request body: the longest payload in base64, a full user list and some room.
pub fn body_limit(max_frame_bytes: u32) -> usize {
    let payload = (max_frame_bytes as usize).div_ceil(3) * 4;
    payload + MAX_USERS * (im_proto::MAX_ID_LEN + 8) + 16 * 1024
}

/// The handler: 200 with the results, or 400 naming the field, 401 (the middleware),
/// 403 (a bot outside the group), 404 (no such group), 413 (body too large), 503 with
/// `Retry-After` (store failing, queue full).
pub async fn post(State(node): State<Arc<Node>>, headers: HeaderMap, body: Body) -> Response {
    let limit = body_limit(node.config.limits.max_frame_bytes);
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return count(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body: larger than {limit} bytes"),
            ))
        }
    };
    let message = match request(&headers, &bytes) {
        Ok(m) => m,
        Err(r) => return count(r.into_response()),
    };
    let what = match &message.to {
        Target::User(_) => "user",
        Target::Group(_) => "group",
        Target::Users(_) => "users",
    };
    let kind = match message.from {
        Author::System => "system",
        Author::Bot(_) => "bot",
    };
    match node.pipeline.post_server_message(message).await {
        Ok(posted) => {
            let n = posted.len() as u64;
            metrics::counter!("im_admin_messages_total", "kind" => kind, "target" => what)
                .increment(n);
            tracing::info!(kind, target = what, messages = n, "server message posted");
            Json(PostedMessages {
                results: posted.into_iter().map(view).collect(),
            })
            .into_response()
        }
        Err(e) => count(refusal(e)),
    }
}

/// Counts a refused request in `im_admin_message_refusals_total{status}`.
fn count(r: Response) -> Response {
    metrics::counter!("im_admin_message_refusals_total", "status" => r.status().as_str().to_owned())
        .increment(1);
    r
}

fn view(p: Posted) -> PostedMessage {
    PostedMessage {
        conversation_id: p.conversation_id,
        msg_id: p.msg_id,
        seq: p.seq,
        duplicate: p.duplicate,
    }
}

fn refusal(e: PostError) -> Response {
    match &e {
        PostError::Bad(..) => error(StatusCode::BAD_REQUEST, e.to_string()),
        PostError::NoGroup(_) => error(StatusCode::NOT_FOUND, e.to_string()),
        PostError::Forbidden(_) => error(StatusCode::FORBIDDEN, e.to_string()),
        PostError::Unavailable(_, retry) => {
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            let secs = retry.as_secs_f64().ceil().max(1.0) as u64;
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            r
        }
        PostError::Internal(m) => {
            tracing::warn!(error = %m, "server message failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    }
}

fn bad(field: &str, why: impl std::fmt::Display) -> Refused {
    Refused(StatusCode::BAD_REQUEST, format!("{field}: {why}"))
}

/// The header and the body read into a [`ServerMessage`] (shape only; ids, sizes and
/// the group are checked by the pipeline). Errors name the field or header.
pub fn request(headers: &HeaderMap, body: &[u8]) -> Result<ServerMessage, Refused> {
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => String::new(),
        Some(v) => match v.to_str() {
            Ok(k) if !k.is_empty() && crate::pipeline::announce::valid_key(k) => k.to_owned(),
            _ => {
                return Err(bad(
                    IDEMPOTENCY_KEY,
                    "expected 1 to 128 bytes of visible ASCII",
                ))
            }
        },
    };
    let req: PostMessage = diag::body(body)?;
    let to = match (req.to_user, req.group_id, req.users) {
        (Some(u), None, None) => Target::User(u),
        (None, Some(g), None) => Target::Group(g),
        (None, None, Some(list)) => Target::Users(list),
        (None, None, None) => return Err(bad("to_user", "give one of to_user, group_id, users")),
        _ => return Err(bad("to_user", "give only one of to_user, group_id, users")),
    };
    let from = match (req.kind, req.from) {
        (MessageKind::System, None) => Author::System,
        (MessageKind::System, Some(_)) => {
            return Err(bad(
                "from",
                "only for kind \"bot\" (SYSTEM messages come from \"system\")",
            ))
        }
        (MessageKind::Bot, Some(b)) => Author::Bot(b),
        (MessageKind::Bot, None) => {
            return Err(bad("from", "kind \"bot\" needs the bot's user id"))
        }
    };
    let payload = match (req.payload, req.payload_base64) {
        (Some(text), None) => text.into_bytes().into(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| bad("payload_base64", format!("not standard base64: {e}")))?
            .into(),
        (None, None) => return Err(bad("payload", "give payload or payload_base64")),
        (Some(_), Some(_)) => {
            return Err(bad("payload", "give only one of payload, payload_base64"))
        }
    };
    Ok(ServerMessage {
        to,
        from,
        payload,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_header() -> axum::http::HeaderName {
        axum::http::HeaderName::from_static("idempotency-key")
    }

    fn refused(headers: &HeaderMap, body: &str) -> String {
        match request(headers, body.as_bytes()) {
            Ok(m) => panic!("{body}: accepted as {m:?}"),
            Err(r) => {
                assert_eq!(r.0, StatusCode::BAD_REQUEST, "{body}");
                r.1
            }
        }
    }

    #[test]
    fn bodies_are_refused_naming_the_field() {
        let h = HeaderMap::new();
        for (body, field) in [
            (
                r#"{"to_user":"a","kind":"system","payload":"x","extra":1}"#,
                "extra",
            ),
            (
                r#"{"to_user":"a","group_id":"g","kind":"system","payload":"x"}"#,
                "to_user",
            ),
            (r#"{"kind":"system","payload":"x"}"#, "to_user"),
            (r#"{"to_user":"a","kind":"loud","payload":"x"}"#, "kind"),
            (r#"{"to_user":"a","payload":"x"}"#, "kind"),
            (r#"{"to_user":"a","kind":"bot","payload":"x"}"#, "from"),
            (
                r#"{"to_user":"a","kind":"system","from":"b","payload":"x"}"#,
                "from",
            ),
            (r#"{"to_user":"a","kind":"system"}"#, "payload"),
            (
                r#"{"to_user":"a","kind":"system","payload":"x","payload_base64":"eA=="}"#,
                "payload",
            ),
            (
                r#"{"to_user":"a","kind":"system","payload_base64":"!!"}"#,
                "payload_base64",
            ),
            (r#"{"to_user":5,"kind":"system","payload":"x"}"#, "to_user"),
            (r#"{"users":"a","kind":"system","payload":"x"}"#, "users"),
            (r#"["a"]"#, "body"),
        ] {
            let e = refused(&h, body);
            assert!(e.contains(field), "{body}: {e}");
        }
        let mut h = HeaderMap::new();
        h.insert(key_header(), HeaderValue::from_static("has space"));
        let e = refused(&h, r#"{"to_user":"a","kind":"system","payload":"x"}"#);
        assert!(e.starts_with(IDEMPOTENCY_KEY), "{e}");
    }

    #[test]
    fn good_bodies_parse() {
        let mut h = HeaderMap::new();
        h.insert(key_header(), HeaderValue::from_static("k-1"));
        let m = request(
            &h,
            br#"{"users":["a","b"],"kind":"bot","from":"bot1","payload_base64":"AAE="}"#,
        )
        .unwrap();
        assert_eq!(m.to, Target::Users(vec!["a".into(), "b".into()]));
        assert_eq!(m.from, Author::Bot("bot1".into()));
        assert_eq!(&m.payload[..], &[0, 1]);
        assert_eq!(m.key, "k-1");
        assert!(body_limit(64 * 1024) > 64 * 1024 * 4 / 3);
    }
}
