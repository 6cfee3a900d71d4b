//! `im-bench peer` against the real Mosquitto and nats-server binaries (skipped, with a
//! note, where they are not installed): each test starts its own broker on free loopback
//! ports with a WebSocket listener, runs a short scenario and checks the JSON report:
//! everything delivered once, acks counted, the broker's CPU and RSS read from /proc.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A broker child process, killed when dropped.
struct Broker {
    child: Child,
    ws_port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn on_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// Two distinct free loopback ports: both listeners are held until both are chosen, so
/// the kernel cannot hand the same port out twice.
fn free_ports() -> (u16, u16) {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    let (a, b) = (bind(), bind());
    let port = |l: &TcpListener| l.local_addr().expect("local addr").port();
    (port(&a), port(&b))
}

/// Waits until `port` accepts; `false` when the broker exited first (a port taken by
/// another test between our pick and its bind).
fn wait_listening(port: u16, child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("the broker exited before listening on {port}: {status}");
            return false;
        }
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Starts `bin` with `conf` (in which `{MAIN}` and `{WS}` become free ports), on new
/// ports again when a port was taken before the broker bound it.
fn start(bin: &Path, conf: &str, conf_flag: &str) -> Broker {
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let (main, ws) = free_ports();
        let text = conf
            .replace("{MAIN}", &main.to_string())
            .replace("{WS}", &ws.to_string());
        let path = dir.path().join("broker.conf");
        std::fs::write(&path, text).expect("writing the config");
        let mut child = Command::new(bin)
            .arg(conf_flag)
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the broker");
        // Both listeners: nats-server opens its WebSocket port after the client port.
        if wait_listening(main, &mut child) && wait_listening(ws, &mut child) {
            return Broker {
                child,
                ws_port: ws,
                _dir: dir,
            };
        }
    }
    panic!("{} did not start on free ports in 5 tries", bin.display());
}

fn mosquitto() -> Option<Broker> {
    let Some(bin) = on_path("mosquitto") else {
        eprintln!("skipped: mosquitto is not installed");
        return None;
    };
    let conf = "per_listener_settings false\nallow_anonymous true\npersistence false\n\
                log_dest none\nlistener {MAIN} 127.0.0.1\nprotocol mqtt\n\
                listener {WS} 127.0.0.1\nprotocol websockets\n";
    Some(start(&bin, conf, "-c"))
}

fn nats() -> Option<Broker> {
    let Some(bin) = on_path("nats-server") else {
        eprintln!("skipped: nats-server is not installed");
        return None;
    };
    let conf = "listen: \"127.0.0.1:{MAIN}\"\nwebsocket {\n  listen: \"127.0.0.1:{WS}\"\n  no_tls: true\n}\n";
    Some(start(&bin, conf, "-c"))
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_im-bench"))
        .arg("peer")
        .args(args)
        .output()
        .expect("running im-bench")
}

fn report(broker: &Broker, protocol: &str, scenario: &[&str]) -> serde_json::Value {
    let url = format!("ws://127.0.0.1:{}/", broker.ws_port);
    let pid = broker.child.id().to_string();
    let mut args = vec![
        scenario[0],
        "--protocol",
        protocol,
        "--url",
        &url,
        "--server-pid",
        &pid,
    ];
    args.extend(&scenario[1..]);
    args.extend([
        "--warmup",
        "1s",
        "--duration",
        "2s",
        "--drain",
        "3s",
        "--sources",
        "8",
        "--json",
    ]);
    let out = bench(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "im-bench {args:?} failed: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("report: {e}: {stderr}"))
}

fn check_fanout(r: &serde_json::Value, members: u64) {
    assert_eq!(r["passed"], true, "{r}");
    let d = &r["delivery"];
    assert!(d["expected"].as_u64().unwrap() >= 40 * members, "{r}");
    assert_eq!(d["delivered"], d["expected"], "{r}");
    assert_eq!(d["duplicates"], 0, "{r}");
    assert!(r["delivery_latency"]["count"].as_u64().unwrap() > 0, "{r}");
    assert!(r["server"]["rss_bytes"].as_u64().unwrap() > 0, "{r}");
}

fn check_pairs(r: &serde_json::Value) {
    assert_eq!(r["passed"], true, "{r}");
    assert_eq!(r["unacked"], 0, "{r}");
    assert!(r["ack_latency"]["count"].as_u64().unwrap() >= 4 * 20, "{r}");
    assert_eq!(r["delivery"]["delivered"], r["delivery"]["expected"], "{r}");
    assert!(r["server"]["rss_bytes"].as_u64().unwrap() > 0, "{r}");
}

#[test]
fn mosquitto_broadcast_pairs_and_idle() {
    let Some(b) = mosquitto() else { return };
    check_fanout(
        &report(
            &b,
            "mqtt-ws",
            &["broadcast", "--members", "20", "--rate", "20"],
        ),
        20,
    );
    check_pairs(&report(
        &b,
        "mqtt-ws",
        &["pairs", "--pairs", "4", "--rate", "10"],
    ));
    let idle = report(&b, "mqtt-ws", &["idle", "--connections", "200"]);
    assert_eq!(idle["open_at_end"], 200, "{idle}");
    assert!(idle["rss_per_connection"].as_u64().is_some(), "{idle}");
}

#[test]
fn nats_broadcast_pairs_and_idle() {
    let Some(b) = nats() else { return };
    check_fanout(
        &report(
            &b,
            "nats-ws",
            &["broadcast", "--members", "20", "--rate", "20"],
        ),
        20,
    );
    check_pairs(&report(
        &b,
        "nats-ws",
        &["pairs", "--pairs", "4", "--rate", "10"],
    ));
    let idle = report(&b, "nats-ws", &["idle", "--connections", "200"]);
    assert_eq!(idle["open_at_end"], 200, "{idle}");
    assert!(idle["rss_per_connection"].as_u64().is_some(), "{idle}");
}

#[test]
fn the_wrong_protocol_is_a_clear_error() {
    let Some(b) = nats() else { return };
    let url = format!("ws://127.0.0.1:{}/", b.ws_port);
    let out = bench(&[
        "pairs",
        "--protocol",
        "mqtt-ws",
        "--url",
        &url,
        "--pairs",
        "1",
        "--duration",
        "1s",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("im-bench: error"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
