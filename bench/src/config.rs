//! `--config scenario.toml`: a scenario and its flags in a TOML file, for runs that are
//! kept and repeated (`im-bench --config storm.toml`, or `im-bench broadcast --config
//! storm.toml`).
//!
//! The file is turned into command-line flags before parsing, so it accepts exactly the
//! flags of the scenario, with the same names (`snake_case` or `kebab-case`) and the same
//! validation:
//!
//! ```toml
//! scenario = "broadcast"          # optional when the command line names it
//! spawn = "target/release/im-server"
//! groups = 10
//! members = 1000
//! rate = 5
//! duration = "30s"
//! json = true                     # booleans: true sets the flag, false leaves it out
//! [server_env]                    # or: server_env = ["IM_FLOW_NOTIFY_GROUP_THRESHOLD=10000"]
//! IM_FLOW_NOTIFY_GROUP_THRESHOLD = 10000
//! ```
//!
//! Flags given on the command line as well win over the file's (they come after them).

use std::ffi::OsString;

use anyhow::{bail, Context};

/// The scenario names (subcommands).
pub const SCENARIOS: &[&str] = &[
    "chat",
    "idle",
    "broadcast",
    "mix",
    "roundtrip",
    "chaos",
    "abuse",
    "soak",
];
/// Global options that take a value (their value is not a subcommand).
const GLOBAL_VALUED: &[&str] = &["--threads"];

