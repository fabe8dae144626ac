//! The gateway tests' helpers: a pool of test workers behind a gateway on a free port, an
//! HTTP/1.1 or h2c client, raw sockets, and time bounds.

#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use wirepool::{MethodKind, Pool, WorkerCommand};
use wirepool_gateway::{Gateway, GatewayBuilder};

/// The `gw_test_worker` example, which cargo builds beside the test binaries.
pub fn worker() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target/<profile>");
    let path = dir.join("examples").join("gw_test_worker");
    assert!(
        path.exists(),
        "{} missing: run through cargo test",
        path.display()
    );
    path
}

pub async fn pool(workers: usize) -> Pool {
    Pool::builder(WorkerCommand::new(worker()))
        .workers(workers)
        .startup_timeout(Duration::from_secs(10))
        .require_method("echo", MethodKind::Unary)
        .require_method("count", MethodKind::Stream)
        .start()
        .await
        .expect("pool starts")
}

/// A running gateway: its address, the pool, and the way to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub pool: Pool,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<()>>,
}

impl Running {
    /// Starts the shutdown and waits for `serve` to return (the drain included).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            served.await.expect("serve task");
        }
        self.pool.shutdown().await;
    }

    /// Sends the shutdown signal only.
    pub fn begin_stop(&mut self) -> JoinHandle<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.served.take().expect("serving")
    }
}

pub async fn start(
    workers: usize,
    configure: impl FnOnce(GatewayBuilder) -> GatewayBuilder,
) -> Running {
    let pool = pool(workers).await;
    let gateway = configure(Gateway::builder(pool.clone()))
        .build()
        .expect("gateway options");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        gateway
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await
            .expect("serve");
    });
    Running {
        addr,
        pool,
        stop: Some(stop),
        served: Some(served),
    }
}

pub async fn bounded<F: Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test exceeded its time bound")
}

/// One HTTP/1.1 connection.
pub async fn h1(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// One h2c (prior knowledge) connection.
pub async fn h2(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

pub fn request(
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> http::Request<Full<Bytes>> {
    let mut b = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "test");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body.into())).unwrap()
}

/// Sends one request on a new HTTP/1.1 connection; status, headers and the whole body.
pub async fn send(
    addr: SocketAddr,
    req: http::Request<Full<Bytes>>,
) -> (u16, http::HeaderMap, Bytes) {
    let mut c = h1(addr).await;
    let resp = c.send_request(req).await.unwrap();
    read(resp).await
}

pub async fn read(resp: http::Response<Incoming>) -> (u16, http::HeaderMap, Bytes) {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, body)
}

pub fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(body)))
}

/// Polls `f` every 10 ms until it holds (the event itself, with a bound on the wait).
pub async fn until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(tokio::time::Instant::now() < end, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Requests in flight on the pool's workers.
pub fn in_flight(pool: &Pool) -> u64 {
    pool.metrics().workers.iter().map(|w| w.in_flight).sum()
}

/// The worker's count of requests it saw cancelled.
pub async fn worker_cancels(pool: &Pool) -> u64 {
    pool.call("cancels", &()).await.expect("cancels")
}

/// How many `sleep` handlers the worker has started.
pub async fn worker_sleeps(pool: &Pool) -> u64 {
    pool.call("sleeps", &()).await.expect("sleeps")
}

/// The gateway binary, started with `args` (stderr piped, killed on drop), and the address it
/// printed once listening, with its scheme (`http` or `https`).
pub async fn spawn_binary(args: &[&str]) -> (tokio::process::Child, String, SocketAddr) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wirepool-gateway"))
        .args(args)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("the gateway printed its address");
        if let Some(rest) = line.strip_prefix("wirepool-gateway: listening on ") {
            let (scheme, addr) = rest.split_once("://").expect("scheme://addr");
            return (child, scheme.to_string(), addr.parse().unwrap());
        }
    }
}

/// SIGTERM to `child`, then its exit status.
pub async fn terminate(mut child: tokio::process::Child) -> std::process::ExitStatus {
    let pid = child.id().expect("running") as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    child.wait().await.unwrap()
}

/// A directory of its own under the temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("wirepool-gw-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
