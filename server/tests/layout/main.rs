//! The repository's layout held to its documents: no function of `server/src` over 150
//! lines (`functions`), the config reference against the
//! `Config` types, the README's length and every relative link of the top-level documents,
//! the admin API table against the admin router,
//! and no import circle between sibling modules in any crate of the workspace.

mod admin_routes;
mod circles;
#[path = "../common/mod.rs"]
mod common;
mod config_keys;
mod functions;
mod links;
mod source;
