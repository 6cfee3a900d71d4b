//! Calls out to the application's backend. This module owns what every such call shares:
//! the request signature (`sign`), which a receiver verifies and uses to reject replays.
//! Event webhooks and the before-send hook (`before_send`) build on it; `tls` is the
//! client TLS of https:// endpoints.

pub mod before_send;
pub mod sign;
pub mod tls;
pub mod webhooks;
