//! Secret rotation against the real binary: client token keys listed by `kid` in the
//! config file (`auth.jwt_keys`, `auth.signing_kid`) and the admin token, reloaded without
//! a restart by SIGHUP and by `POST /admin/v1/reload`. Tokens of the old key keep working
//! while it is listed, the new signing key's work (and `im-server token` signs with it),
//! the old ones are refused once their key is removed; a bad reload keeps the keys in
//! force and answers why; a rotated admin token takes over from the old one.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use im_server::auth::{Key, TokenKeys};

use crate::support::*;

const K1: &str = "first-key-secret-of-at-least-32-bytes!!";
const K2: &str = "second-key-secret-of-at-least-32-bytes!";

/// Writes `text` to `path` with mode 0600 (secret files must be private).
fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The config file: the listed keys as `(kid, secret file)`, and the signing key.
fn write_config(path: &Path, keys: &[(&str, &Path)], signing: &str) {
    let mut text = format!("[auth]\nsigning_kid = \"{signing}\"\n");
    for (kid, file) in keys {
        text.push_str(&format!(
            "[[auth.jwt_keys]]\nkid = \"{kid}\"\nsecret_file = {}\n",
            serde_json::to_string(&file.to_string_lossy()).unwrap()
        ));
    }
    std::fs::write(path, text).unwrap();
}

/// A token for `user` signed with `secret` under `kid`.
fn token(kid: &str, secret: &str, user: &str) -> String {
    let key = Key {
        kid: kid.into(),
        secret: secret.as_bytes().to_vec(),
    };
    TokenKeys::with_keys(&[key], kid, kid, 5)
        .unwrap()
        .issue(user, Duration::from_secs(600))
        .unwrap()
}

/// The `kid` of a token's header.
fn kid_of(token: &str) -> Option<String> {
    use base64::Engine;
    let head = token.split('.').next()?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&json).ok()?;
    v["kid"].as_str().map(str::to_owned)
}

/// Whether `token` logs in.
async fn logs_in(server: &TestServer, token: &str) -> bool {
    let mut c = im_client::RawConn::connect(&server.ws_url()).await.unwrap();
    c.login(token, "d", false).await.is_ok()
}

/// Sends SIGHUP and waits for the `n`th "secrets reloaded" line of the log.
fn sighup_and_wait(server: &TestServer, n: usize) {
    server.signal("HUP");
    wait_until("the reload after SIGHUP", || {
        server.log().matches("secrets reloaded").count() >= n
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_admin_token_rotate_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (f1, f2) = (dir.path().join("k1"), dir.path().join("k2"));
    write_private(&f1, K1);
    write_private(&f2, K2);
    let config = dir.path().join("im.toml");
    write_config(&config, &[("k1", &f1)], "k1");
    let cfg = config.to_string_lossy().to_string();
    // The single-secret and admin-token variables of the test harness are emptied: the
    // keys come from the file, the admin token from the data dir's file.
    let server = TestServer::start_with_args(
        &[("IM_JWT_SECRET", ""), ("IM_ADMIN_TOKEN", "")],
        &["--config", &cfg],
    );
    let old = token("k1", K1, "alice");
    assert!(
        logs_in(&server, &old).await,
        "k1's token before the rotation"
    );

    // k2 listed and signing, k1 still listed: both keys' tokens log in, and
    // `im-server token` signs with k2.
    write_config(&config, &[("k1", &f1), ("k2", &f2)], "k2");
    sighup_and_wait(&server, 1);
    let out = Command::new(server_bin())
        .args(["--config", &cfg, "--data-dir"])
        .arg(&server.data_dir)
        .args(["token", "--user", "bob"])
        .env("IM_JWT_SECRET", "")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert_eq!(
        kid_of(&new).as_deref(),
        Some("k2"),
        "im-server token signs with k2"
    );
    assert!(
        logs_in(&server, &old).await,
        "k1's token while k1 is listed"
    );
    assert!(logs_in(&server, &new).await, "k2's token");

    // A bad reload (a signing key that is not listed) changes nothing and says why.
    let admin = server.admin_addr;
    let admin_token = std::fs::read_to_string(server.data_dir.join("admin_token")).unwrap();
    let admin_token = admin_token.trim().to_owned();
    write_config(&config, &[("k2", &f2)], "k3");
    let (status, body) = http(admin, "POST", "/admin/v1/reload", Some(&admin_token));
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("auth.signing_kid") && body.contains("k3"),
        "{body}"
    );
    // The log line is written by the logging thread, maybe after the answer.
    wait_until("the failed reload is logged", || {
        server.log().contains("secrets not reloaded")
    });
    assert!(logs_in(&server, &old).await, "k1 stays after a bad reload");

    // k1 removed: its tokens are refused, k2's still log in.
    write_config(&config, &[("k2", &f2)], "k2");
    sighup_and_wait(&server, 2);
    assert!(
        !logs_in(&server, &old).await,
        "k1's token after k1 was removed"
    );
    assert!(
        logs_in(&server, &new).await,
        "k2's token after k1 was removed"
    );

    // The admin token rotated the same way: a new file, a reload; the old token is
    // refused from then on, the new one is taken.
    let rotated = "rotated-admin-token-of-at-least-32-bytes";
    write_private(&server.data_dir.join("admin_token"), rotated);
    let (status, body) = http(admin, "POST", "/admin/v1/reload", Some(&admin_token));
    assert_eq!(status, 200, "{body}");
    let answer: im_admin_api::SecretsReloaded = serde_json::from_str(&body).unwrap();
    assert!(answer.admin_token_changed, "{body}");
    assert_eq!(answer.signing_kid, "k2");
    assert_eq!(answer.kids, vec!["k2".to_owned()]);
    let (status, _) = http(admin, "GET", "/admin/v1/overview", Some(&admin_token));
    assert_eq!(status, 401, "the old admin token after the rotation");
    let (status, _) = http(admin, "GET", "/admin/v1/overview", Some(rotated));
    assert_eq!(status, 200, "the new admin token");
}

#[test]
fn a_jwt_secret_beside_listed_keys_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let f1 = dir.path().join("k1");
    write_private(&f1, K1);
    let config = dir.path().join("im.toml");
    write_config(&config, &[("k1", &f1)], "k1");
    let out = Command::new(server_bin())
        .args(["--config"])
        .arg(&config)
        .env("IM_DATA_DIR", dir.path().join("data"))
        .env("IM_JWT_SECRET", SECRET)
        .env("IM_LISTEN", "127.0.0.1:0")
        .env("IM_ADMIN_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("jwt_secret") && err.contains("auth.jwt_keys"),
        "{err}"
    );
    assert!(!err.contains(SECRET), "the secret leaked: {err}");
}
