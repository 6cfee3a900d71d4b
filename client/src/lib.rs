//! im-client: the async Rust SDK for im-server (wire contract `im.v1`, docs/design.md).
//!
//! - [`Client`]: connect + login, `send` (waits for the durable `SendAck`, retries
//!   `OVERLOADED` and dropped connections with the same `client_msg_id`), group ops,
//!   paged `sync`, `history`, `recall` / `edit` / `delete_for_me` (RECALL and EDIT
//!   events arrive as [`Event::Recalled`] / [`Event::Edited`]), heartbeats, auto-reconnect with resume, token refresh on the open
//!   connection before expiry (with [`ClientConfig::with_token_provider`]), and an
//!   exactly-once stream of [`Event`]s (each conversation in seq order) taken with
//!   [`Client::next_event`].
//! - [`RawConn`]: a bare frame-level WebSocket connection for tests and tools.
//!
//! Module map: `raw` (transport), `client` (handle, events, targets), `driver` (the
//! background task), `tracker` (dedup and cursors), `backoff` (reconnect and retry
//! timing), `route` (asks `GET /v1/route` which node to connect to), `regions` (probes the
//! regions a route answer lists; nearest healthy first), `tls` (the trust anchors of
//! `wss://`), `config`, `error`.

mod backoff;
mod client;
mod config;
mod driver;
mod error;
mod event;
pub mod raw;
pub mod regions;
pub mod route;
pub mod tls;
mod tracker;

pub use client::{Client, Target};
pub use config::{ClientConfig, TokenProvider};
pub use error::ClientError;
pub use event::Event;
pub use im_proto as proto;
pub use raw::{RawConn, RawConnOptions, RawEvent};
pub use tls::TlsConfig;
