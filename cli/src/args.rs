//! The command line: global options, the commands and their arguments, and the parsers
//! that reject bad input (URL, ids, durations) before anything connects.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Shown at the end of `im --help`: the exit codes scripts can rely on.
const EXIT_CODES: &str = "\
Exit codes:
  0  success (listen: stopped by Ctrl-C or after --count messages)
  1  unexpected failure (protocol error, output error)
  2  bad usage: arguments, URL, missing or unreadable token
  3  server unreachable, connection lost, or no answer within --timeout
  4  login refused: bad or expired token
  5  request refused by the server (NOT_MEMBER, FORBIDDEN, NOT_FOUND, ...)

Make a token with `im-server token --user NAME` (run it where the server keeps its data).";

/// `im`: a command-line client for im-server.
#[derive(Debug, Parser)]
#[command(name = "im", version, about, after_help = EXIT_CODES)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub struct Global {
    /// The server's WebSocket endpoint (ws://HOST:PORT/ws or wss://HOST:PORT/ws).
    #[arg(long, global = true, env = "IM_URL", hide_env_values = true,
          default_value = "ws://127.0.0.1:7070/ws",
          value_parser = parse_ws_url)]
    pub url: String,
    /// Login token (a JWT from `im-server token --user NAME`).
    #[arg(long, global = true, env = "IM_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the token from this file instead (takes precedence over --token).
    #[arg(long, global = true, env = "IM_TOKEN_FILE", hide_env_values = true)]
    pub token_file: Option<PathBuf>,
    /// Device id to log in as (the server keeps delivery cursors per device).
    #[arg(long, global = true, env = "IM_DEVICE", hide_env_values = true,
          default_value = "cli",
          value_parser = parse_device)]
    pub device: String,
    /// With a wss:// URL: trust the CA certificates of this PEM file instead of the
    /// public roots (a private or test CA).
    #[arg(long, global = true)]
    pub ca: Option<PathBuf>,
    /// How long to wait for the server (connect, each request), e.g. 10s, 500ms, 1m.
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// One JSON object per line instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send a text message and wait until the server has stored it.
    Send(SendArgs),
    /// Print messages and events as they arrive (after the ones missed while away).
    Listen(ListenArgs),
    /// One page of a conversation's history, oldest first.
    History(HistoryArgs),
    /// Your conversations with their unread counts.
    Conversations(ConversationsArgs),
    /// Mark a conversation read up to a seq.
    Read(ReadArgs),
    /// Recall a message (yours within the recall window; group owners and admins any).
    Recall(RecallArgs),
    /// Replace the text of one of your messages.
    Edit(EditArgs),
    /// Group administration.
    #[command(subcommand)]
    Group(GroupCommand),
    /// Log in and print who the token says you are.
    Whoami,
}

/// Where a message goes or which conversation to read: one user or one group.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Peer {
    /// A user (one-to-one conversation).
    #[arg(long = "to", visible_alias = "with", value_parser = parse_id)]
    pub user: Option<String>,
    /// A group.
    #[arg(long, value_parser = parse_id)]
    pub group: Option<String>,
}

/// `im send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The recipient.
    #[command(flatten)]
    pub peer: Peer,
    /// The text (several words are joined with spaces; `-` reads it from stdin; put
    /// `--` before text that starts with a dash).
    #[arg(required = true, num_args = 1..)]
    pub text: Vec<String>,
}

/// `im listen`.
#[derive(Debug, Args)]
pub struct ListenArgs {
    /// Exit after this many messages (group system messages count too).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

/// `im history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The conversation.
    #[command(flatten)]
    pub peer: Peer,
    /// At most this many messages.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// Only messages before this seq (the next page: the lowest seq shown).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub before: Option<u64>,
}

/// `im conversations`.
#[derive(Debug, Args)]
pub struct ConversationsArgs {
    /// At most this many conversations (pinned first, then the most recent).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
}

/// `im read`.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// The conversation id, as `im conversations` prints it (u:A:B or g:GROUP).
    #[arg(value_parser = parse_conversation)]
    pub conversation: String,
    /// Everything up to this seq is read.
    pub seq: u64,
}

/// `im recall`.
#[derive(Debug, Args)]
pub struct RecallArgs {
    /// The conversation id (u:A:B or g:GROUP).
    #[arg(value_parser = parse_conversation)]
    pub conversation: String,
    /// The message's seq.
    #[arg(value_parser = clap::value_parser!(u64).range(1..))]
    pub seq: u64,
}

/// `im edit`.
#[derive(Debug, Args)]
pub struct EditArgs {
    /// The conversation id (u:A:B or g:GROUP).
    #[arg(value_parser = parse_conversation)]
    pub conversation: String,
    /// The message's seq.
    #[arg(value_parser = clap::value_parser!(u64).range(1..))]
    pub seq: u64,
    /// The new text (several words are joined with spaces; `-` reads it from stdin).
    #[arg(required = true, num_args = 1..)]
    pub text: Vec<String>,
}

