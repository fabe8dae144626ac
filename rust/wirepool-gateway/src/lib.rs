//! An HTTP gateway in front of a wirepool [`Pool`]: `POST /v1/call/{method}` in the codec named
//! by `Content-Type`, `POST /v1/stream/{method}` as NDJSON or Server-Sent Events pulled at the
//! client's pace (credit flow control to the worker), deadlines from the `wirepool-timeout`
//! header, cancellation on client disconnect, load shedding with `503` and `Retry-After`,
//! header and body limits, HTTP/1.1 keep-alive and h2c, graceful shutdown.
//!
//! ```
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use wirepool::{MethodKind, Pool, WorkerCommand};
//! use wirepool_gateway::Gateway;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // The tests' worker, which `cargo test -p wirepool-gateway` builds before the doc tests.
//! # let worker = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug/examples/gw_test_worker");
//! # assert!(std::path::Path::new(worker).exists(), "run through cargo test: {worker} missing");
//! let pool = Pool::builder(WorkerCommand::new(worker)) // e.g. WorkerCommand::new("python").arg("worker.py")
//!     .workers(2)
//!     .require_method("echo", MethodKind::Unary) // checked against the workers' HELLO
//!     .start()
//!     .await?;
//! let gateway = Gateway::builder(pool.clone())
//!     .max_pending(2 * 64 + 128)         // in flight + queued; beyond: 503
//!     .build()?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! // A server would pass wirepool_gateway::shutdown_signal() (SIGTERM or ctrl-c).
//! let server = tokio::spawn(async move {
//!     gateway.serve(listener, async { let _ = stopped.await; }).await
//! });
//!
//! let mut conn = tokio::net::TcpStream::connect(addr).await?;
//! conn.write_all(b"POST /v1/call/echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
//!                  content-type: application/json\r\ncontent-length: 7\r\n\r\n[1,2,3]").await?;
//! let mut reply = String::new();
//! conn.read_to_string(&mut reply).await?;
//! assert!(reply.starts_with("HTTP/1.1 200 OK") && reply.ends_with("\r\n\r\n[1,2,3]"));
//!
//! let _ = stop.send(());
//! server.await??; // the in-flight requests drained
//! pool.shutdown().await;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod routes;
mod serve;
mod service;
mod stats;
mod status;
mod stream_body;
mod timeout;
mod tls;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use wirepool::Pool;

pub use routes::ResponseBody;
pub use serve::shutdown_signal;
pub use status::{name_of_code, status_of_code, CLIENT_CLOSED_REQUEST, MAX_MESSAGE_BYTES};
pub use timeout::parse_timeout;
pub use tls::TlsConfig;

/// The request header that carries a call's deadline (see [`parse_timeout`]).
pub const TIMEOUT_HEADER: &str = "wirepool-timeout";

/// Errors of building or running a gateway.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// A builder option out of its range.
    #[error("invalid gateway option: {0}")]
    InvalidArgument(String),
    /// The listener failed.
    #[error("gateway I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// The limits of a gateway (see [`GatewayBuilder`] for each default).
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub max_body_bytes: usize,
    pub max_header_bytes: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_grace: Duration,
    pub retry_after_secs: u32,
}

/// Limits of one method's requests, calls and streams alike ([`GatewayBuilder::route`]).
///
/// ```
/// use std::time::Duration;
/// use wirepool_gateway::RouteLimits;
/// let small = RouteLimits::new().max_body_bytes(4096).timeout(Duration::from_millis(250));
/// assert_eq!(small.get_max_body_bytes(), Some(4096));
/// assert_eq!(small.get_timeout(), Some(Duration::from_millis(250)));
/// assert_eq!(RouteLimits::new().get_timeout(), None); // the gateway's own limits apply
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteLimits {
    max_body_bytes: Option<usize>,
    timeout: Option<Duration>,
}

impl RouteLimits {
    /// No limit of its own: the gateway's apply.
    pub fn new() -> Self {
        Self::default()
    }
    /// Largest request body of this method, instead of the gateway's `max_body_bytes`
    /// (smaller or larger): beyond it, 413 `BODY_TOO_LARGE`.
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.max_body_bytes = Some(n);
        self
    }
    /// The deadline of a request of this method that has no `wirepool-timeout` header (a
    /// header still sets its own).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
    /// The body limit set by [`max_body_bytes`](Self::max_body_bytes).
    pub fn get_max_body_bytes(&self) -> Option<usize> {
        self.max_body_bytes
    }
    /// The default deadline set by [`timeout`](Self::timeout).
    pub fn get_timeout(&self) -> Option<Duration> {
        self.timeout
    }
}

pub(crate) struct Inner {
    pub pool: Pool,
    pub limits: Limits,
    /// Per-method limits, fixed at build time.
    pub routes: HashMap<String, RouteLimits>,
    pub tls: Option<TlsConfig>,
    /// Requests admitted (in flight on the pool or queued for a worker); beyond it, 503.
    pub admission: Arc<Semaphore>,
    pub max_pending: usize,
    pub stats: stats::Stats,
}

/// An HTTP front for a [`Pool`]; cheap to clone (shared state).
#[derive(Clone)]
pub struct Gateway {
    pub(crate) inner: Arc<Inner>,
}

