//! The admin API as the console uses it: the typed answers and the HTTP client of
//! `im_admin_api` (one [`AdminClient`] per node, a timeout and a body-size cap on every
//! request, errors as [`ApiError`]), under the names the rest of the console uses. Every
//! answer type is `#[serde(default)]`, so fields a node adds later (or leaves out) never
//! break the console.

pub use im_admin_api::client::{
    parse_base_url, AdminClient, ApiError, LogTail, MAX_BODY_BYTES, PROFILE_SLACK,
};
pub use im_admin_api::{
    AllocStats, Capacity, ClusterInfo, ClusterNode, ClusterSummary, Connection, ConnectionList,
    GlobalLevel, HeapProfileBundle, HeapTopFunction, Kicked, LogFile, LogFilter, LogFilters,
    LogTailLine, LogWindow, Logs, Memory, MessageKind, MessageTrace, Overview, PostMessage,
    PostedMessage, PostedMessages, ProcessStats, ProfileBundle, Refusals, Revoked, RuntimeStats,
    SetLogFilter, SlowConsumers, StageLatency, TaskStats, TopFunction, TraceStage,
};
pub use im_admin_api::{Backlog, UserDiag, UserMessage, UserRefusal, UserSession};
pub use im_admin_api::{
    ParkedEvent, ParkedEvents, Redeliver, Redelivered, TestFired, WebhookEndpoint, Webhooks,
};
