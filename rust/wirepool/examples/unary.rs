//! Typed unary calls spread over a pool: `cargo run -p wirepool --example unary`.

mod shared;

use std::time::Duration;

use wirepool::{CallOptions, Codec, MethodKind, Pool};

fn main() -> wirepool::Result<()> {
    shared::serve_if_worker(); // before any runtime exists: the worker SDK starts its own
    run()
}

#[tokio::main(flavor = "current_thread")]
async fn run() -> wirepool::Result<()> {
    let pool = Pool::builder(shared::this_binary())
        .workers(2)
        .require_method("add", MethodKind::Unary) // checked at start-up, not at the first call
        .start()
        .await?;

    let sum: i64 = pool.call("add", &(2, 40)).await?;
    println!("add(2, 40) = {sum}");

    // Per call: MessagePack instead of the pool's JSON, and a budget that travels to the worker.
    let opts = CallOptions::codec(Codec::MsgPack).with_timeout(Duration::from_secs(5));
    let sum: i64 = pool.call_with("add", &(2, 40), opts).await?;
    println!("add(2, 40) over MessagePack = {sum}");

    // Many calls in flight at once share each worker's socket writes.
    let calls = (0..1000i64).map(|i| {
        let pool = pool.clone();
        tokio::spawn(async move { pool.call::<_, i64>("add", &(i, i)).await })
    });
    let mut total = 0;
    for call in calls.collect::<Vec<_>>() {
        total += call.await.expect("task")?;
    }
    println!("sum of 1000 calls = {total}");
    let latency = &pool.metrics().methods["add"];
    println!(
        "add latency: p50 {:?}, p99 {:?} over {} calls",
        latency.p50, latency.p99, latency.count
    );
    pool.shutdown().await;
    Ok(())
}
