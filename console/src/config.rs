//! Config: the command line, the optional config file (`~/.config/im-console.toml`) and
//! the environment, resolved into one [`Settings`]. Token precedence: `--token`, then
//! `--token-file`, then `IM_ADMIN_TOKEN`, then the file's `token`, then its `token_file`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Node URL used when none is given anywhere.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7071";

/// Command-line options of `im-console`.
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(
    name = "im-console",
    version,
    about = "Operator console for im-server nodes (admin API)",
    after_help = "Token: --token, --token-file (e.g. DATA_DIR/admin_token), env IM_ADMIN_TOKEN, or the config file.\n\
                  Config file keys: urls = [..], token, token_file, profile_dir, interval_ms, timeout_ms.\n\
                  Press ? in the console for every key."
)]
pub struct Options {
    /// Admin API of a node, e.g. http://127.0.0.1:7071 (repeat for several nodes).
    #[arg(long = "url", value_name = "URL")]
    pub urls: Vec<String>,
    /// Admin bearer token (visible in `ps`: prefer --token-file or IM_ADMIN_TOKEN).
    #[arg(long)]
    pub token: Option<String>,
    /// File holding the admin token, e.g. the server's DATA_DIR/admin_token.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Config file (default: $XDG_CONFIG_HOME/im-console.toml or ~/.config/im-console.toml).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Poll interval in milliseconds.
    #[arg(long, value_name = "MS")]
    pub interval_ms: Option<u64>,
    /// Timeout of each request in milliseconds.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Folder CPU profiles are saved to (changeable in the capture form).
    #[arg(long, value_name = "DIR")]
    pub profile_dir: Option<PathBuf>,
}

/// The config file's keys, all optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// Node URLs, used when no `--url` is given.
    pub urls: Vec<String>,
    /// Admin token.
    pub token: Option<String>,
    /// File holding the admin token.
    pub token_file: Option<PathBuf>,
    /// Folder for CPU profiles.
    pub profile_dir: Option<PathBuf>,
    /// Poll interval in milliseconds.
    pub interval_ms: Option<u64>,
    /// Request timeout in milliseconds.
    pub timeout_ms: Option<u64>,
}

/// Why the settings could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file exists but could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for these keys.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (names the key).
        message: String,
    },
    /// A token file could not be read.
    #[error("token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A token (or token file) is empty.
    #[error("{0}: the token is empty")]
    EmptyToken(String),
    /// A value is out of range.
    #[error("{key} = {value}: {expected}")]
    Invalid {
        /// The option.
        key: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
}

/// Everything the console needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Node admin URLs.
    pub urls: Vec<String>,
    /// Admin token, if any was found.
    pub token: Option<String>,
    /// Where the token came from (for the start-up message), e.g. `--token-file`.
    pub token_source: String,
    /// Poll interval.
    pub interval: Duration,
    /// Timeout of each request.
    pub timeout: Duration,
    /// Folder for CPU profiles.
    pub profile_dir: PathBuf,
}

/// `$XDG_CONFIG_HOME/im-console.toml`, else `$HOME/.config/im-console.toml`.
pub fn default_config_path(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(x) = env("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        return Some(Path::new(&x).join("im-console.toml"));
    }
    env("HOME")
        .filter(|v| !v.is_empty())
        .map(|h| Path::new(&h).join(".config").join("im-console.toml"))
}

/// Reads a config file; a missing file is an empty config unless it was asked for by name.
pub fn load_file(path: &Path, required: bool) -> Result<FileConfig, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
            return Ok(FileConfig::default())
        }
        Err(source) => {
            return Err(ConfigError::Read {
                path: path.to_owned(),
                source,
            })
        }
    };
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Reads a token file (surrounding whitespace trimmed).
pub fn read_token_file(path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::TokenFile {
        path: path.to_owned(),
        source,
    })?;
    let token = text.trim().to_owned();
    if token.is_empty() {
        return Err(ConfigError::EmptyToken(path.display().to_string()));
    }
    Ok(token)
}

fn millis(key: &'static str, v: u64) -> Result<Duration, ConfigError> {
    if (100..=60_000).contains(&v) {
        Ok(Duration::from_millis(v))
    } else {
        Err(ConfigError::Invalid {
            key,
            value: v.to_string(),
            expected: "milliseconds from 100 to 60000",
        })
    }
}

