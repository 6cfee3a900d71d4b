//! The `im-server` binary: `im-server [flags]` runs a node (SIGHUP reloads its secrets);
//! `im-server token --user NAME` prints a client token signed with the node's signing key;
//! `im-server backup DEST` backs up the SQLite store online, `im-server restore SRC` puts
//! a backup into a stopped node's data dir.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its start: the heap profiler is loaded but inactive,
/// sampling one allocation per 2^19 bytes on average once `GET /admin/v1/profile/heap`
/// switches it on (`im_server::obs::heap`). `_rjem_` is tikv-jemalloc-sys's symbol prefix.
#[cfg(feature = "heap-profiling")]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: MallocConf =
    MallocConf(c"prof:true,prof_active:false,lg_prof_sample:19".as_ptr());

/// A C string pointer jemalloc reads as `const char *malloc_conf`.
#[cfg(feature = "heap-profiling")]
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a `'static` C string literal that nothing writes.
#[cfg(feature = "heap-profiling")]
unsafe impl Sync for MallocConf {}
use clap::{Parser, Subcommand};
use im_server::config::{Config, Overrides};

#[derive(Parser)]
#[command(name = "im-server", version, about = "Observability-first IM server")]
struct Cli {
    /// TOML config file.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Client WebSocket listener, e.g. 127.0.0.1:7070.
    #[arg(long, global = true)]
    listen: Option<String>,
    /// Admin HTTP listener, e.g. 127.0.0.1:7071.
    #[arg(long, global = true)]
    admin_listen: Option<String>,
    /// Data directory (SQLite database, generated secrets, logs).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// postgres://... or sqlite:PATH (default: SQLite in the data dir).
    #[arg(long, global = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Print a client token (HS256 JWT) for a user.
    Token {
        /// The user id (claim `sub`).
        #[arg(long)]
        user: String,
        /// Lifetime, e.g. 90s, 10m, 1h, 7d.
        #[arg(long, default_value = "1h", value_parser = im_server::auth::parse_ttl)]
        ttl: Duration,
    },
    /// Back up the SQLite store online (the node keeps serving) into a new file.
    Backup {
        /// The backup file to create (never overwritten).
        dest: PathBuf,
    },
    /// Restore a backup into the data dir of a stopped node.
    Restore {
        /// The backup file.
        src: PathBuf,
        /// Replace the store the data dir already has.
        #[arg(long)]
        force: bool,
    },
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("im-server: error: {}", causes(&e));
            std::process::ExitCode::from(2)
        }
    }
}

/// `e` and its causes joined by `: `, each cause once: a library error that already
/// prints its source (`database: error communicating with database: ...`) is followed
/// in the chain by that same source, which is then left out.
fn causes(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut previous = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !previous.is_empty() && previous.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        previous = text;
    }
    out
}

fn run() -> anyhow::Result<()> {
    // Everything this process creates is its own: the data dir (0700), the database
    // files, their WAL and shared-memory files, secrets and logs (0600).
    // SAFETY: umask only sets the process's file-creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
    let cli = Cli::parse();
    let overrides = Overrides {
        listen: cli.listen,
        admin_listen: cli.admin_listen,
        data_dir: cli.data_dir,
        database_url: cli.database_url,
    };
    let config = Config::load(cli.config.as_deref(), &overrides)?;
    let source = {
        let file = cli.config.clone();
        let overrides = overrides.clone();
        move || Config::load(file.as_deref(), &overrides)
    };
    match cli.command {
        Some(Command::Token { user, ttl }) => {
            // Never creates a secret: a token signed with a new one no server accepts.
            let keys = im_server::auth::existing_token_keys(&config)?;
            println!("{}", keys.issue(&user, ttl)?);
            Ok(())
        }
        Some(Command::Backup { dest }) => {
            let db = sqlite_file(&config)?;
            let done = im_server::store::backup::backup(&db, &dest)?;
            println!(
                "backed up {} to {}: {} messages, {} pages, {} bytes in {} ms",
                db.display(),
                done.path.display(),
                done.messages,
                done.pages,
                done.bytes,
                done.took.as_millis()
            );
            Ok(())
        }
        Some(Command::Restore { src, force }) => {
            let db = sqlite_file(&config)?;
            let done = im_server::store::backup::restore(&src, &db, force)?;
            println!(
                "restored {} into {}: {} messages, {} pages, {} bytes in {} ms",
                src.display(),
                done.path.display(),
                done.messages,
                done.pages,
                done.bytes,
                done.took.as_millis()
            );
            Ok(())
        }
        None => serve(config, Box::new(source)),
    }
}

fn serve(config: Config, source: im_server::reload::ConfigSource) -> anyhow::Result<()> {
    // Text to stderr, JSON lines to <data_dir>/logs; the guard flushes the file writer.
    let _log_guard = im_server::obs::logfiles::init(&config.log.options(&config.data_dir))
        .context("setting up logging")?;
    if let Some((before, after)) = im_server::obs::process::raise_fd_limit() {
        if after > before {
            tracing::info!(
                before,
                after,
                "raised the open-files soft limit to the hard limit"
            );
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let running = im_server::Node::start(config).await?;
        tracing::info!(
            node_id = %running.node.node_id,
            store = running.node.store.backend(),
            "listening client={} admin={}",
            running.client_addr,
            running.admin_addr
        );
        running.node.set_config_source(source);
        let reloader = tokio::spawn(reload_on_sighup(running.node.clone()));
        shutdown_signal().await;
        reloader.abort();
        let deadline = Duration::from_secs(running.node.config.flow.drain_timeout_secs as u64);
        tokio::select! {
            r = running.shutdown(deadline) => {
                tracing::info!(
                    connections = r.connections,
                    committed = r.committed,
                    left_open = r.left_open,
                    took_ms = r.took.as_millis() as u64,
                    "stopped"
                );
            }
            _ = shutdown_signal() => {
                // Acked messages are committed already; only the rest of the drain is cut.
                tracing::warn!("second signal during the drain: exiting now");
                std::process::exit(1);
            }
        }
        Ok(())
    })
}

/// The SQLite file the config selects; a Postgres store is backed up with its own tools.
fn sqlite_file(config: &Config) -> anyhow::Result<PathBuf> {
    match config.database()? {
        im_server::config::Database::Sqlite(path) => Ok(path),
        im_server::config::Database::Postgres(_) => anyhow::bail!(
            "the store is Postgres (database_url): back it up and restore it with pg_dump / \
             pg_restore or pg_basebackup (docs/backup.md)"
        ),
    }
}

/// Each SIGHUP reloads the token keys and the admin token (`im_server::reload`). The
/// handler is registered by this call, so a SIGHUP right after start is not missed.
fn reload_on_sighup(
    node: std::sync::Arc<im_server::Node>,
) -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    async move {
        #[cfg(unix)]
        {
            let Ok(mut hup) = hup else {
                tracing::warn!("cannot listen for SIGHUP: reload with POST /admin/v1/reload");
                return;
            };
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading secrets");
                let n = node.clone();
                // The outcome is logged by the reload itself.
                let _ = tokio::task::spawn_blocking(move || n.reload_secrets()).await;
            }
        }
        #[cfg(not(unix))]
        drop(node);
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
