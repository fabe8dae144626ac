//! The accept loop: HTTP/1.1 and h2c connections, limits, graceful shutdown.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::{Gateway, GatewayError};

/// A connection, plain or TLS (one type for hyper's connection builder).
enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Resolves on SIGTERM or ctrl-c (SIGINT): the usual `shutdown` argument of
/// [`Gateway::serve`].
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

impl Gateway {
    /// Serves `listener` until `shutdown` resolves, then stops accepting and gives the requests
    /// in flight the shutdown grace to finish (connections still open after it are dropped,
    /// which cancels their requests on the workers). The pool is not shut down.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), GatewayError> {
        let limits = self.inner.limits.clone();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(limits.max_header_bytes)
            .keep_alive(true);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(limits.max_header_bytes as u32)
            .max_concurrent_streams(256);
        let builder = Arc::new(builder);
        let acceptor = self
            .inner
            .tls
            .as_ref()
            .map(|t| TlsAcceptor::from(t.server.clone()));
        let connections = Arc::new(Semaphore::new(limits.max_connections));
        let graceful = GracefulShutdown::new();
        // Past the grace, connections still open are dropped (their requests cancelled).
        let (kill, killed) = tokio::sync::watch::channel(false);
        tokio::pin!(shutdown);
        loop {
            let (stream, _peer) = tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    // Out of descriptors and the like: the next accept may succeed.
                    Err(e) => {
                        tracing::warn!(target: "wirepool::gateway", "accept failed: {e}");
                        tokio::task::yield_now().await;
                        continue;
                    }
                },
            };
            let Ok(permit) = connections.clone().try_acquire_owned() else {
                self.inner.stats.connections_refused.fetch_add(1, Relaxed);
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let gateway = self.clone();
            let builder = builder.clone();
            let watcher = graceful.watcher();
            let mut killed = killed.clone();
            let header_timeout = limits.header_timeout;
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // The auto builder reads the first bytes to tell HTTP/1 from h2c before hyper's
                // header timer runs: a connection silent from the start is closed here (the
                // TLS handshake counts against the same timer).
                let first_request = Arc::new(AtomicBool::new(false));
                let seen = first_request.clone();
                let service = service_fn(move |req| {
                    seen.store(true, Relaxed);
                    let gateway = gateway.clone();
                    async move { Ok::<_, std::convert::Infallible>(gateway.handle(req).await) }
                });
                let silent = async {
                    tokio::time::sleep(header_timeout).await;
                    if first_request.load(Relaxed) {
                        std::future::pending::<()>().await;
                    }
                };
                let work = async move {
                    let io = match acceptor {
                        None => Conn::Plain(stream),
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(tls) => Conn::Tls(Box::new(tls)),
                            // Not TLS, or a handshake that failed: closed.
                            Err(_) => return,
                        },
                    };
                    let conn = builder.serve_connection(TokioIo::new(io), service);
                    let _ = watcher.watch(conn).await;
                };
                tokio::select! {
                    () = work => {}
                    _ = killed.wait_for(|k| *k) => {}
                    () = silent => {}
                }
                drop(permit);
            });
        }
        drop(listener);
        if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
            .await
            .is_err()
        {
            let _ = kill.send(true);
        }
        Ok(())
    }
}
