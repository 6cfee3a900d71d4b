//! The admin API of im-server as one contract, on the model of tokio-console's
//! `console-api`: the serde types of every route's request and answer, the route paths
//! ([`routes`]), the error body ([`ErrorBody`]) and, behind the `client` feature, the HTTP
//! client the console and the bench use ([`client::AdminClient`]).
//!
//! The server serializes these types, so what it sends is what is declared here. Every
//! answer type is `#[serde(default)]` on the read side: a field an older node leaves out
//! takes its default and a field a newer node adds is ignored, so tools keep working
//! across versions (the API only ever gains fields). Request bodies are the opposite:
//! `#[serde(deny_unknown_fields)]`, so a misspelt field is refused by name.
//! Shapes and meanings: `docs/admin-api.md`.

use serde::{Deserialize, Deserializer, Serialize};

pub mod diag;
pub mod homes;
pub mod hooks;
pub mod messages;
pub mod nodes;
pub mod overview;
pub mod routes;
pub mod trace;
pub mod users;
pub mod webhooks;

#[cfg(feature = "client")]
pub mod client;

pub use diag::{
    GlobalLevel, HeapProfileBundle, HeapTopFunction, LogFile, LogFilter, LogFilterRemoved,
    LogFilters, LogTailLine, LogWindow, Logs, ProfileBundle, SetLogFilter, SetLogLevel,
    TopFunction,
};
pub use homes::{Home, Homes, HomesMoved, MoveHome, MoveHomes};
pub use hooks::{
    BeforeSendAction, BeforeSendAnswer, BeforeSendRequest, HookStatus, MAX_REASON_BYTES,
};
pub use messages::{MessageKind, PostMessage, PostedMessage, PostedMessages, IDEMPOTENCY_KEY};
pub use nodes::{
    Connection, ConnectionList, Group, GroupMember, Kicked, Memory, Revoked, RouteAnswer,
    RouteRegion, SecretsReloaded, SlowConsumers,
};
pub use overview::{
    AllocStats, Capacity, ClusterInfo, ClusterNode, ClusterSummary, NodeReport, Overview,
    ProcessStats, Refusals, RegionLag, RuntimeStats, StageLatency, TaskStats,
};
pub use trace::{valid_msg_id, MessageTrace, TraceStage};
pub use users::{
    Backlog, StageTiming, UserDiag, UserLogFilter, UserMessage, UserNode, UserRefusal, UserSession,
};
pub use webhooks::{
    EventMessage, ParkedEvent, ParkedEvents, Redeliver, Redelivered, TestFired, WebhookEndpoint,
    WebhookEvent, Webhooks,
};

/// The body of every error answer: `{"error": "<message>"}`, with a 4xx or 5xx status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ErrorBody {
    /// What went wrong, naming the parameter or field when the request was at fault.
    pub error: String,
}

impl ErrorBody {
    /// An error body with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        ErrorBody {
            error: message.into(),
        }
    }
}

/// The message of the 404 a node answers for a route it does not have.
pub const NO_SUCH_ROUTE: &str = "no such route";

/// Reads a text field leniently: a string, a number or a bool as its text, null as "".
fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_and_missing_fields_decode() {
        let o: Overview =
            serde_json::from_str(r#"{"node_id":"a","new_field":{"x":1},"memory":null}"#).unwrap();
        assert_eq!(o.node_id, "a");
        assert_eq!(o.memory, None);
        let l: Logs = serde_json::from_str(
            r#"{"window":{"start":3,"end":"05:00"},"files":[{"name":"a","state":null}]}"#,
        )
        .unwrap();
        assert_eq!(l.window.start, "3");
        assert_eq!(l.files[0].state, "");
    }

    #[test]
    fn request_bodies_refuse_unknown_fields() {
        let e = serde_json::from_str::<SetLogFilter>(r#"{"level":"debug","ttl":5}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `ttl`"), "{e}");
        let f: SetLogFilter = serde_json::from_str(r#"{"level":"debug"}"#).unwrap();
        assert_eq!(f.ttl_secs, None);
        assert!(serde_json::from_str::<SetLogLevel>(r#"{"level":"info","x":1}"#).is_err());
    }

    #[test]
    fn single_node_cluster_keeps_its_short_shape() {
        let v = serde_json::to_value(ClusterInfo::default()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"enabled": false, "degraded": null, "nodes": [], "summary": null})
        );
    }
}
