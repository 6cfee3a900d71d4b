//! Fuzz target: the per-connection protocol state machine (`gateway::protocol`) fed
//! arbitrary sequences of raw and structured WebSocket messages, against a real pipeline
//! on a temp SQLite store (built once per process). The invariants are in
//! `im_fuzz::Model::check`: no panic, no reply but errors before login, the close
//! decisions taken exactly when they must be, pongs within the ping bucket, no session
//! left registered after the connection ends.

#![no_main]

use std::sync::Mutex;

use im_fuzz::{Msg, World};
use libfuzzer_sys::fuzz_target;

static WORLD: Mutex<Option<World>> = Mutex::new(None);

fuzz_target!(|msgs: Vec<Msg>| {
    let mut w = WORLD.lock().unwrap_or_else(|p| p.into_inner());
    w.get_or_insert_with(World::new).run(&msgs);
});
