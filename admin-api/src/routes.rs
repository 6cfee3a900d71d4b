//! The routes' paths, in axum's syntax (`{name}` for a path parameter), so the server's
//! router and the clients name each route once. [`segments`] fills the parameters in.

/// `GET`: `200 ok` while the process runs (no token).
pub const HEALTHZ: &str = "/healthz";
/// `GET`: `200 ready` or `503 not ready: <reason>` (no token).
pub const READYZ: &str = "/readyz";
/// `GET`: Prometheus text format.
pub const METRICS: &str = "/metrics";
/// `GET`: [`crate::Overview`].
pub const OVERVIEW: &str = "/admin/v1/overview";
/// `GET ?sort=&limit=&user=`: [`crate::ConnectionList`].
pub const CONNECTIONS: &str = "/admin/v1/connections";
/// `GET`: one [`crate::Connection`]; `DELETE`: kicks it, [`crate::Kicked`].
pub const CONNECTION: &str = "/admin/v1/connections/{conn_id}";
/// `GET ?sort=&limit=&user=`: [`crate::SlowConsumers`].
pub const SLOW_CONSUMERS: &str = "/admin/v1/slow-consumers";
/// `GET`: [`crate::Memory`].
pub const MEMORY: &str = "/admin/v1/memory";
/// `GET`: [`crate::Group`].
pub const GROUP: &str = "/admin/v1/groups/{group_id}";
/// `POST`: revokes a user's tokens, [`crate::Revoked`].
pub const REVOKE: &str = "/admin/v1/users/{uid}/revoke";
/// `GET ?backlog=&messages=`: [`crate::UserDiag`], the user's diagnosis over the cluster.
pub const USER: &str = "/admin/v1/users/{uid}";
/// `GET ?seconds=&frequency=&format=`: an SVG, a pprof file or a [`crate::ProfileBundle`].
pub const PROFILE_CPU: &str = "/admin/v1/profile/cpu";
/// `GET ?seconds=&format=`: an SVG, a pprof file or a [`crate::HeapProfileBundle`].
pub const PROFILE_HEAP: &str = "/admin/v1/profile/heap";
/// `GET`: [`crate::LogFilters`].
pub const LOG_FILTERS: &str = "/admin/v1/log-filters";
/// `PUT` [`crate::SetLogFilter`]: [`crate::LogFilter`]; `DELETE`: [`crate::LogFilterRemoved`].
pub const LOG_FILTER: &str = "/admin/v1/log-filters/{uid}";
/// `PUT` [`crate::SetLogLevel`]: [`crate::GlobalLevel`].
pub const LOG_LEVEL: &str = "/admin/v1/log-level";
/// `GET`: [`crate::Logs`].
pub const LOGS: &str = "/admin/v1/logs";
/// `GET ?uid=&level=&backlog=`: a stream of [`crate::LogTailLine`] (chunked NDJSON) until
/// the client goes away.
pub const LOGS_TAIL: &str = "/admin/v1/logs/tail";
/// `POST` [`crate::PostMessage`] (header `Idempotency-Key`): [`crate::PostedMessages`].
pub const MESSAGES: &str = "/admin/v1/messages";
/// `GET`: [`crate::MessageTrace`], one message's stage timeline from every node
/// (`msg_id`: 32 hex digits).
pub const MESSAGE_TRACE: &str = "/admin/v1/messages/{msg_id}/trace";
/// `POST` (no body): [`crate::SecretsReloaded`], the token keys and admin token read
/// again; 400 with the reason when they do not load (the old ones stay).
pub const RELOAD: &str = "/admin/v1/reload";
/// `GET`: [`crate::Webhooks`], the endpoints, their queues and the outbox.
pub const WEBHOOKS: &str = "/admin/v1/webhooks";
/// `GET ?endpoint=&limit=`: [`crate::ParkedEvents`].
pub const WEBHOOKS_PARKED: &str = "/admin/v1/webhooks/parked";
/// `POST` [`crate::Redeliver`]: [`crate::Redelivered`].
pub const WEBHOOKS_REDELIVER: &str = "/admin/v1/webhooks/parked/redeliver";
/// `POST`: sends a `webhook.test` event to the endpoint now, [`crate::TestFired`].
pub const WEBHOOK_TEST: &str = "/admin/v1/webhooks/{name}/test";
/// `GET`: this node's view of home moves; `POST`: move every conversation homed in a
/// region (multi-region mode).
pub const HOMES: &str = "/admin/v1/homes";
/// `GET`: a conversation's home, epoch and fence; `POST`: move its home here.
pub const HOME: &str = "/admin/v1/homes/{conversation}";
/// `GET ?avoid=ID,ID` on the client listener (no token): [`crate::RouteAnswer`].
pub const ROUTE: &str = "/v1/route";

/// The path segments of `route` with its `{name}` parameters replaced by `args`, in order
/// (a parameter without an argument stays as written). The caller percent-encodes them.
pub fn segments<'a>(route: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut args = args.iter();
    route
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.starts_with('{') && s.ends_with('}') {
                args.next().copied().unwrap_or(s)
            } else {
                s
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_filled_in_order() {
        assert_eq!(segments(OVERVIEW, &[]), ["admin", "v1", "overview"]);
        assert_eq!(
            segments(REVOKE, &["a/b"]),
            ["admin", "v1", "users", "a/b", "revoke"]
        );
    }
}
