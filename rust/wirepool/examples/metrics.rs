//! Pool metrics served for Prometheus over HTTP:
//! `cargo run -p wirepool --example metrics -- [--port 9464] [--calls 100] [--scrapes N]`.
//!
//! Makes `--calls` calls and one stream, prints the address to scrape, then answers
//! `GET /metrics` until stopped (Ctrl-C), or after `--scrapes` answers.
//! `curl -s localhost:9464/metrics | grep wirepool_` shows the series.
//!
//! Any HTTP server will do (axum, hyper, actix...): the handler is
//! `pool.metrics().to_prometheus("name")` with `wirepool::prometheus::CONTENT_TYPE`. This one is a
//! few lines of tokio so the example needs no web framework.

mod shared;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wirepool::{MethodKind, Pool};

fn main() -> wirepool::Result<()> {
    shared::serve_if_worker(); // before any runtime exists: the worker SDK starts its own
    run()
}

struct Args {
    port: u16,
    calls: u64,
    scrapes: Option<u64>,
}

fn args() -> Args {
    let mut a = Args {
        port: 9464,
        calls: 100,
        scrapes: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().and_then(|v| v.parse::<u64>().ok());
        match (flag.as_str(), value) {
            ("--port", Some(v)) if v <= u64::from(u16::MAX) => a.port = v as u16,
            ("--calls", Some(v)) => a.calls = v,
            ("--scrapes", Some(v)) => a.scrapes = Some(v),
            _ => {
                eprintln!("usage: metrics [--port N (0: any)] [--calls N] [--scrapes N]");
                std::process::exit(2);
            }
        }
    }
    a
}

#[tokio::main(flavor = "current_thread")]
async fn run() -> wirepool::Result<()> {
    let args = args();
    let pool = Pool::builder(shared::this_binary())
        .workers(2)
        .require_method("add", MethodKind::Unary)
        .require_method("decls", MethodKind::Stream)
        .start()
        .await?;
    for i in 0..args.calls as i64 {
        let _: i64 = pool.call("add", &(i, 1)).await?;
    }
    let mut rows = pool.stream::<_, shared::Decl>("decls", &1000u64).await?;
    let mut n = 0;
    while let Some(row) = rows.next().await {
        row?;
        n += 1;
    }

    let listener = TcpListener::bind(("127.0.0.1", args.port))
        .await
        .expect("bind the metrics port");
    let addr = listener.local_addr().expect("bound address");
    println!(
        "{} calls and a stream of {n} rows done; metrics at http://{addr}/metrics",
        args.calls
    );
    let mut served = 0;
    loop {
        if args.scrapes.is_some_and(|max| served >= max) {
            break;
        }
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        if answer(conn, &pool).await.is_ok() {
            served += 1;
        }
    }
    pool.shutdown().await;
    println!("stopped");
    Ok(())
}

/// One HTTP/1.1 exchange: the metrics for `GET /metrics`, 404 otherwise; then close.
async fn answer(mut conn: TcpStream, pool: &Pool) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await?;
        if n == 0 || head.len() > 16 << 10 {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (status, content_type, body) = if head.starts_with(b"GET /metrics ") {
        let body = pool.metrics().to_prometheus("example");
        ("200 OK", wirepool::prometheus::CONTENT_TYPE, body)
    } else {
        ("404 Not Found", "text/plain", "try /metrics\n".to_string())
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(reply.as_bytes()).await?;
    conn.shutdown().await
}
