// A parent running the worker binary `readme_worker`: the top README prints this file whole
// (tests/readme.rs keeps them equal and runs it).
use serde::{Deserialize, Serialize};
use wirepool::{MethodKind, Pool, WorkerCommand};

#[derive(Serialize)]
struct AddReq {
    a: i64,
    b: i64,
}

#[derive(Deserialize)]
struct AddResp {
    sum: i64,
}

#[derive(Serialize)]
struct Req {
    n: u64,
}

#[derive(Deserialize)]
struct Decl {
    i: u64,
    name: String,
    kind: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The worker binary, built beside this one (`cargo build --example readme_worker`);
    // any executable path will do.
    let worker = std::env::current_exe()?.with_file_name("readme_worker");
    let pool = Pool::builder(WorkerCommand::new(worker))
        .workers(4)
        .require_method("add", MethodKind::Unary) // checked at start-up, not at the first call
        .require_method("decls", MethodKind::Stream)
        .start()
        .await?;

    let resp: AddResp = pool.call("add", &AddReq { a: 2, b: 3 }).await?;
    println!("add: {}", resp.sum);

    let mut rows = pool.stream::<_, Decl>("decls", &Req { n: 100_000 }).await?;
    let mut last = None;
    while let Some(decl) = rows.next().await {
        last = Some(decl?); // credit is granted as rows are read
    }
    if let Some(decl) = last {
        println!("decls: last row {} {} {}", decl.i, decl.name, decl.kind);
    }

    pool.shutdown().await; // drains the workers
    Ok(())
}