/// Options of a [`Gateway`]; [`build`](GatewayBuilder::build) checks them.
pub struct GatewayBuilder {
    pool: Pool,
    limits: Limits,
    max_pending: usize,
    routes: HashMap<String, RouteLimits>,
    tls: Option<TlsConfig>,
}

impl Gateway {
    /// A builder for a gateway in front of `pool`.
    pub fn builder(pool: Pool) -> GatewayBuilder {
        GatewayBuilder {
            pool,
            limits: Limits {
                max_body_bytes: 1 << 20,
                max_header_bytes: 16 << 10,
                header_timeout: Duration::from_secs(10),
                body_timeout: Duration::from_secs(30),
                max_connections: 1024,
                shutdown_grace: Duration::from_secs(10),
                retry_after_secs: 1,
            },
            max_pending: 256,
            routes: HashMap::new(),
            tls: None,
        }
    }

    /// The pool behind the gateway.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Whether [`serve`](Gateway::serve) speaks TLS ([`GatewayBuilder::tls`]).
    pub fn is_tls(&self) -> bool {
        self.inner.tls.is_some()
    }
}

impl GatewayBuilder {
    /// Largest request body in bytes (default 1 MiB): a larger `Content-Length` is refused with
    /// 413 before the body is read, and a body that grows past it while read, too.
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.limits.max_body_bytes = n;
        self
    }
    /// Largest request head (request line and headers) in bytes (default 16 KiB; at least
    /// 8,192, hyper's minimum read buffer): larger gets 431.
    pub fn max_header_bytes(mut self, n: usize) -> Self {
        self.limits.max_header_bytes = n;
        self
    }
    /// Time a client has to send a whole request head (default 10 s); a slower one (slowloris)
    /// is disconnected.
    pub fn header_timeout(mut self, d: Duration) -> Self {
        self.limits.header_timeout = d;
        self
    }
    /// Time a client has to send a whole request body once its head is in (default 30 s):
    /// slower gets 408 (a trickled body cannot hold a place in `max_pending` for ever).
    pub fn body_timeout(mut self, d: Duration) -> Self {
        self.limits.body_timeout = d;
        self
    }
    /// Open connections at most (default 1,024): one more is closed at once.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.limits.max_connections = n;
        self
    }
    /// Requests admitted at once, in flight on the workers or queued for one (default 256):
    /// the next gets 503 with `Retry-After`. Set it to `workers * max_in_flight + queue`.
    pub fn max_pending(mut self, n: usize) -> Self {
        self.max_pending = n;
        self
    }
    /// Time in-flight requests have to finish once shutdown starts (default 10 s).
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.limits.shutdown_grace = d;
        self
    }
    /// The `Retry-After` seconds of a shed request (default 1).
    pub fn retry_after_secs(mut self, secs: u32) -> Self {
        self.limits.retry_after_secs = secs;
        self
    }
    /// Limits of its own for `method` (both `/v1/call/` and `/v1/stream/`); set again, the
    /// last one counts.
    pub fn route(mut self, method: impl Into<String>, limits: RouteLimits) -> Self {
        self.routes.insert(method.into(), limits);
        self
    }
    /// Serves HTTPS instead of plain HTTP: ALPN picks `h2` or `http/1.1`; the TLS handshake
    /// counts against the header timeout, and a client that does not speak TLS is closed.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }
    /// The gateway, or `InvalidArgument` for an option out of range.
    pub fn build(self) -> Result<Gateway, GatewayError> {
        let l = &self.limits;
        let bad = |what: &str| Err(GatewayError::InvalidArgument(what.to_string()));
        if l.max_body_bytes == 0 {
            return bad("max_body_bytes must be at least 1");
        }
        if l.max_header_bytes < 8192 {
            return bad("max_header_bytes must be at least 8192");
        }
        if l.header_timeout.is_zero() || l.body_timeout.is_zero() {
            return bad("header_timeout and body_timeout must be positive");
        }
        if l.max_connections == 0 || self.max_pending == 0 {
            return bad("max_connections and max_pending must be at least 1");
        }
        if self.max_pending > Semaphore::MAX_PERMITS {
            return bad("max_pending is too large");
        }
        for (name, r) in &self.routes {
            if routes::method_name(name).is_err() {
                return Err(GatewayError::InvalidArgument(format!(
                    "route {:?}: not a method name (1 to 256 letters, digits, _ . - :)",
                    status::cut(name)
                )));
            }
            let max_timeout =
                Duration::from_millis(wirepool_proto::constants::MAX_TIMEOUT_MS.into());
            let bad_timeout = r.timeout.is_some_and(|d| d.is_zero() || d > max_timeout);
            if r.max_body_bytes == Some(0) || bad_timeout {
                return Err(GatewayError::InvalidArgument(format!(
                    "route {name}: max_body_bytes must be positive, timeout from 1 ms to \
                     {max_timeout:?}"
                )));
            }
        }
        Ok(Gateway {
            inner: Arc::new(Inner {
                pool: self.pool,
                limits: self.limits,
                admission: Arc::new(Semaphore::new(self.max_pending)),
                max_pending: self.max_pending,
                routes: self.routes,
                tls: self.tls,
                stats: stats::Stats::default(),
            }),
        })
    }
}
