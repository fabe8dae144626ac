//! Cancellation and deadlines: `cargo run -p wirepool --example cancel`.
//! Dropping a call sends CANCEL (the handler sees it and stops); a timeout travels on the wire.

mod shared;

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use wirepool::{CallOptions, Pool};

fn main() -> wirepool::Result<()> {
    shared::serve_if_worker(); // before any runtime exists: the worker SDK starts its own
    run()
}

#[tokio::main(flavor = "current_thread")]
async fn run() -> wirepool::Result<()> {
    // The log shows the worker's stderr lines; it goes to stderr, coloured only on a terminal
    // (a pipe or a file gets plain text, not escape codes).
    tracing_subscriber::fmt()
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let pool = Pool::builder(shared::this_binary())
        .workers(1)
        .max_in_flight(1)
        .start()
        .await?;

    // Drop a call after 100 ms: the worker stops the handler (see its stderr line in the log).
    let started = Instant::now();
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        pool.call::<_, u64>("sleep_ms", &60_000u64),
    )
    .await;
    println!(
        "gave up after {:?}: {}",
        started.elapsed(),
        if dropped.is_err() {
            "cancelled"
        } else {
            "finished?"
        }
    );

    // With one slot on one worker, this call runs only once the cancelled one has ended.
    let sum: i64 = pool.call("add", &(1, 1)).await?;
    println!("next call fine: {sum} after {:?}", started.elapsed());

    // A deadline: the worker counts it from receipt and ends the request itself.
    let err = pool
        .call_with::<_, u64>(
            "sleep_ms",
            &60_000u64,
            CallOptions::timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    println!("with a 200 ms budget: error {} ({err})", err.code());
    pool.shutdown().await;
    Ok(())
}
