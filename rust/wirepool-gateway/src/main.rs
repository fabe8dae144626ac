//! `wirepool-gateway --listen 127.0.0.1:8080 --workers 4 -- python worker.py`, or
//! `wirepool-gateway --config gateway.toml`.

mod config;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use config::{Config, LauncherKind};
use wirepool::remote::{Launcher, ListenerOptions};
use wirepool::{MethodKind, Pool, WorkerCommand};
use wirepool_gateway::{parse_timeout, Gateway, GatewayBuilder, RouteLimits, TlsConfig};

/// An HTTP gateway in front of a pool of wirepool workers. Every option can also be in the
/// `--config` file; a flag given counts over the file's value.
#[derive(Parser, Debug)]
#[command(name = "wirepool-gateway", version)]
struct Args {
    /// A TOML config file (the gateway README's "Config file").
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Worker processes [default: 4].
    #[arg(long)]
    workers: Option<usize>,
    /// Requests in flight per worker [default: 64].
    #[arg(long)]
    max_in_flight: Option<u32>,
    /// Requests queued for a worker beyond those in flight; past it, 503 [default: 128].
    #[arg(long)]
    queue: Option<usize>,
    /// Largest request body in bytes [default: 1048576].
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Time to send a request head (e.g. 10s, 500ms) [default: 10s].
    #[arg(long, value_parser = duration)]
    header_timeout: Option<Duration>,
    /// Time in-flight requests get to finish on SIGTERM / ctrl-c [default: 10s].
    #[arg(long, value_parser = duration)]
    grace: Option<Duration>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key); ALPN h2 and http/1.1.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A method the workers must offer, checked against their HELLO at start-up (GET
    /// /v1/methods lists what they offer): NAME for a unary method, NAME:stream for a
    /// stream. Repeatable.
    #[arg(long = "method", value_parser = method)]
    methods: Vec<(String, MethodKind)>,
    /// The worker program and its arguments (after `--`; or `command` in the config file).
    #[arg(last = true, num_args = 1..)]
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
    let settings = match Settings::resolve(args) {
        Ok(s) => s,
        Err(e) => {
            // As clap does for a bad flag.
            eprintln!("wirepool-gateway: {e}");
            return ExitCode::from(2);
        }
    };
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
    match runtime.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed::Option(e)) => {
            eprintln!("wirepool-gateway: {e}");
            ExitCode::from(2)
        }
        Err(Failed::Run(e)) => {
            eprintln!("wirepool-gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The flags over the config file over the defaults, checked before anything starts.
struct Settings {
    listen: SocketAddr,
    workers: usize,
    max_in_flight: u32,
    command: Vec<String>,
    methods: Vec<(String, MethodKind)>,
    remote: Option<config::Remote>,
    gateway: Box<dyn FnOnce(GatewayBuilder) -> GatewayBuilder>,
}

impl Settings {
    fn resolve(args: Args) -> Result<Settings, String> {
        let file = match &args.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        let limits = file.limits;
        let workers = args.workers.or(file.workers).unwrap_or(4);
        let max_in_flight = args.max_in_flight.or(file.max_in_flight).unwrap_or(64);
        let queue = args.queue.or(file.queue).unwrap_or(128);
        let command = if !args.command.is_empty() {
            args.command
        } else {
            file.command
                .ok_or("the worker command follows `--` (or is `command` in the config file)")?
        };
        let mut methods = args.methods;
        if methods.is_empty() {
            for m in file.methods.unwrap_or_default() {
                methods.push(method(&m).map_err(|e| format!("methods: {e}"))?);
            }
        }
        let tls = match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => file.tls.map(|t| (t.cert, t.key)),
        };
        let tls = match tls {
            Some((cert, key)) => {
                Some(TlsConfig::from_pem_files(&cert, &key).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        let mut routes = Vec::new();
        for (name, r) in file.routes {
            let mut limits = RouteLimits::new();
            if let Some(n) = r.max_body_bytes {
                limits = limits.max_body_bytes(n);
            }
            if let Some(d) = r.timeout {
                limits = limits.timeout(d.0);
            }
            routes.push((name, limits));
        }
        // Admitted at once: in flight on every worker (remote ones too) plus the queue.
        let slots = workers.saturating_add(file.remote.as_ref().map_or(0, |r| r.workers));
        let pending = slots
            .saturating_mul(max_in_flight as usize)
            .saturating_add(queue);
        let max_body = args.max_body_bytes.or(limits.max_body_bytes);
        let header_timeout = args.header_timeout.or(limits.header_timeout.map(|d| d.0));
        let grace = args.grace.or(limits.grace.map(|d| d.0));
        let gateway = move |mut b: GatewayBuilder| {
            b = b.max_pending(pending);
            if let Some(n) = max_body {
                b = b.max_body_bytes(n);
            }
            if let Some(n) = limits.max_header_bytes {
                b = b.max_header_bytes(n);
            }
            if let Some(d) = header_timeout {
                b = b.header_timeout(d);
            }
            if let Some(d) = limits.body_timeout {
                b = b.body_timeout(d.0);
            }
            if let Some(n) = limits.max_connections {
                b = b.max_connections(n);
            }
            if let Some(d) = grace {
                b = b.shutdown_grace(d);
            }
            if let Some(n) = limits.retry_after_secs {
                b = b.retry_after_secs(n);
            }
            for (name, r) in routes {
                b = b.route(name, r);
            }
            if let Some(t) = tls {
                b = b.tls(t);
            }
            b
        };
        Ok(Settings {
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080))),
            workers,
            max_in_flight,
            command,
            methods,
            remote: file.remote,
            gateway: Box::new(gateway),
        })
    }
}

/// Why the binary stops: an option out of range (exit 2, as a bad flag) or a failure to run.
enum Failed {
    Option(String),
    Run(Box<dyn std::error::Error>),
}

impl<E: Into<Box<dyn std::error::Error>>> From<E> for Failed {
    fn from(e: E) -> Self {
        Failed::Run(e.into())
    }
}

async fn run(s: Settings) -> Result<(), Failed> {
    let (program, rest) = s
        .command
        .split_first()
        .ok_or_else(|| Failed::Option("the worker command follows `--`".into()))?;
    let mut builder = Pool::builder(WorkerCommand::new(program).args(rest))
        .workers(s.workers)
        .max_in_flight(s.max_in_flight);
    for (name, kind) in &s.methods {
        builder = builder.require_method(name.clone(), *kind);
    }
    if let Some(r) = &s.remote {
        let mut launcher = match r.launcher {
            LauncherKind::Subprocess => Launcher::subprocess(),
            LauncherKind::External => {
                let file = r.ticket_file.clone().ok_or_else(|| {
                    Failed::Option("remote: an external launcher needs ticket_file".into())
                })?;
                Launcher::external().on_ticket(move |ticket| {
                    if let Err(e) = std::fs::write(&file, ticket.encode()) {
                        eprintln!("wirepool-gateway: ticket_file {}: {e}", file.display());
                    }
                })
            }
        };
        if let Some(d) = r.join_wait {
            launcher = launcher.join_wait(d.0);
        }
        let mut listen = ListenerOptions::default();
        if let Some(addr) = r.listen {
            listen = listen.bind(addr);
        }
        if let Some(host) = &r.advertise {
            listen = listen.advertise(host.clone());
        }
        builder = builder.add_workers(r.workers, launcher).listen(listen);
    }
    let pool = builder.start().await?;
    let gateway = match (s.gateway)(Gateway::builder(pool.clone())).build() {
        Ok(g) => g,
        Err(e) => {
            pool.shutdown().await;
            return Err(Failed::Option(e.to_string()));
        }
    };
    let listener = tokio::net::TcpListener::bind(s.listen).await?;
    let scheme = if gateway.is_tls() { "https" } else { "http" };
    eprintln!(
        "wirepool-gateway: listening on {scheme}://{}",
        listener.local_addr()?
    );
    let served = gateway
        .serve(listener, wirepool_gateway::shutdown_signal())
        .await;
    pool.shutdown().await;
    served?;
    Ok(())
}
