//! The commands, one module per family; `run` opens the session and dispatches.

mod conversations;
mod group;
mod history;
mod listen;
mod send;

use crate::args::{Command, Global, Peer};
use crate::failure::{Exit, Failure};
use crate::output::Out;
use crate::session::Session;

/// Runs `command` on a session opened with the global options.
pub async fn run(global: &Global, command: Command) -> anyhow::Result<()> {
    let session = Session::open(global).await?;
    let mut out = Out::new(global.json);
    let result = match command {
        Command::Send(a) => send::send(&session, &mut out, a).await,
        Command::Listen(a) => listen::listen(&session, &mut out, a).await,
        Command::History(a) => history::history(&session, &mut out, a).await,
        Command::Conversations(a) => conversations::list(&session, &mut out, a).await,
        Command::Read(a) => conversations::mark_read(&session, &mut out, a).await,
        Command::Recall(a) => send::recall(&session, &mut out, a).await,
        Command::Edit(a) => send::edit(&session, &mut out, a).await,
        Command::Group(g) => group::run(&session, &mut out, g).await,
        Command::Whoami => whoami(&session, &mut out),
    };
    session.close().await;
    result
}

/// The user, node and session the token logged in as.
fn whoami(s: &Session, out: &mut Out) -> anyhow::Result<()> {
    let c = &s.client;
    let (user, node, session) = (c.user_id(), c.node_id(), c.session_id());
    out.emit(
        || {
            let e = crate::output::escape;
            format!("{} (node {}, session {})", e(user), e(&node), e(&session))
        },
        || serde_json::json!({"user": user, "node": node, "session": session}),
    )?;
    Ok(())
}

/// The SDK target a `--to` / `--group` pair names (clap makes exactly one present).
fn target(peer: Peer) -> Result<im_client::Target, Failure> {
    match (peer.user, peer.group) {
        (Some(u), _) => Ok(im_client::Target::User(u)),
        (None, Some(g)) => Ok(im_client::Target::Group(g)),
        (None, None) => Err(Failure::new(Exit::Usage, "pass --to USER or --group GID")),
    }
}
