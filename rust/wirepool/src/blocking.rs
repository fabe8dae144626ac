//! A blocking facade for synchronous code: the same pool, driven by a runtime it owns.
//!
//! ```no_run
//! use wirepool::{blocking::BlockingPool, Pool, WorkerCommand};
//!
//! let pool = BlockingPool::start(Pool::builder(WorkerCommand::new("./echo_worker")).workers(2))?;
//! let sum: i64 = pool.call("add", &[2, 3])?;
//! for row in pool.stream::<_, u64>("count", &10u64)? {
//!     let _n = row?;
//! }
//! pool.shutdown();
//! # Ok::<(), wirepool::Error>(())
//! ```

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Result;
use crate::pool::{CallOptions, Lease, Pool, PoolBuilder};
use crate::stream::RowStream;

/// A [`Pool`] for synchronous code. It owns a multi-thread tokio runtime with one worker
/// thread, where the connection tasks run while the caller's thread blocks on results.
pub struct BlockingPool {
    pool: Pool,
    runtime: tokio::runtime::Runtime,
}

impl BlockingPool {
    /// Starts the pool described by `builder`.
    pub fn start(builder: PoolBuilder) -> Result<Self> {
        // One runtime thread: the I/O tasks of all workers share it, and the caller's thread
        // does the decoding of results and rows, so two vCPUs are both busy.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("wirepool-io")
            .enable_all()
            .build()
            .map_err(|e| crate::Error::SpawnFailed {
                program: "tokio runtime".into(),
                source: std::sync::Arc::new(e),
            })?;
        let pool = runtime.block_on(builder.start())?;
        Ok(BlockingPool { pool, runtime })
    }

    /// The async pool inside, for code that mixes both styles.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// See [`Pool::call`].
    pub fn call<Req, Resp>(&self, method: &str, req: &Req) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned + 'static,
    {
        self.runtime.block_on(self.pool.call(method, req))
    }

    /// See [`Pool::call_with`].
    pub fn call_with<Req, Resp>(&self, method: &str, req: &Req, opts: CallOptions) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned + 'static,
    {
        self.runtime
            .block_on(self.pool.call_with(method, req, opts))
    }

    /// See [`Pool::stream`]; the result is a blocking iterator of rows.
    pub fn stream<Req, Row>(&self, method: &str, req: &Req) -> Result<BlockingRows<'_, Row>>
    where
        Req: Serialize + ?Sized,
        Row: DeserializeOwned + 'static,
    {
        let inner = self.runtime.block_on(self.pool.stream(method, req))?;
        let idle_waker = std::task::Waker::from(std::sync::Arc::new(IdleWaker));
        Ok(BlockingRows {
            inner,
            runtime: &self.runtime,
            idle_waker,
        })
    }

    /// See [`Pool::lease`].
    pub fn lease(&self) -> Result<BlockingLease<'_>> {
        let lease = self.runtime.block_on(self.pool.lease())?;
        Ok(BlockingLease {
            lease,
            runtime: &self.runtime,
        })
    }

    /// See [`Pool::metrics`].
    pub fn metrics(&self) -> crate::PoolMetrics {
        self.pool.metrics()
    }

    /// See [`Pool::shutdown`].
    pub fn shutdown(self) {
        self.runtime.block_on(self.pool.shutdown());
    }
}

/// Rows of a stream, read by blocking. Dropping it before the end cancels the stream.
pub struct BlockingRows<'a, Row> {
    inner: RowStream<Row>,
    runtime: &'a tokio::runtime::Runtime,
    /// Rows already received are taken without entering the runtime: polled with a waker that
    /// does nothing, and only a `Pending` falls back to `block_on`.
    idle_waker: std::task::Waker,
}

struct IdleWaker;

impl std::task::Wake for IdleWaker {
    fn wake(self: std::sync::Arc<Self>) {}
}

impl<Row: DeserializeOwned + 'static> BlockingRows<'_, Row> {
    /// The END summary, once the iterator returned `None`.
    pub fn summary<S: DeserializeOwned + 'static>(&self) -> Result<Option<S>> {
        self.inner.summary()
    }
}

impl<Row: DeserializeOwned + 'static> Iterator for BlockingRows<'_, Row> {
    type Item = Result<Row>;
    fn next(&mut self) -> Option<Result<Row>> {
        let mut cx = std::task::Context::from_waker(&self.idle_waker);
        match self.inner.poll_row(&mut cx) {
            std::task::Poll::Ready(row) => row,
            std::task::Poll::Pending => self.runtime.block_on(self.inner.next()),
        }
    }
}

/// A lease, for blocking code.
pub struct BlockingLease<'a> {
    lease: Lease,
    runtime: &'a tokio::runtime::Runtime,
}

impl BlockingLease<'_> {
    /// See [`Lease::call`].
    pub fn call<Req, Resp>(&self, method: &str, req: &Req) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned + 'static,
    {
        self.runtime.block_on(self.lease.call(method, req))
    }
}
