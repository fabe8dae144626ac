//! A `max_in_flight` above what a worker's HELLO offers is clamped to the offer and said once
//! per pool (PROTOCOL.md 4.2), not at every worker start.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn clamp_lines(log: &Captured) -> usize {
    let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    text.lines()
        .filter(|l| l.contains("max_in_flight 5000 is above the worker's max_concurrency 1024"))
        .count()
}

// One thread: the subscriber set for this thread sees the pool's start-up and restarts.
#[tokio::test(flavor = "current_thread")]
async fn a_clamped_max_in_flight_is_logged_once_per_pool() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    bounded(60, async {
        // The test worker offers max_concurrency 1024.
        let pool = builder(2).max_in_flight(5000).start().await.unwrap();
        let e = pool.call::<_, ()>("crash", &3i32).await.unwrap_err();
        assert_eq!(e.code(), wirepool::codes::WORKER_EXITED, "{e}");
        // The replacement starts (clamped again) before another call is served by both.
        while pool
            .metrics()
            .workers
            .iter()
            .filter(|w| w.pid.is_some())
            .count()
            < 2
            || pool
                .metrics()
                .workers
                .iter()
                .map(|w| w.restarts)
                .sum::<u64>()
                < 1
        {
            tokio::task::yield_now().await;
        }
        let _: u32 = pool.call("pid", &()).await.unwrap();
        assert_eq!(clamp_lines(&log), 1, "three starts, one line");
        pool.shutdown().await;
        // Within the offer: nothing to say.
        let pool = builder(1).max_in_flight(1024).start().await.unwrap();
        assert_eq!(clamp_lines(&log), 1);
        pool.shutdown().await;
    })
    .await
}
