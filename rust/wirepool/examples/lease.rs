//! A lease: one worker kept for a sequence of calls that share its state, while the rest of
//! the pool serves others: `cargo run -p wirepool --example lease`.

mod shared;

use wirepool::Pool;

fn main() -> wirepool::Result<()> {
    shared::serve_if_worker(); // before any runtime exists: the worker SDK starts its own
    run()
}

#[tokio::main(flavor = "current_thread")]
async fn run() -> wirepool::Result<()> {
    let pool = Pool::builder(shared::this_binary())
        .workers(2)
        .start()
        .await?;

    let lease = pool.lease().await?;
    for item in ["parse", "elaborate", "check"] {
        let n: usize = lease.call("remember", &item).await?;
        println!("worker {} remembers {n} item(s)", lease.pid());
    }
    let all: Vec<String> = lease.call("recall", &()).await?;
    println!("same worker, same state: {all:?}");

    // Meanwhile the pool keeps serving, on the worker that is not leased.
    let other: u32 = pool.call("pid", &()).await?;
    println!(
        "pool call served by worker {other} (leased: {})",
        lease.pid()
    );
    drop(lease); // the worker goes back to the pool
    pool.shutdown().await;
    Ok(())
}
