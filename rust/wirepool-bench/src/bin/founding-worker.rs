//! The Rust worker of the founding workload: `rows` (json, msgpack, cbor) streams rows `0..n`
//! of `{"shape", "n"}` one at a time (`RowSink::send_ref`), each refilled in place by the shape's
//! generator. Started by a wirepool parent (it needs `WIREPOOL_FD`).

use serde::Serialize;
use wirepool_bench::founding::{FoundingRow, LargeRow, RowsReq, SmallRow};
use wirepool_worker::{Codec, Context, HandlerError, RowSink, Worker};

/// Either shape, serialized as the row itself.
#[derive(Serialize)]
#[serde(untagged)]
enum Row {
    Small(SmallRow),
    Large(LargeRow),
}

async fn send_all<R: FoundingRow>(
    n: u64,
    sink: &RowSink<Row>,
    wrap: fn(R) -> Row,
    unwrap: fn(&mut Row) -> &mut R,
) -> Result<(), HandlerError> {
    let gen = R::gen();
    let mut row = wrap(R::default());
    for i in 0..n {
        unwrap(&mut row).fill(&gen, i);
        sink.send_ref(&row).await?;
    }
    Ok(())
}

async fn rows(req: RowsReq, sink: RowSink<Row>) -> Result<(), HandlerError> {
    match req.shape.as_str() {
        SmallRow::SHAPE => {
            send_all::<SmallRow>(req.n, &sink, Row::Small, |r| match r {
                Row::Small(s) => s,
                Row::Large(_) => unreachable!("a small row"),
            })
            .await
        }
        LargeRow::SHAPE => {
            send_all::<LargeRow>(req.n, &sink, Row::Large, |r| match r {
                Row::Large(l) => l,
                Row::Small(_) => unreachable!("a large row"),
            })
            .await
        }
        other => Err(HandlerError::new(format!("unknown shape {other:?}"))),
    }
}

fn main() -> std::io::Result<()> {
    Worker::new("founding-worker")
        .stream("rows", |req: RowsReq, _ctx: Context, sink: RowSink<Row>| {
            rows(req, sink)
        })
        .codecs(&[Codec::Json, Codec::MsgPack, Codec::Cbor])
        .max_concurrency(16)
        .run()
}