/// Expands `--config FILE` in `argv` (if present) into the flags the file holds.
pub fn expand_args(argv: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let Some((pos, path, width)) = find_config(&argv) else {
        return Ok(argv);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading --config {}", path.to_string_lossy()))?;
    let mut rest = argv;
    rest.drain(pos..pos + width);
    expand_with(rest, &text).with_context(|| format!("in --config {}", path.to_string_lossy()))
}

/// Where `--config` is: (index, path, how many argv items it takes).
fn find_config(argv: &[OsString]) -> Option<(usize, OsString, usize)> {
    for (i, a) in argv.iter().enumerate().skip(1) {
        let s = a.to_string_lossy();
        if s == "--" {
            return None;
        }
        if s == "--config" {
            return Some((i, argv.get(i + 1).cloned().unwrap_or_default(), 2));
        }
        if let Some(p) = s.strip_prefix("--config=") {
            return Some((i, OsString::from(p), 1));
        }
    }
    None
}

/// Inserts the flags of config `text` into `argv` (which no longer has `--config`).
pub fn expand_with(argv: Vec<OsString>, text: &str) -> anyhow::Result<Vec<OsString>> {
    let table: toml::Table = text.parse().context("parsing TOML")?;
    let from_file = match table.get("scenario") {
        None => None,
        Some(toml::Value::String(s)) => Some(s.clone()),
        Some(other) => bail!("`scenario` must be a string, not {other}"),
    };
    if let Some(s) = &from_file {
        if !SCENARIOS.contains(&s.as_str()) {
            bail!("unknown scenario {s:?} (one of: {})", SCENARIOS.join(", "));
        }
    }
    let sub = subcommand_index(&argv);
    let mut flags = Vec::new();
    for (key, value) in &table {
        if key == "scenario" {
            continue;
        }
        let flag = format!("--{}", key.replace('_', "-"));
        match value {
            toml::Value::Table(t) if flag == "--server-env" => {
                for (k, v) in t {
                    flags.push("--server-env".to_owned());
                    flags.push(format!("{k}={}", scalar(k, v)?));
                }
            }
            toml::Value::Array(items) => {
                for item in items {
                    flags.push(flag.clone());
                    flags.push(scalar(key, item)?);
                }
            }
            toml::Value::Boolean(true) => flags.push(flag),
            toml::Value::Boolean(false) => {}
            v => {
                flags.push(flag);
                flags.push(scalar(key, v)?);
            }
        }
    }
    let mut out: Vec<OsString> = Vec::with_capacity(argv.len() + flags.len() + 1);
    let insert_at = match (sub, &from_file) {
        (Some(i), Some(f)) if argv[i].to_string_lossy() != f.as_str() => bail!(
            "the file is for scenario {f:?} but the command line asks for {:?}",
            argv[i].to_string_lossy()
        ),
        (Some(i), _) => {
            out.extend_from_slice(&argv[..=i]);
            i + 1
        }
        (None, Some(f)) => {
            // No subcommand given: every argument is a flag (global ones such as
            // `--threads` are accepted after the subcommand too).
            out.extend_from_slice(&argv[..1.min(argv.len())]);
            out.push(OsString::from(f));
            1.min(argv.len())
        }
        (None, None) => {
            bail!("no scenario: name it on the command line or as `scenario = \"...\"`")
        }
    };
    out.extend(flags.into_iter().map(OsString::from));
    out.extend_from_slice(&argv[insert_at..]);
    Ok(out)
}

/// The position of the subcommand in `argv`, if any: the first argument that names a
/// scenario (and is not the value of a global option).
fn subcommand_index(argv: &[OsString]) -> Option<usize> {
    let mut i = 1;
    while i < argv.len() {
        let s = argv[i].to_string_lossy();
        if GLOBAL_VALUED.contains(&s.as_ref()) {
            i += 2;
            continue;
        }
        if s == "--" {
            return None;
        }
        if SCENARIOS.contains(&s.as_ref()) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// A scalar TOML value as flag text.
fn scalar(key: &str, v: &toml::Value) -> anyhow::Result<String> {
    Ok(match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => bail!("`{key}`: expected a string, number or boolean, not {other}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn strings(v: Vec<OsString>) -> Vec<String> {
        v.into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    const FILE: &str = r#"
        scenario = "broadcast"
        groups = 10
        rate = 2.5
        duration = "30s"
        json = true
        pull = false
        [server_env]
        IM_FLOW_NOTIFY_GROUP_THRESHOLD = 10000
    "#;

    #[test]
    fn file_flags_go_after_the_subcommand_and_before_the_command_line() {
        let out = strings(expand_with(args(&["im-bench", "--threads", "2"]), FILE).unwrap());
        assert_eq!(
            out,
            [
                "im-bench",
                "broadcast",
                "--duration",
                "30s",
                "--groups",
                "10",
                "--json",
                "--rate",
                "2.5",
                "--server-env",
                "IM_FLOW_NOTIFY_GROUP_THRESHOLD=10000",
                "--threads",
                "2"
            ]
        );
        let out =
            strings(expand_with(args(&["im-bench", "broadcast", "--groups", "1"]), FILE).unwrap());
        assert_eq!(&out[..2], ["im-bench", "broadcast"]);
        assert_eq!(&out[out.len() - 2..], ["--groups", "1"]);
    }

    #[test]
    fn mismatches_and_bad_values_are_errors() {
        assert!(expand_with(args(&["im-bench", "chat"]), FILE).is_err());
        assert!(expand_with(args(&["im-bench"]), "groups = 1").is_err());
        assert!(expand_with(args(&["im-bench"]), "scenario = \"nope\"").is_err());
        assert!(expand_with(args(&["im-bench", "chat"]), "x = { a = { b = 1 } }").is_err());
        assert!(expand_with(args(&["im-bench", "chat"]), "not toml [").is_err());
    }

    #[test]
    fn shipped_configs_parse() {
        use clap::Parser;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                let argv = expand_with(args(&["im-bench"]), &text).unwrap();
                crate::Cli::try_parse_from(argv)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                seen += 1;
            }
        }
        assert!(seen >= 4, "configs in {}", dir.display());
    }

    #[test]
    fn config_flag_is_found_and_removed() {
        let argv = args(&["im-bench", "chat", "--config", "/x.toml", "--senders", "3"]);
        let (pos, path, width) = find_config(&argv).unwrap();
        assert_eq!(
            (pos, path.to_string_lossy().as_ref(), width),
            (2, "/x.toml", 2)
        );
        let argv = args(&["im-bench", "--config=/y.toml"]);
        assert_eq!(find_config(&argv).unwrap().1, OsString::from("/y.toml"));
        assert!(find_config(&args(&["im-bench", "chat"])).is_none());
    }

    #[test]
    fn expanded_flags_parse_and_the_command_line_wins() {
        use clap::Parser;
        let file = "scenario = \"chat\"\nsenders = 7\nduration = \"3s\"\n";
        let argv = expand_with(args(&["im-bench", "chat", "--senders", "9"]), file).unwrap();
        let cli = crate::Cli::try_parse_from(argv).unwrap();
        let crate::scenarios::Scenario::Chat(a) = cli.scenario else {
            panic!("not chat")
        };
        assert_eq!(a.senders, 9);
        assert_eq!(a.run.duration, std::time::Duration::from_secs(3));
        let env = "scenario = \"chat\"\nserver_env = [\"A=1\"]\n";
        let argv = expand_with(args(&["im-bench", "--server-env", "B=2"]), env).unwrap();
        let crate::scenarios::Scenario::Chat(a) =
            crate::Cli::try_parse_from(argv).unwrap().scenario
        else {
            panic!("not chat")
        };
        assert_eq!(a.server.server_env.len(), 2);
        let bad = expand_with(args(&["im-bench"]), "scenario = \"chat\"\nnope = 1").unwrap();
        assert!(crate::Cli::try_parse_from(bad).is_err());
    }
}
