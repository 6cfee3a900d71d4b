//! Config: the one typed configuration of a node.
//!
//! Layers, later ones winning: built-in defaults, a TOML file (`--config`), `IM_*`
//! environment variables, CLI flags. Every leaf key has an env name derived from its
//! path (`persist.batch_max` -> `IM_PERSIST_BATCH_MAX`, `listen` -> `IM_LISTEN`). A bad
//! value fails start-up with an error naming the key (or env var) and the value.
//!
//! Layout: one file per section (`limits`, `persist`, `flow`, `store`, `obs`, `log`,
//! `cluster`, `http`, `tls`, `receipts`, `auth`, `hooks`, `webhooks`, `region`), each
//! owning its struct's fields, defaults and validation; this module owns the whole
//! [`Config`] (the top-level keys and their checks, the checks across sections),
//! loading (`layers`: file and env over the defaults), and the error
//! type; `check` holds the checks the sections are made of, `redact` how secrets show.

mod auth;
mod check;
mod cluster;
mod flow;
mod hooks;
mod http;
mod layers;
mod limits;
mod log;
mod obs;
mod persist;
mod receipts;
mod redact;
mod region;
mod store;
mod tls;
mod webhooks;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use self::auth::{AuthConfig, JwtKey};
use self::check::{addr, invalid};
pub use self::cluster::ClusterConfig;
pub use self::flow::Flow;
pub use self::hooks::{BeforeSendConfig, Hooks};
pub use self::http::Http;
use self::layers::{apply_env, env_names, merge, refuse_unknown_env};
pub use self::limits::{Limits, FD_RESERVE};
pub use self::log::LogConfig;
pub use self::obs::Obs;
pub use self::persist::Persist;
pub use self::receipts::Receipts;
pub use self::redact::redact_url;
use self::redact::redacted;
pub use self::region::{RegionEntry, MAX_REGIONS};
pub use self::store::StoreConfig;
pub use self::tls::Tls;
pub use self::webhooks::{Endpoint, Webhooks, EVENT_KINDS};

/// Shortest configured `jwt_secret` or `admin_token` accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;

/// Errors from loading or validating the config; each names the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML did not parse.
    #[error("config file {path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A key holds a value of the wrong type or an unknown key was given.
    #[error("config key `{key}`: {message}")]
    Key {
        /// Dotted key path.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// An environment override did not parse.
    #[error("env {var} (config key `{key}`): cannot use value {value:?}: {message}")]
    Env {
        /// The variable name.
        var: String,
        /// Dotted key path.
        key: String,
        /// The raw value.
        value: String,
        /// What is wrong.
        message: String,
    },
    /// An `IM_*` variable names no config key and is not one other tools read.
    #[error(
        "env {var}: names no config key{hint}; docs/config.md lists the keys and the \
         IM_* variables the server ignores"
    )]
    UnknownEnv {
        /// The variable name.
        var: String,
        /// ` (did you mean IM_...?)` naming the closest key, or empty.
        hint: String,
    },
    /// A value has the right type but is out of range or inconsistent.
    #[error("config key `{key}` = {value}: {message}")]
    Invalid {
        /// Dotted key path.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong.
        message: String,
    },
}

