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
fn token_subcommand_uses_the_generated_secret_of_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let out = succeeds(
        Command::new(server_bin())
            .args(["token", "--user", "eve", "--data-dir"])
            .arg(dir.path())
            .env_remove("IM_JWT_SECRET"),
    );
    let secret = std::fs::read_to_string(dir.path().join("jwt_secret")).unwrap();
    let token = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        im_server::auth::TokenKeys::new(secret.trim().as_bytes())
            .verify(token.trim())
            .unwrap(),
        "eve"
    );
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
