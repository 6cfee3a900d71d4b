//! Listen: the accept loops of both listeners. Each accepted socket is tuned
//! (TCP_NODELAY, buffers), admitted (the client listener takes its slot under the
//! connection caps here, before a byte of the request is read, so half-sent requests
//! count against the caps; the admin listener has its own cap), then served by hyper's
//! HTTP/1 connection with a timer, so a request head must arrive complete within
//! `http.header_read_timeout_secs` (also the idle limit of a kept-alive connection) and
//! within `http.max_header_bytes`. A socket over a cap gets a canned 503 and is closed.
//! Both loops own their HTTP connections and stop gracefully on a [`Stop`] signal.
//! A listener with `[tls]` files set does the TLS handshake ([`tls`]) in the
//! connection's task, after admission and within `tls.handshake_timeout_secs`; without
//! them the socket goes to hyper as it is (plain TCP costs nothing more).

pub mod tls;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::config::Http;
use crate::gateway::pooled::PooledRead;
use crate::gateway::{Gateway, Slot};

pub use self::tls::{TlsError, TlsListener};

/// Which listener a socket came in on (label `listener` of `im_http_rejected_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The client listener (`GET /ws`).
    Client,
    /// The admin listener.
    Admin,
}

impl Listener {
    fn label(self) -> &'static str {
        match self {
            Listener::Client => "client",
            Listener::Admin => "admin",
        }
    }
}

/// Counts a socket the HTTP layer closed.
fn rejected(listener: Listener, reason: &'static str) {
    metrics::counter!("im_http_rejected_total", "listener" => listener.label(), "reason" => reason)
        .increment(1);
}

/// Socket options applied to every accepted client socket.
#[derive(Debug, Clone, Copy)]
pub struct SocketOpts {
    /// SO_SNDBUF (0: OS default).
    pub send_buffer: usize,
    /// SO_RCVBUF (0: OS default).
    pub recv_buffer: usize,
}

fn builder(http: &Http) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(http.header_read_timeout_secs as u64))
        .max_header_size(http.max_header_bytes as usize)
        .max_buf_size((http.max_header_bytes as usize).max(8192))
        .keep_alive(true);
    b
}

/// The stop signal of both accept loops: once `true` is sent, a loop stops accepting,
/// asks each of its open HTTP connections to finish (hyper's graceful shutdown: the
/// request in flight is answered, then the connection closes; an idle kept-alive one
/// closes at once) and returns when they have, as axum's `with_graceful_shutdown` does.
/// Upgraded WebSocket connections are not the listener's: the gateway's drain closes
/// them.
pub type Stop = tokio::sync::watch::Receiver<bool>;

/// Resolves once `stop` says so (never, if its sender is gone without saying it).
async fn stopped(stop: &mut Stop) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What serving one admitted socket needs besides the socket.
struct Conn {
    b: http1::Builder,
    remote: SocketAddr,
    router: Router,
    slot: Slot,
    listener: Listener,
    stop: Stop,
}

/// Serves one admitted socket (plain TCP or a TLS stream) with `router` until it
/// closes or upgrades, or finishes its request in flight after `stop`; counts what the
/// HTTP layer refused.
async fn serve_conn<S>(c: Conn, tcp: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Conn {
        b,
        remote,
        router,
        slot,
        listener,
        mut stop,
    } = c;
    let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
        req.extensions_mut().insert(ConnectInfo(remote));
        req.extensions_mut().insert(slot.clone());
        let mut router = router.clone();
        tower_service::Service::call(&mut router, req.map(axum::body::Body::new))
    });
    let conn = b
        .serve_connection(TokioIo::new(PooledRead::new(tcp)), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        let reason = if e.is_timeout() {
            "header_timeout"
        } else if e.is_parse_too_large() {
            "header_too_large"
        } else if e.is_parse() {
            "bad_request"
        } else {
            return;
        };
        rejected(listener, reason);
        tracing::debug!(%remote, listener = listener.label(), reason, "http connection closed");
    }
}

/// Serves one admitted socket: at once on a plain listener; after the TLS handshake
/// (bounded, and given up on `stop`) on a TLS one.
async fn serve_socket(tls: Option<Arc<TlsListener>>, tcp: TcpStream, mut c: Conn) {
    let Some(tls) = tls else {
        return serve_conn(c, tcp).await;
    };
    let stream = tokio::select! {
        s = tls.handshake(tcp) => s,
        () = stopped(&mut c.stop) => None,
    };
    if let Some(stream) = stream {
        serve_conn(c, stream).await;
    }
}

/// SIGHUP (`systemctl reload`, the unit's `ExecReload`): reloads the certificates of
/// the TLS listeners in `tls` at once, without waiting for the file watch; with none,
/// logs that there is no certificate to reload. (The binary also reloads the secrets on
/// SIGHUP.) The handler is registered by this call, before the node answers anyone, so
/// SIGHUP's default action (ending the process) never meets a node that is up, even one
/// run as a library; the returned future runs until aborted.
pub fn reload_on_hangup(tls: Vec<Arc<TlsListener>>) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let hup = signal(SignalKind::hangup());
    async move {
        let mut hup = match hup {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot handle SIGHUP: systemctl reload would end the process");
                return;
            }
        };
        while hup.recv().await.is_some() {
            if tls.is_empty() {
                tracing::info!("SIGHUP: no TLS listener, no certificate to reload");
            }
            for t in &tls {
                t.reload_logged("SIGHUP");
            }
        }
    }
}

