//! The binary's command line: token issuing and config errors.

use std::process::Command;

use crate::support::*;

/// Runs the command, expecting success (its stderr shown otherwise); its output.
fn succeeds(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn token_subcommand_prints_a_token_the_server_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let out = succeeds(
        Command::new(server_bin())
            .args(["token", "--user", "dora", "--ttl", "10m"])
            .env("IM_DATA_DIR", dir.path())
            .env("IM_JWT_SECRET", SECRET),
    );
    let token = String::from_utf8(out.stdout).unwrap();
    let user = im_server::auth::TokenKeys::new(SECRET.as_bytes())
        .verify(token.trim())
        .expect("valid token");
    assert_eq!(user, "dora");
}

#[test]
fn token_subcommand_uses_the_secret_the_server_created_in_its_data_dir() {
    // With no secrets configured, the server creates them in its data dir at first start.
    let server = TestServer::start_with(&[("IM_JWT_SECRET", ""), ("IM_ADMIN_TOKEN", "")]);
    let out = succeeds(
        Command::new(server_bin())
            .args(["token", "--user", "eve", "--data-dir"])
            .arg(&server.data_dir)
            .env_remove("IM_JWT_SECRET"),
    );
    let secret = std::fs::read_to_string(server.data_dir.join("jwt_secret")).unwrap();
    let token = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        im_server::auth::TokenKeys::new(secret.trim().as_bytes())
            .verify(token.trim())
            .unwrap(),
        "eve"
    );
}

#[test]
fn token_subcommand_without_a_secret_fails_naming_the_path_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(server_bin())
        .args(["token", "--user", "alice"])
        .current_dir(dir.path())
        .env_remove("IM_DATA_DIR")
        .env_remove("IM_JWT_SECRET")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "token succeeded: {err}");
    assert!(out.stdout.is_empty(), "printed a token");
    let looked_in = std::fs::canonicalize(dir.path())
        .unwrap()
        .join("data/jwt_secret");
    assert!(err.contains(&looked_in.display().to_string()), "{err}");
    assert!(
        err.contains("--data-dir") && err.contains("IM_JWT_SECRET"),
        "{err}"
    );
    assert!(!data.exists(), "created {}", data.display());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Runs the server command with `data_dir`, expecting it to refuse to start; its stderr.
fn refused_start(cmd: &mut Command, data_dir: &std::path::Path) -> String {
    let out = cmd.env("IM_DATA_DIR", data_dir).output().unwrap();
    assert!(!out.status.success(), "the server started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_config_fails_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused_start(
        Command::new(server_bin()).env("IM_PERSIST_BATCH_MAX", "lots"),
        dir.path(),
    );
    assert!(
        err.contains("IM_PERSIST_BATCH_MAX") && err.contains("lots"),
        "{err}"
    );

    let file = dir.path().join("im.toml");
    std::fs::write(&file, "[limits]\nmax_frame_bytes = 10\n").unwrap();
    let err = refused_start(
        Command::new(server_bin()).arg("--config").arg(&file),
        dir.path(),
    );
    assert!(
        err.contains("limits.max_frame_bytes") && err.contains("10"),
        "{err}"
    );
}

#[test]
fn a_misspelt_env_var_fails_start_up_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused_start(
        Command::new(server_bin()).env("IM_PERSIST_BATCH_MAXX", "5"),
        dir.path(),
    );
    assert!(
        err.contains("IM_PERSIST_BATCH_MAXX") && err.contains("IM_PERSIST_BATCH_MAX?"),
        "{err}"
    );
    // `im-server token` reads the same config, so it refuses too.
    let err = refused_start(
        Command::new(server_bin())
            .args(["token", "--user", "dora"])
            .env("IM_JWT_SECRET", SECRET)
            .env("IM_PERSIST_BATCH_MAXX", "5"),
        dir.path(),
    );
    assert!(err.contains("IM_PERSIST_BATCH_MAXX"), "{err}");
}

#[test]
fn env_vars_other_tools_read_do_not_stop_the_server() {
    let others = [
        ("IM_URL", "ws://127.0.0.1:1/ws"),
        ("IM_TOKEN", "not-a-server-setting"),
        ("IM_TOKEN_FILE", "/nonexistent"),
        ("IM_DEVICE", "cli"),
        ("IM_SERVER_BIN", "/nonexistent"),
        ("IM_TEST_SOMETHING", "1"),
        ("IM_BENCH_SECRET", "x"),
    ];
    let server = TestServer::start_with(&others);
    assert!(!server.ws_url().is_empty());
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(server_bin());
    cmd.args(["token", "--user", "dora"])
        .env("IM_DATA_DIR", dir.path())
        .env("IM_JWT_SECRET", SECRET);
    for (k, v) in others {
        cmd.env(k, v);
    }
    let out = succeeds(&mut cmd);
    assert!(!out.stdout.is_empty());
}

#[test]
fn unreachable_postgres_is_named_once_with_its_key_and_cause() {
    // A port nothing listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://im:hunter2@127.0.0.1:{port}/im");
    let out = Command::new(server_bin())
        .env("IM_DATA_DIR", dir.path())
        .env("IM_DATABASE_URL", &url)
        .env("IM_LISTEN", "127.0.0.1:0")
        .env("IM_ADMIN_LISTEN", "127.0.0.1:0")
        .env("IM_STORE_ACQUIRE_TIMEOUT_MS", "2000")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("im-server: error:"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert_eq!(line.matches("database_url").count(), 1, "{line}");
    assert!(
        line.contains(&format!("im:***@127.0.0.1:{port}/im")),
        "{line}"
    );
    assert!(!err.contains("hunter2"), "the password leaked: {err}");
    assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
}
