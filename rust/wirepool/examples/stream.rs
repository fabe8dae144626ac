//! A stream of typed rows with its summary: `cargo run -p wirepool --example stream`.

mod shared;

use shared::Decl;
use wirepool::{MethodKind, Pool};

fn main() -> wirepool::Result<()> {
    shared::serve_if_worker(); // before any runtime exists: the worker SDK starts its own
    run()
}

#[tokio::main(flavor = "current_thread")]
async fn run() -> wirepool::Result<()> {
    let pool = Pool::builder(shared::this_binary())
        .workers(1)
        .require_method("decls", MethodKind::Stream)
        .stream_window(256 * 1024) // at most ~256 KiB of rows wait unread, however slow we are
        .start()
        .await?;

    let mut rows = pool.stream::<_, Decl>("decls", &100_000u64).await?;
    let mut last = None;
    while let Some(row) = rows.next().await {
        last = Some(row?);
    }
    let summary: Option<u64> = rows.summary()?;
    println!(
        "read {} rows, last {:?}, summary {:?}",
        rows.rows_read(),
        last,
        summary
    );
    pool.shutdown().await;
    Ok(())
}