/// Resolves options, config file and environment (read through `env`) into [`Settings`].
pub fn resolve(
    opts: &Options,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, ConfigError> {
    let file = match &opts.config {
        Some(p) => load_file(p, true)?,
        None => match default_config_path(env) {
            Some(p) => load_file(&p, false)?,
            None => FileConfig::default(),
        },
    };
    let urls = if !opts.urls.is_empty() {
        opts.urls.clone()
    } else if !file.urls.is_empty() {
        file.urls.clone()
    } else {
        vec![DEFAULT_URL.to_owned()]
    };
    let nonempty = |t: &str, from: &str| -> Result<String, ConfigError> {
        let t = t.trim();
        if t.is_empty() {
            Err(ConfigError::EmptyToken(from.to_owned()))
        } else {
            Ok(t.to_owned())
        }
    };
    let (token, token_source) = if let Some(t) = &opts.token {
        (Some(nonempty(t, "--token")?), "--token".to_owned())
    } else if let Some(p) = &opts.token_file {
        (
            Some(read_token_file(p)?),
            format!("--token-file {}", p.display()),
        )
    } else if let Some(t) = env("IM_ADMIN_TOKEN").filter(|t| !t.trim().is_empty()) {
        (Some(t.trim().to_owned()), "IM_ADMIN_TOKEN".to_owned())
    } else if let Some(t) = &file.token {
        (Some(nonempty(t, "config token")?), "config file".to_owned())
    } else if let Some(p) = &file.token_file {
        (
            Some(read_token_file(p)?),
            format!("config token_file {}", p.display()),
        )
    } else {
        (None, "none".to_owned())
    };
    Ok(Settings {
        urls,
        token,
        token_source,
        interval: millis(
            "interval_ms",
            opts.interval_ms.or(file.interval_ms).unwrap_or(1000),
        )?,
        timeout: millis(
            "timeout_ms",
            opts.timeout_ms.or(file.timeout_ms).unwrap_or(2000),
        )?,
        profile_dir: opts
            .profile_dir
            .clone()
            .or(file.profile_dir)
            .unwrap_or_else(|| PathBuf::from(".")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults() {
        let s = resolve(&Options::default(), &no_env).unwrap();
        assert_eq!(s.urls, vec![DEFAULT_URL.to_owned()]);
        assert_eq!(s.token, None);
        assert_eq!(s.interval, Duration::from_secs(1));
    }

    #[test]
    fn token_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let tf = dir.path().join("admin_token");
        std::fs::write(&tf, "from-file\n").unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            "urls = [\"http://a:1\", \"http://b:2\"]\ntoken = \"from-config\"\n",
        )
        .unwrap();
        let env = |k: &str| (k == "IM_ADMIN_TOKEN").then(|| "from-env".to_owned());
        let mut o = Options {
            config: Some(cfg.clone()),
            ..Options::default()
        };
        let s = resolve(&o, &no_env).unwrap();
        assert_eq!(s.token.as_deref(), Some("from-config"));
        assert_eq!(s.urls.len(), 2);
        assert_eq!(
            resolve(&o, &env).unwrap().token.as_deref(),
            Some("from-env")
        );
        o.token_file = Some(tf);
        assert_eq!(
            resolve(&o, &env).unwrap().token.as_deref(),
            Some("from-file")
        );
        o.token = Some("from-flag".into());
        assert_eq!(
            resolve(&o, &env).unwrap().token.as_deref(),
            Some("from-flag")
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, "tokn = \"typo\"\n").unwrap();
        let o = Options {
            config: Some(cfg),
            ..Options::default()
        };
        let e = resolve(&o, &no_env).unwrap_err();
        assert!(e.to_string().contains("tokn"), "{e}");
        let o = Options {
            config: Some(dir.path().join("missing.toml")),
            ..Options::default()
        };
        assert!(matches!(
            resolve(&o, &no_env),
            Err(ConfigError::Read { .. })
        ));
        let o = Options {
            interval_ms: Some(5),
            ..Options::default()
        };
        assert!(resolve(&o, &no_env).is_err());
        let o = Options {
            token_file: Some(dir.path().join("nope")),
            ..Options::default()
        };
        assert!(matches!(
            resolve(&o, &no_env),
            Err(ConfigError::TokenFile { .. })
        ));
    }
}