/// The certificate watch of a TLS listener, aborted when the accept loop ends.
fn watch(tls: &Option<Arc<TlsListener>>) -> Option<tokio::task::JoinHandle<()>> {
    tls.as_ref().map(|t| tokio::spawn(t.clone().watch()))
}

/// Most refused sockets lingering in [`refuse`] at once; past it a refused socket is
/// closed at once (a reset), so a flood of refusals holds few descriptors.
const MAX_LINGERING: usize = 256;

/// Refuses a socket: answered and closed by a task (at most [`MAX_LINGERING`] at once,
/// counted in `lingering`), or dropped at once.
fn refuse_bounded(tcp: TcpStream, message: &'static str, lingering: &Arc<AtomicUsize>) {
    if lingering.fetch_add(1, Ordering::Relaxed) >= MAX_LINGERING {
        lingering.fetch_sub(1, Ordering::Relaxed);
        drop(tcp);
        return;
    }
    let lingering = lingering.clone();
    tokio::spawn(async move {
        refuse(tcp, message).await;
        lingering.fetch_sub(1, Ordering::Relaxed);
    });
}

/// Answers a socket refused at accept with a canned 503 and closes it; reads (and
/// discards) a little of what the client sent first, for at most a second, so the close
/// is a FIN rather than a reset that would lose the answer.
async fn refuse(mut tcp: TcpStream, message: &str) {
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{message}",
        message.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = tcp.write_all(head.as_bytes()).await;
        let _ = tcp.shutdown().await;
        let mut buf = [0u8; 1024];
        let mut left = 64 * 1024usize;
        while left > 0 {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// The next accepted socket; an accept error (e.g. out of descriptors) is logged and
/// waited out without spinning.
async fn accept(listener: &TcpListener, which: Listener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(a) => return a,
            Err(e) => {
                tracing::warn!(listener = which.label(), error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The next accepted socket, or `None` once `stop` says so; reaps the connections of
/// `conns` that have finished meanwhile.
async fn next_socket(
    listener: &TcpListener,
    which: Listener,
    conns: &mut JoinSet<()>,
    stop: &mut Stop,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            a = accept(listener, which) => return Some(a),
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = stopped(stop) => return None,
        }
    }
}

/// After `stop`: no more accepts (the listener closes), then the open HTTP connections
/// finish (each saw the same signal).
async fn wind_down(listener: TcpListener, mut conns: JoinSet<()>) {
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// The client listener: admits each socket under the connection caps at accept, then
/// serves `router` on it (over TLS when `tls` is set), until `stop`.
pub async fn serve_client(
    listener: TcpListener,
    router: Router,
    gw: Arc<Gateway>,
    http: Http,
    opts: SocketOpts,
    tls: Option<Arc<TlsListener>>,
    mut stop: Stop,
) {
    let b = builder(&http);
    let watcher = watch(&tls);
    let lingering = Arc::new(AtomicUsize::new(0));
    let mut conns = JoinSet::new();
    while let Some((tcp, remote)) =
        next_socket(&listener, Listener::Client, &mut conns, &mut stop).await
    {
        let _ = tcp.set_nodelay(true);
        let sock = socket2::SockRef::from(&tcp);
        if opts.send_buffer > 0 {
            let _ = sock.set_send_buffer_size(opts.send_buffer);
        }
        if opts.recv_buffer > 0 {
            let _ = sock.set_recv_buffer_size(opts.recv_buffer);
        }
        match gw.admit_peer(remote.ip()) {
            Ok(a) => {
                let slot = Slot::new(a);
                let c = Conn {
                    b: b.clone(),
                    remote,
                    router: router.clone(),
                    slot,
                    listener: Listener::Client,
                    stop: stop.clone(),
                };
                conns.spawn(serve_socket(tls.clone(), tcp, c));
            }
            Err(r) => {
                gw.metrics.connection_refused(r.label());
                refuse_bounded(tcp, r.message(), &lingering);
            }
        }
    }
    if let Some(w) = watcher {
        w.abort();
    }
    wind_down(listener, conns).await;
}

/// The admin listener: at most `http.admin_max_connections` sockets at once (more are
/// answered 503 and closed), each served with the header timeout (over TLS when `tls`
/// is set), until `stop`.
pub async fn serve_admin(
    listener: TcpListener,
    router: Router,
    http: Http,
    tls: Option<Arc<TlsListener>>,
    mut stop: Stop,
) {
    let b = builder(&http);
    let watcher = watch(&tls);
    let open = Arc::new(AtomicUsize::new(0));
    let lingering = Arc::new(AtomicUsize::new(0));
    let max = http.admin_max_connections as usize;
    let mut conns = JoinSet::new();
    while let Some((tcp, remote)) =
        next_socket(&listener, Listener::Admin, &mut conns, &mut stop).await
    {
        if open.fetch_add(1, Ordering::Relaxed) >= max {
            open.fetch_sub(1, Ordering::Relaxed);
            rejected(Listener::Admin, "admin_full");
            refuse_bounded(tcp, "too many admin connections", &lingering);
            continue;
        }
        let c = Conn {
            b: b.clone(),
            remote,
            router: router.clone(),
            slot: Slot::default(),
            listener: Listener::Admin,
            stop: stop.clone(),
        };
        let (tls, open) = (tls.clone(), open.clone());
        conns.spawn(async move {
            serve_socket(tls, tcp, c).await;
            open.fetch_sub(1, Ordering::Relaxed);
        });
    }
    if let Some(w) = watcher {
        w.abort();
    }
    wind_down(listener, conns).await;
}
