//! End-to-end tests: the real `im-server` binary, real WebSocket clients over loopback,
//! a real SQLite file in a temp data dir.

mod support;

mod access;
mod announce;
mod backup;
mod bad_input;
mod before_send;
mod bounds;
mod chat;
mod cli;
mod cluster;
mod dashboards;
mod deploy;
mod diag;
mod durability;
mod edits;
mod flow;
mod groups;
mod hardening;
mod heap;
mod live;
mod logtail;
mod obs;
mod offline;
mod prometheus;
mod reads;
mod region_trace;
mod regions;
mod rolling;
mod rotation;
mod runtime;
mod tls;
mod trace;
mod users;
mod webhooks;
mod wire;
