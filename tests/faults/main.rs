//! Fault injection: the real `im-server` binary against the real things it depends on,
//! each broken and then healed while clients send (a full disk under SQLite, Postgres
//! stopped and started, the test's own nats-server killed and restarted, a node killed
//! or stopped). Every case checks the same promises: every acked message is stored once
//! at its acked seq, online recipients get every acked message once the fault heals,
//! `/readyz` tells the truth during and after, and the node recovers without a restart.
//!
//! These tests change machine state (a tmpfs mount, the local Postgres service), so they
//! live in their own test binary: cargo runs test binaries one at a time, and inside this
//! one each case takes `support::faults::exclusive().await` first.

mod store;
#[path = "../e2e/support/mod.rs"]
mod support;

mod cluster;