/// The whole node configuration. Its `Debug` hides the secrets and URL passwords.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Client WebSocket listener (`GET /ws`).
    pub listen: String,
    /// Admin HTTP listener.
    pub admin_listen: String,
    /// Data directory: SQLite database, generated secrets, logs.
    pub data_dir: PathBuf,
    /// `postgres://...` or `sqlite:PATH`; empty means SQLite at `<data_dir>/im.db`.
    pub database_url: String,
    /// HS256 secret for client tokens; empty means generated into `<data_dir>/jwt_secret`.
    pub jwt_secret: String,
    /// Bearer token for the admin API; empty means generated into `<data_dir>/admin_token`.
    pub admin_token: String,
    /// Serve `/metrics` without the admin token (for scrapers on a trusted network).
    pub admin_metrics_open: bool,
    /// A TLS-terminating proxy sits in front of the listeners: silences the start-up
    /// warning about serving tokens in clear on a non-loopback address.
    pub behind_tls: bool,
    /// NATS URL for cluster mode; empty means single node.
    pub nats_url: String,
    /// This node's id; empty means derived from the host name.
    pub node_id: String,
    /// Protocol limits and timers.
    pub limits: Limits,
    /// Persistence (group commit) settings.
    pub persist: Persist,
    /// Outbound flow control.
    pub flow: Flow,
    /// Store tuning.
    pub store: StoreConfig,
    /// Observability.
    pub obs: Obs,
    /// Logs: level, rolling files, per-uid filters, off-peak compression.
    pub log: LogConfig,
    /// Cluster mode (with `nats_url`): registry TTL, load reports, routing.
    pub cluster: ClusterConfig,
    /// HTTP hardening of both listeners: header timeout and size, admin connection cap.
    pub http: Http,
    /// Read receipts: per-member up to a group size, counted or none above it.
    pub receipts: Receipts,
    /// Native TLS of the listeners: certificate and key files, handshake timeout, reload.
    pub tls: Tls,
    /// Client token keys by id (secret rotation); empty: the single `jwt_secret`.
    pub auth: AuthConfig,
    /// Calls to the application's backend: the before-send moderation hook.
    pub hooks: Hooks,
    /// Event webhooks to the application's backend (offline push and other events).
    pub webhooks: Webhooks,
    /// This node's region (multi-region mode, [`Config::regions`]); empty: one region.
    pub region: String,
    /// Every region with its public entry point, the same list in every region.
    pub regions: Vec<RegionEntry>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = redacted;
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("data_dir", &self.data_dir)
            .field("database_url", &redact_url(&self.database_url))
            .field("jwt_secret", &secret(&self.jwt_secret))
            .field("admin_token", &secret(&self.admin_token))
            .field("admin_metrics_open", &self.admin_metrics_open)
            .field("behind_tls", &self.behind_tls)
            .field("nats_url", &redact_url(&self.nats_url))
            .field("node_id", &self.node_id)
            .field("limits", &self.limits)
            .field("persist", &self.persist)
            .field("flow", &self.flow)
            .field("store", &self.store)
            .field("obs", &self.obs)
            .field("log", &self.log)
            .field("cluster", &self.cluster)
            .field("http", &self.http)
            .field("receipts", &self.receipts)
            .field("tls", &self.tls)
            .field("auth", &self.auth)
            .field("hooks", &self.hooks)
            .field("webhooks", &self.webhooks)
            .field("region", &self.region)
            .field("regions", &self.regions)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:7070".into(),
            admin_listen: "127.0.0.1:7071".into(),
            data_dir: PathBuf::from("./data"),
            database_url: String::new(),
            jwt_secret: String::new(),
            admin_token: String::new(),
            admin_metrics_open: false,
            behind_tls: false,
            nats_url: String::new(),
            node_id: String::new(),
            limits: Limits::default(),
            persist: Persist::default(),
            flow: Flow::default(),
            store: StoreConfig::default(),
            obs: Obs::default(),
            log: LogConfig::default(),
            cluster: ClusterConfig::default(),
            http: Http::default(),
            receipts: Receipts::default(),
            tls: Tls::default(),
            auth: AuthConfig::default(),
            hooks: Hooks::default(),
            webhooks: Webhooks::default(),
            region: String::new(),
            regions: Vec::new(),
        }
    }
}

/// CLI flags that override the config.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--listen`
    pub listen: Option<String>,
    /// `--admin-listen`
    pub admin_listen: Option<String>,
    /// `--data-dir`
    pub data_dir: Option<PathBuf>,
    /// `--database-url`
    pub database_url: Option<String>,
}

/// Which database backs the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// Embedded SQLite file.
    Sqlite(PathBuf),
    /// Postgres connection URL.
    Postgres(String),
}