/// `im group ...`.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Create a group; you become its owner (no GID: the server names it).
    Create {
        /// The group id.
        #[arg(value_parser = parse_id)]
        gid: Option<String>,
        /// Add this user as a member (repeatable).
        #[arg(long = "member", value_parser = parse_id)]
        members: Vec<String>,
        /// Anyone may join (default: by invitation only).
        #[arg(long)]
        public: bool,
        /// Plain members may add others too.
        #[arg(long)]
        members_can_invite: bool,
    },
    /// Add users to a group.
    Add(GroupUsers),
    /// Remove users from a group.
    Remove(GroupUsers),
    /// Remove users and refuse their return.
    Ban(GroupUsers),
    /// Lift bans.
    Unban(GroupUsers),
    /// Join a public group.
    Join(GroupId),
    /// Leave a group (an owner transfers or dissolves first).
    Leave(GroupId),
    /// Show a group's state.
    Info(GroupId),
    /// Dissolve a group (owner only).
    Dissolve(GroupId),
    /// Give a member a role.
    SetRole {
        /// The group id.
        #[arg(value_parser = parse_id)]
        gid: String,
        /// The member.
        #[arg(value_parser = parse_id)]
        user: String,
        /// The role.
        role: RoleArg,
    },
    /// Make a member the owner (you become an admin).
    Transfer {
        /// The group id.
        #[arg(value_parser = parse_id)]
        gid: String,
        /// The new owner.
        #[arg(value_parser = parse_id)]
        user: String,
    },
}

/// A group id alone.
#[derive(Debug, Args)]
pub struct GroupId {
    /// The group id.
    #[arg(value_parser = parse_id)]
    pub gid: String,
}

/// A group id and the users an operation is about.
#[derive(Debug, Args)]
pub struct GroupUsers {
    /// The group id.
    #[arg(value_parser = parse_id)]
    pub gid: String,
    /// The users.
    #[arg(required = true, num_args = 1.., value_parser = parse_id)]
    pub users: Vec<String>,
}

/// A role `set-role` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    /// May add, remove and ban members of a lower role.
    Admin,
    /// A plain member.
    Member,
}

/// Checks a `ws://` or `wss://` URL: scheme, host, port.
pub fn parse_ws_url(s: &str) -> Result<String, String> {
    if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("a URL has no spaces or control characters".into());
    }
    let Some(rest) = s.strip_prefix("ws://").or_else(|| s.strip_prefix("wss://")) else {
        return Err(
            "expected ws://HOST:PORT/PATH or wss://HOST:PORT/PATH, e.g. ws://127.0.0.1:7070/ws"
                .into(),
        );
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (host, port) = split_host_port(authority)?;
    if host.is_empty() {
        return Err("the URL has no host".into());
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => {}
            _ => return Err(format!("bad port {p:?}")),
        }
    }
    Ok(s.to_owned())
}

/// `host[:port]` or `[v6][:port]`.
fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    if authority.contains('@') {
        return Err("user info in the URL is not supported".into());
    }
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("unclosed [ in the host")?;
        return match after {
            "" => Ok((host, None)),
            p => p
                .strip_prefix(':')
                .map(|p| (host, Some(p)))
                .ok_or_else(|| "bad host".into()),
        };
    }
    Ok(match authority.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    })
}

/// A user or group id as the server accepts it.
pub fn parse_id(s: &str) -> Result<String, String> {
    if im_client::proto::valid_id(s) {
        Ok(s.to_owned())
    } else {
        Err("ids are 1 to 64 characters of A-Z a-z 0-9 _ . @ -".into())
    }
}

/// A conversation id: `u:A:B` (sorted) or `g:GROUP`.
pub fn parse_conversation(s: &str) -> Result<String, String> {
    match im_client::proto::parse_conversation(s) {
        Some(_) => Ok(s.to_owned()),
        None => Err("expected u:USER_A:USER_B (sorted) or g:GROUP".into()),
    }
}

/// A device id: 1 to 128 printable characters (the server's limit).
fn parse_device(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 128 || s.chars().any(char::is_control) {
        return Err("1 to 128 characters, no control characters".into());
    }
    Ok(s.to_owned())
}

/// `500ms`, `10s`, `2m`, `1h`, or a number of seconds; at least 1 ms, at most a day.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a number with ms, s, m or h"))?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    match ms {
        Some(ms) if (1..=86_400_000).contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(format!("{s:?}: between 1ms and 24h")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(parse_ws_url("ws://127.0.0.1:7070/ws").is_ok());
        assert!(parse_ws_url("ws://[::1]:7070/ws").is_ok());
        assert!(parse_ws_url("ws://example.com/ws").is_ok());
        assert!(parse_ws_url("http://127.0.0.1:7070/ws").is_err());
        assert!(parse_ws_url("wss://h/ws").is_ok());
        assert!(parse_ws_url("wss://h:0/ws").is_err());
        assert!(parse_ws_url("ws://:7070/ws").is_err());
        assert!(parse_ws_url("ws://h:99999/ws").is_err());
        assert!(parse_ws_url("ws://h:x/ws").is_err());
        assert!(parse_ws_url("ws://h /ws").is_err());
        assert!(parse_ws_url("ws://[::1/ws").is_err());
        assert!(parse_ws_url("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1d").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }

    #[test]
    fn ids_and_conversations() {
        assert!(parse_id("alice").is_ok());
        assert!(parse_id("a b").is_err());
        assert!(parse_id("").is_err());
        assert!(parse_conversation("u:alice:bob").is_ok());
        assert!(parse_conversation("u:bob:alice").is_err());
        assert!(parse_conversation("g:team").is_ok());
        assert!(parse_conversation("team").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
