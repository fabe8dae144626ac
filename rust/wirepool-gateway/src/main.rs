//! `wirepool-gateway --listen 127.0.0.1:8080 --workers 4 -- python worker.py`

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use wirepool::{MethodKind, Pool, WorkerCommand};
use wirepool_gateway::{parse_timeout, Gateway};

/// An HTTP gateway in front of a pool of wirepool workers.
#[derive(Parser, Debug)]
#[command(name = "wirepool-gateway", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Requests in flight per worker.
    #[arg(long, default_value_t = 64)]
    max_in_flight: u32,
    /// Requests queued for a worker beyond those in flight; past it, 503.
    #[arg(long, default_value_t = 128)]
    queue: usize,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Time to send a request head (e.g. 10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = duration)]
    header_timeout: Duration,
    /// Time in-flight requests get to finish on SIGTERM / ctrl-c.
    #[arg(long, default_value = "10s", value_parser = duration)]
    grace: Duration,
    /// A method the workers must offer, checked against their HELLO at start-up (GET
    /// /v1/methods lists what they offer): NAME for a unary method, NAME:stream for a
    /// stream. Repeatable.
    #[arg(long = "method", value_parser = method)]
    methods: Vec<(String, MethodKind)>,
    /// The worker program and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_timeout(s).ok_or_else(|| format!("{s:?} is not a duration such as 250ms or 10s"))
}

fn method(s: &str) -> Result<(String, MethodKind), String> {
    let (name, kind) = match s.split_once(':') {
        Some((n, "stream")) => (n, MethodKind::Stream),
        Some((n, "unary")) => (n, MethodKind::Unary),
        Some(_) => return Err(format!("{s:?}: the kind after ':' is unary or stream")),
        None => (s, MethodKind::Unary),
    };
    if name.is_empty() {
        return Err("a method name is not empty".into());
    }
    Ok((name.to_string(), kind))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wirepool-gateway: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wirepool-gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or("the worker command follows `--`")?;
    let mut builder = Pool::builder(WorkerCommand::new(program).args(rest))
        .workers(args.workers)
        .max_in_flight(args.max_in_flight);
    for (name, kind) in &args.methods {
        builder = builder.require_method(name.clone(), *kind);
    }
    let pool = builder.start().await?;
    let pending = args
        .workers
        .saturating_mul(args.max_in_flight as usize)
        .saturating_add(args.queue);
    let gateway = Gateway::builder(pool.clone())
        .max_pending(pending)
        .max_body_bytes(args.max_body_bytes)
        .header_timeout(args.header_timeout)
        .shutdown_grace(args.grace)
        .build()?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!(
        "wirepool-gateway: listening on http://{}",
        listener.local_addr()?
    );
    let served = gateway
        .serve(listener, wirepool_gateway::shutdown_signal())
        .await;
    pool.shutdown().await;
    served?;
    Ok(())
}
