//! One `tracing` span per call (target `wirepool::call`) with the request id and the worker's
//! pid, recorded by a subscriber as a user would install one.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::fmt::MakeWriter;

/// A writer into a shared buffer, so the test reads what the subscriber printed.
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

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[test]
fn one_span_per_call_with_request_id_and_worker_pid() {
    let out = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_env_filter("wirepool::call=debug")
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .finish();
    // The subscriber is this thread's; a current-thread runtime keeps every task on it.
    let pid = tracing::subscriber::with_default(subscriber, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(common::bounded(60, async {
            let pool = common::builder(1).start().await.unwrap();
            for i in 0..3i64 {
                assert_eq!(pool.call::<_, i64>("add", &(i, 1)).await.unwrap(), i + 1);
            }
            let err = pool.call::<_, ()>("panic", &()).await.unwrap_err();
            assert_eq!(err.code(), wirepool::codes::HANDLER_PANIC);
            let mut rows = pool
                .stream::<_, serde_json::Value>("decls", &5u64)
                .await
                .unwrap();
            while let Some(row) = rows.next().await {
                row.unwrap();
            }
            let pid = pool.worker_pids()[0];
            pool.shutdown().await;
            pid
        }))
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let closed: Vec<&str> = text.lines().filter(|l| l.contains(" close ")).collect();
    assert_eq!(closed.len(), 5, "{text}");
    let adds: Vec<&&str> = closed
        .iter()
        .filter(|l| l.contains("method=\"add\""))
        .collect();
    assert_eq!(adds.len(), 3, "{text}");
    let mut ids = Vec::new();
    for line in &closed {
        assert!(line.contains(&format!("worker_pid={pid}")), "{line}");
        let id = line
            .split("request_id=")
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .unwrap_or_else(|| panic!("no request_id in {line}"));
        ids.push(id.parse::<u64>().unwrap());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5, "one request id per call: {text}");
    assert!(
        closed
            .iter()
            .any(|l| l.contains("method=\"panic\"") && l.contains("error_code=204")),
        "{text}"
    );
    assert!(
        closed
            .iter()
            .any(|l| l.contains("method=\"decls\"") && l.contains("kind=\"stream\"")),
        "{text}"
    );
}
