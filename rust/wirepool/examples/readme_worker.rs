// A worker binary: the top README prints this file whole (tests/readme.rs keeps them equal).
use serde::{Deserialize, Serialize};
use wirepool_worker::{Context, HandlerError, RowSink, Worker};

#[derive(Deserialize)]
struct AddReq {
    a: i64,
    b: i64,
}

#[derive(Serialize)]
struct AddResp {
    sum: i64,
}

#[derive(Deserialize)]
struct Req {
    n: u64,
}

#[derive(Serialize)]
struct Decl {
    i: u64,
    name: String,
    kind: &'static str,
}

fn add(req: AddReq, _ctx: &Context) -> Result<AddResp, HandlerError> {
    Ok(AddResp { sum: req.a + req.b })
}

async fn decls(req: Req, ctx: Context, rows: RowSink<Decl>) -> Result<(), HandlerError> {
    for i in 0..req.n {
        if ctx.is_cancelled() {
            break; // the parent cancelled, or the deadline passed
        }
        let decl = Decl {
            i,
            name: format!("decl_{i}"),
            kind: "theorem",
        };
        rows.send(decl).await?; // waits while the parent has granted no credit
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    Worker::new("demo")
        .unary("add", add) // a blocking handler, run on a handler thread
        .stream("decls", decls) // rows go out in batches, as the parent grants credit
        .run() // serves the socket its parent passed in WIREPOOL_FD, until DRAIN or EOF
}
