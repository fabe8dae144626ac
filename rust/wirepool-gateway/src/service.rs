//! The gateway as a `tower::Service`, for tower stacks, axum routers and hyper servers of one's own.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};

use crate::{Gateway, ResponseBody};

/// [`Gateway::handle`] as a `tower::Service` (the `tower_service::Service` trait that tower
/// re-exports): never an error (every failure is a response with its status), and always
/// ready, since admission is inside: past `max_pending`, the answer is 503 with `Retry-After`,
/// never a queue in front of the service.
///
/// ```
/// use hyper_util::rt::{TokioExecutor, TokioIo};
/// use hyper_util::server::conn::auto;
/// use hyper_util::service::TowerToHyperService;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use wirepool::{Pool, WorkerCommand};
/// use wirepool_gateway::Gateway;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let worker = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug/examples/gw_test_worker");
/// # assert!(std::path::Path::new(worker).exists(), "run through cargo test: {worker} missing");
/// let pool = Pool::builder(WorkerCommand::new(worker)).workers(1).start().await?;
/// let gateway = Gateway::builder(pool.clone()).build()?;
/// // Any tower stack can wrap `gateway` here (tower::ServiceBuilder, axum's fallback_service).
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// let server = tokio::spawn(async move {
///     let (stream, _) = listener.accept().await?;
///     let service = TowerToHyperService::new(gateway);
///     auto::Builder::new(TokioExecutor::new())
///         .serve_connection(TokioIo::new(stream), service)
///         .await
///         .map_err(|e| std::io::Error::other(e.to_string()))
/// });
/// let mut conn = tokio::net::TcpStream::connect(addr).await?;
/// conn.write_all(b"POST /v1/call/echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
///                  content-length: 2\r\n\r\n{}").await?;
/// let mut reply = String::new();
/// conn.read_to_string(&mut reply).await?;
/// assert!(reply.starts_with("HTTP/1.1 200 OK") && reply.ends_with("\r\n\r\n{}"));
/// server.await??;
/// pool.shutdown().await;
/// # Ok(()) }
/// ```
impl<B> tower_service::Service<Request<B>> for Gateway
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let gateway = self.clone();
        Box::pin(async move { Ok(gateway.handle(req).await) })
    }
}