impl Config {
    /// Loads defaults, then `file`, then the process environment, then `overrides`; validates.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        Self::load_from(file, overrides, std::env::vars())
    }

    /// As [`Config::load`] with an explicit environment (for tests).
    pub fn load_from(
        file: Option<&Path>,
        overrides: &Overrides,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut tree = toml::Value::try_from(Config::default()).map_err(|e| ConfigError::Key {
            key: String::new(),
            message: e.to_string(),
        })?;
        let mut known = vec!["IM_LOG".to_owned()];
        env_names(&tree, &mut Vec::new(), &mut known);
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            let from_file: toml::Value =
                toml::from_str(&text).map_err(|e| ConfigError::Syntax {
                    path: path.to_owned(),
                    message: e.message().to_owned(),
                })?;
            merge(&mut tree, from_file);
        }
        let env: std::collections::HashMap<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("IM_"))
            .collect();
        refuse_unknown_env(&known, &env)?;
        apply_env(&mut tree, &mut Vec::new(), &env)?;
        // `IM_LOG` (the documented level variable) is an alias of `log.level` that wins.
        if let (Some(level), Some(toml::Value::Table(log))) =
            (env.get("IM_LOG"), tree.get_mut("log"))
        {
            log.insert("level".into(), toml::Value::String(level.clone()));
        }
        let mut config: Config = serde_path_to_error::deserialize(tree).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Key {
                key,
                message: e.into_inner().to_string(),
            }
        })?;
        if let Some(v) = &overrides.listen {
            config.listen = v.clone();
        }
        if let Some(v) = &overrides.admin_listen {
            config.admin_listen = v.clone();
        }
        if let Some(v) = &overrides.data_dir {
            config.data_dir = v.clone();
        }
        if let Some(v) = &overrides.database_url {
            config.database_url = v.clone();
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and formats; the error names the key and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        addr("listen", &self.listen)?;
        addr("admin_listen", &self.admin_listen)?;
        self.database()?;
        if !self.node_id.is_empty() && !im_proto::valid_id(&self.node_id) {
            return Err(invalid(
                "node_id",
                &self.node_id,
                "use 1-64 characters of A-Z a-z 0-9 _ . @ -",
            ));
        }
        self.limits.validate()?;
        for (key, secret) in [
            ("jwt_secret", &self.jwt_secret),
            ("admin_token", &self.admin_token),
        ] {
            if !secret.is_empty() && secret.len() < MIN_SECRET_BYTES {
                return Err(invalid(
                    key,
                    format!("<redacted, {} bytes>", secret.len()),
                    &format!(
                        "must be at least {MIN_SECRET_BYTES} bytes (or empty: generated into the data dir)"
                    ),
                ));
            }
        }
        self.auth.validate(&self.jwt_secret)?;
        self.persist.validate()?;
        self.flow.validate()?;
        if u64::from(self.limits.max_frame_bytes) * 2 > self.flow.hard_mark_bytes {
            return Err(invalid(
                "limits.max_frame_bytes",
                self.limits.max_frame_bytes,
                "must be at most half of flow.hard_mark_bytes (a reply carrying one message must fit under the hard mark)",
            ));
        }
        self.http.validate()?;
        self.store.validate()?;
        self.obs.validate()?;
        self.log.validate()?;
        self.cluster.validate()?;
        self.receipts.validate()?;
        self.hooks.validate()?;
        self.tls.validate()?;
        self.webhooks.validate()?;
        region::validate(&self.region, &self.regions, self.clustered())?;
        if !self.region.is_empty() && matches!(self.database(), Ok(Database::Sqlite(_))) {
            return Err(invalid(
                "region",
                &self.region,
                "multi-region mode needs Postgres (database_url = postgres://...): \
                 replication is built on the Postgres store only",
            ));
        }
        let nats = self.nats_url.trim();
        if !nats.is_empty() {
            if !(nats.starts_with("nats://") || nats.starts_with("tls://") || !nats.contains("://"))
            {
                return Err(invalid(
                    "nats_url",
                    redact_url(nats),
                    "use nats://HOST:PORT (or HOST:PORT)",
                ));
            }
            if !matches!(self.database()?, Database::Postgres(_)) {
                return Err(invalid(
                    "nats_url",
                    redact_url(nats),
                    "cluster mode needs a shared Postgres database_url (nodes share messages, cursors and groups)",
                ));
            }
        }
        Ok(())
    }

    /// The NATS subject and KV bucket prefix this node's cluster uses: `cluster.prefix`,
    /// and in multi-region mode `<cluster.prefix>-<region>`, so that the regions of one
    /// NATS super-cluster never share a registry, presence or subjects.
    pub fn cluster_prefix(&self) -> String {
        if self.region.is_empty() {
            self.cluster.prefix.clone()
        } else {
            format!("{}-{}", self.cluster.prefix, self.region)
        }
    }

    /// Whether this node runs in cluster mode (`nats_url` set).
    pub fn clustered(&self) -> bool {
        !self.nats_url.trim().is_empty()
    }

    /// The database this config selects.
    pub fn database(&self) -> Result<Database, ConfigError> {
        let url = self.database_url.trim();
        if url.is_empty() {
            Ok(Database::Sqlite(self.data_dir.join("im.db")))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Database::Postgres(url.to_owned()))
        } else if let Some(path) = url
            .strip_prefix("sqlite://")
            .or(url.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err(invalid("database_url", url, "sqlite: needs a file path"));
            }
            Ok(Database::Sqlite(PathBuf::from(path)))
        } else {
            Err(invalid(
                "database_url",
                redact_url(url),
                "use postgres://..., sqlite:PATH, or leave it empty for SQLite in data_dir",
            ))
        }
    }

    /// The client listener address (validated).
    pub fn listen_addr(&self) -> SocketAddr {
        // validate() has parsed it already.
        self.listen.parse().unwrap_or(([127, 0, 0, 1], 7070).into())
    }

    /// The admin listener address (validated).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listen
            .parse()
            .unwrap_or(([127, 0, 0, 1], 7071).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn multi_region_mode_is_refused_on_sqlite_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("im.toml");
        std::fs::write(
            &file,
            "region = \"a\"\n[[regions]]\nname = \"a\"\nroute_url = \"http://a:7070\"\n",
        )
        .unwrap();
        let load = |db: &str| {
            let mut pairs = vec![("IM_NATS_URL", "nats://127.0.0.1:4222")];
            if !db.is_empty() {
                pairs.push(("IM_DATABASE_URL", db));
            }
            Config::load_from(Some(&file), &Overrides::default(), env(&pairs))
        };
        let e = load("").unwrap_err().to_string();
        assert!(e.contains("`region`") && e.contains("Postgres"), "{e}");
        assert!(load("sqlite:/tmp/x.db").is_err());
        assert!(load("postgres://db/im").is_ok());
    }

    #[test]
    fn urls_and_secrets_are_redacted() {
        assert_eq!(
            redact_url("postgres://im:s3cret@db:5432/im?sslmode=require"),
            "postgres://im:***@db:5432/im?sslmode=require"
        );
        assert_eq!(redact_url("nats://u:p@h:4222"), "nats://u:***@h:4222");
        assert_eq!(redact_url("nats://tok@h:4222"), "nats://tok@h:4222");
        assert_eq!(redact_url("postgres://db/im"), "postgres://db/im");
        assert_eq!(redact_url("sqlite:/a@b/c"), "sqlite:/a@b/c");
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_JWT_SECRET", "jwt-SECRET-value-of-thirty-two-bytes"),
                ("IM_ADMIN_TOKEN", "admin-TOKEN-value-of-thirty-two-bytes"),
                ("IM_DATABASE_URL", "postgres://im:pw-SECRET@db/im"),
            ]),
        )
        .unwrap();
        let shown = format!("{c:?}");
        for secret in ["jwt-SECRET-value", "admin-TOKEN-value", "pw-SECRET"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("<redacted>") && shown.contains("postgres://im:***@db/im"));
    }

    #[test]
    fn defaults_validate_and_select_sqlite_in_data_dir() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(
            c.database().unwrap(),
            Database::Sqlite("./data/im.db".into())
        );
        assert_eq!(c.limits.max_frame_bytes, 65536);
    }

    #[test]
    fn env_overrides_leaf_keys_and_flags_win() {
        let c = Config::load_from(
            None,
            &Overrides {
                listen: Some("127.0.0.1:9000".into()),
                ..Default::default()
            },
            env(&[
                ("IM_LISTEN", "127.0.0.1:1"),
                ("IM_PERSIST_BATCH_MAX", "7"),
                ("IM_NODE_ID", "n1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.listen, "127.0.0.1:9000");
        assert_eq!(c.persist.batch_max, 7);
        assert_eq!(c.node_id, "n1");
    }

    #[test]
    fn log_keys_default_validate_and_im_log_wins() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(c.log.level, "info");
        assert_eq!(c.log.dir_in(Path::new("/d")), PathBuf::from("/d/logs"));
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_LOG_LEVEL", "warn"),
                ("IM_LOG", "info,im_server::store=debug"),
                ("IM_LOG_IDLE_MSGS_PER_SEC", "2.5"),
                ("IM_LOG_WINDOW_START", "23:00"),
                ("IM_LOG_WINDOW_END", "01:00"),
            ]),
        )
        .unwrap();
        assert_eq!(c.log.level, "info,im_server::store=debug");
        assert_eq!(c.log.idle_msgs_per_sec, 2.5);
        assert_eq!((c.log.tail_ring_events, c.log.max_tails), (4096, 8));
        for (var, value, key) in [
            ("IM_LOG_LEVEL", "loud", "log.level"),
            ("IM_LOG_ROTATION", "weekly", "log.rotation"),
            ("IM_LOG_WINDOW_END", "25:00", "log.window_end"),
            ("IM_LOG_WINDOW_END", "03:00", "log.window_end"),
            ("IM_LOG_ZSTD_LEVEL", "30", "log.zstd_level"),
            ("IM_LOG_COMPRESS_CPU_SHARE", "0", "log.compress_cpu_share"),
            ("IM_LOG_PREFIX", "a/b", "log.prefix"),
            ("IM_LOG_TAIL_RING_EVENTS", "8", "log.tail_ring_events"),
            ("IM_LOG_TAIL_RING_EVENTS", "many", "log.tail_ring_events"),
            ("IM_LOG_MAX_TAILS", "0", "log.max_tails"),
            ("IM_LOG_MAX_TAILS", "65", "log.max_tails"),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{var}={value}: {e}");
        }
    }

    #[test]
    fn trace_keys_default_override_and_validate() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(c.obs.trace_sample_rate, 0.0);
        assert_eq!(c.obs.trace_max_recipients, 64);
        assert_eq!(c.obs.trace_store_size, 1024);
        assert_eq!(c.cluster.trace_timeout_ms, 1000);
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_OBS_TRACE_SAMPLE_RATE", "0.001"),
                ("IM_OBS_TRACE_MAX_RECIPIENTS", "8"),
                ("IM_OBS_TRACE_STORE_SIZE", "50"),
                ("IM_CLUSTER_TRACE_TIMEOUT_MS", "250"),
            ]),
        )
        .unwrap();
        assert_eq!(c.obs.trace_sample_rate, 0.001);
        assert_eq!(
            (c.obs.trace_max_recipients, c.obs.trace_store_size),
            (8, 50)
        );
        assert_eq!(c.cluster.trace_timeout_ms, 250);
        for (var, value, key) in [
            ("IM_OBS_TRACE_SAMPLE_RATE", "1.5", "obs.trace_sample_rate"),
            ("IM_OBS_TRACE_SAMPLE_RATE", "-0.1", "obs.trace_sample_rate"),
            ("IM_OBS_TRACE_SAMPLE_RATE", "often", "obs.trace_sample_rate"),
            (
                "IM_OBS_TRACE_MAX_RECIPIENTS",
                "257",
                "obs.trace_max_recipients",
            ),
            ("IM_OBS_TRACE_STORE_SIZE", "0", "obs.trace_store_size"),
            (
                "IM_CLUSTER_TRACE_TIMEOUT_MS",
                "5",
                "cluster.trace_timeout_ms",
            ),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{var}={value}: {e}");
        }
    }

    #[test]
    fn flood_limit_keys_default_and_validate() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(c.limits.ping_rate_per_sec, 10);
        assert_eq!(c.limits.ping_burst, 20);
        assert_eq!(c.limits.max_rate_limited, 100);
        assert_eq!(c.limits.rate_limited_window_secs, 10);
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_LIMITS_PING_RATE_PER_SEC", "0"),
                ("IM_LIMITS_MAX_RATE_LIMITED", "0"),
            ]),
        )
        .unwrap();
        assert_eq!(c.limits.ping_rate_per_sec, 0);
        assert_eq!(c.limits.max_rate_limited, 0);
        for (var, value, key) in [
            ("IM_LIMITS_PING_BURST", "0", "limits.ping_burst"),
            (
                "IM_LIMITS_RATE_LIMITED_WINDOW_SECS",
                "0",
                "limits.rate_limited_window_secs",
            ),
            (
                "IM_LIMITS_RATE_LIMITED_WINDOW_SECS",
                "7200",
                "limits.rate_limited_window_secs",
            ),
            (
                "IM_LIMITS_MAX_RATE_LIMITED",
                "2000000",
                "limits.max_rate_limited",
            ),
            (
                "IM_LIMITS_PING_RATE_PER_SEC",
                "2000000",
                "limits.ping_rate_per_sec",
            ),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{var}={value}: {e}");
        }
    }

    #[test]
    fn the_sqlite_memory_bound_defaults_to_8_mib_and_names_a_bad_value() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(c.store.sqlite_memory_mib, 8);
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[("IM_STORE_SQLITE_MEMORY_MIB", "0")]),
        )
        .unwrap();
        assert_eq!(c.store.sqlite_memory_mib, 0, "0: no limit");
        let e = Config::load_from(
            None,
            &Overrides::default(),
            env(&[("IM_STORE_SQLITE_MEMORY_MIB", "9999999")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("store.sqlite_memory_mib") && e.contains("9999999"),
            "{e}"
        );
    }

    #[test]
    fn bound_keys_default_parse_lists_and_refuse_short_secrets() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(c.limits.max_sessions_per_user, 16);
        assert_eq!(c.http.header_read_timeout_secs, 10);
        assert_eq!(c.flow.sync_page_budget(), 256 * 1024);
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_LIMITS_TRUSTED_PROXIES", "10.0.0.5, ::1"),
                ("IM_FLOW_SOFT_MARK_BYTES", "65536"),
            ]),
        )
        .unwrap();
        assert_eq!(c.limits.trusted_proxies, ["10.0.0.5", "::1"]);
        assert_eq!(
            c.flow.sync_page_budget(),
            32768,
            "at most half the soft mark"
        );
        for (var, value, key) in [
            (
                "IM_LIMITS_TRUSTED_PROXIES",
                "proxy.local",
                "limits.trusted_proxies",
            ),
            (
                "IM_HTTP_HEADER_READ_TIMEOUT_SECS",
                "0",
                "http.header_read_timeout_secs",
            ),
            ("IM_LIMITS_MAX_BATCH_FRAMES", "0", "limits.max_batch_frames"),
            ("IM_LIMITS_SYNC_BURST", "0", "limits.sync_burst"),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{var}={value}: {e}");
        }
        for (var, key) in [
            ("IM_JWT_SECRET", "jwt_secret"),
            ("IM_ADMIN_TOKEN", "admin_token"),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, "short-SECRET")]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("at least 32 bytes"), "{e}");
            assert!(!e.contains("short-SECRET"), "{e}");
        }
    }

    #[test]
    fn unknown_env_vars_are_refused_naming_them() {
        let e = Config::load_from(
            None,
            &Overrides::default(),
            env(&[("IM_PERSIST_BATCH_MAXX", "5")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("IM_PERSIST_BATCH_MAXX") && e.contains("did you mean IM_PERSIST_BATCH_MAX?"),
            "{e}"
        );
        let e = Config::load_from(None, &Overrides::default(), env(&[("IM_ZZZ", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("IM_ZZZ") && !e.contains("did you mean"), "{e}");
        // Other tools' variables, the `IM_LOG` alias and non-`IM_` names pass.
        Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_URL", "ws://x/ws"),
                ("IM_TOKEN", "t"),
                ("IM_DEVICE", "d"),
                ("IM_TEST_DATABASE_URL", "postgres://x"),
                ("IM_BENCH_SECRET", "s"),
                ("IM_LOG", "info"),
                ("IMPORTANT", "1"),
            ]),
        )
        .unwrap();
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = Config::load_from(
            None,
            &Overrides::default(),
            env(&[("IM_PERSIST_BATCH_MAX", "lots")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("IM_PERSIST_BATCH_MAX") && e.contains("lots"),
            "{e}"
        );

        let e = Config::load_from(None, &Overrides::default(), env(&[("IM_LISTEN", "nope")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`listen`") && e.contains("nope"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[persist]\nbatch_max = \"x\"\n").unwrap();
        let e = Config::load_from(Some(&file), &Overrides::default(), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("persist.batch_max"), "{e}");

        std::fs::write(&file, "[persist]\nbatch_mux = 3\n").unwrap();
        let e = Config::load_from(Some(&file), &Overrides::default(), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_mux"), "{e}");

        std::fs::write(
            &file,
            "[flow]\nsoft_mark_bytes = 5000\nhard_mark_bytes = 10\n",
        )
        .unwrap();
        let e = Config::load_from(Some(&file), &Overrides::default(), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("flow.hard_mark_bytes") && e.contains("10"),
            "{e}"
        );

        let e = Config::load_from(
            None,
            &Overrides {
                database_url: Some("mysql://x".into()),
                ..Default::default()
            },
            env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("database_url") && e.contains("mysql://x"), "{e}");
    }

    #[test]
    fn user_diag_keys_default_override_and_validate() {
        let c = Config::load_from(None, &Overrides::default(), env(&[])).unwrap();
        assert_eq!(c.obs.user_diag_ring, 32);
        assert_eq!(c.obs.user_diag_sample_every, 0);
        assert_eq!(c.obs.user_diag_max_users, 1000);
        assert_eq!(c.cluster.query_timeout_ms, 1000);
        let c = Config::load_from(
            None,
            &Overrides::default(),
            env(&[
                ("IM_OBS_USER_DIAG_RING", "8"),
                ("IM_OBS_USER_DIAG_SAMPLE_EVERY", "100"),
                ("IM_OBS_USER_DIAG_MAX_USERS", "5"),
                ("IM_CLUSTER_QUERY_TIMEOUT_MS", "250"),
            ]),
        )
        .unwrap();
        assert_eq!(c.obs.user_diag_ring, 8);
        assert_eq!(c.obs.user_diag_sample_every, 100);
        assert_eq!(c.obs.user_diag_max_users, 5);
        assert_eq!(c.cluster.query_timeout_ms, 250);
        for (var, value, key) in [
            ("IM_OBS_USER_DIAG_RING", "0", "obs.user_diag_ring"),
            ("IM_OBS_USER_DIAG_RING", "5000", "obs.user_diag_ring"),
            (
                "IM_OBS_USER_DIAG_SAMPLE_EVERY",
                "2000000",
                "obs.user_diag_sample_every",
            ),
            ("IM_OBS_USER_DIAG_MAX_USERS", "0", "obs.user_diag_max_users"),
            (
                "IM_CLUSTER_QUERY_TIMEOUT_MS",
                "1",
                "cluster.query_timeout_ms",
            ),
        ] {
            let e = Config::load_from(None, &Overrides::default(), env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{var}={value}: {e}");
        }
    }
}
