//! im-console: the operator's terminal console for im-server nodes, over the admin API.
//!
//! Split the way tokio-console is: [`state`] is plain data changed by API responses and
//! key actions, [`view`] renders it (and only it), [`input`] maps keys to [`action`]s,
//! [`api`] talks HTTP to the nodes, [`app`] runs the loop and the background pollers.

pub mod action;
pub mod api;
pub mod app;
pub mod config;
pub mod fmt;
pub mod input;
pub mod save;
pub mod screen;
pub mod state;
pub mod view;
