//! A worker that crashes on purpose: `cargo run -p wirepool --example crash`.
//! The call fails with one typed error carrying the exit status and the worker's last stderr
//! lines; the pool replaces the worker and keeps serving.

mod shared;

use std::time::Duration;

use wirepool::Pool;

fn main() -> wirepool::Result<()> {
    shared::serve_if_worker(); // before any runtime exists: the worker SDK starts its own
    run()
}

#[tokio::main(flavor = "current_thread")]
async fn run() -> wirepool::Result<()> {
    let pool = Pool::builder(shared::this_binary())
        .workers(1)
        .start()
        .await?;
    let before: u32 = pool.call("pid", &()).await?;

    let err = pool.call::<_, ()>("crash", &()).await.unwrap_err();
    let exit = err.exit_info().expect("a worker death carries its exit");
    println!("error {}: {err}", err.code());
    println!(
        "  exit status {:?}, signal {:?}, stderr tail {:?}",
        exit.code, exit.signal, exit.stderr_tail
    );

    pool.wait_ready(Duration::from_secs(5)).await;
    let after: u32 = pool.call("pid", &()).await?;
    let m = pool.metrics();
    println!(
        "worker {before} replaced by {after}; restarts by cause: {:?}",
        m.workers[0].restart_causes
    );
    pool.shutdown().await;
    Ok(())
}
