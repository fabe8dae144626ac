//! The Rust parent runner of the conformance matrix: runs `conformance/scenarios.json` against a
//! pool (the `wirepool` crate) of any language's conformance worker and prints one JSON line per
//! scenario: `{"scenario", "ok", "detail", "elapsed"}`.
//!
//! ```sh
//! conformance_parent --scenarios conformance/scenarios.json [--only NAME ...] [--transport T] -- WORKER COMMAND...
//! ```
//!
//! `--transport` is how the workers are connected: `socketpair` (the default: local children
//! with an inherited socket, `WIREPOOL_FD`), `tls` (children that join the pool's listener over
//! TCP + TLS 1.3 with a ticket in `WIREPOOL_TICKET`, the remote path of PROTOCOL.md 21 on
//! loopback) or `tcp` (the same join over plain loopback TCP).
//!
//! Each scenario gets a fresh pool and is bounded by its `timeout_s`. Besides the scenario's own
//! expectation, every scenario that starts a pool checks that every request ended at the pool
//! (nothing left in flight within `settle_s`), whether the worker was replaced (`restarted`), and
//! that the pool still serves the suite's health-check call. The procedure of each scenario kind
//! is described in `conformance/README.md`; the Python runner implements the same one.

#[path = "conformance_parent/notices.rs"]
mod notices;
#[path = "conformance_parent/procs.rs"]
mod procs;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use procs::{check_live_workers, check_rss_after, peak_rss_mb, reset_peak_rss};
use serde_bytes::ByteBuf;
use serde_json::{json, Map, Value};
use wirepool::remote::{Launcher, ListenerOptions};
use wirepool::{
    CallOptions, Codec, Error, MethodKind, Pool, PoolBuilder, RecyclePolicy, RowStream,
    WorkerCommand,
};

type Check<T = ()> = Result<T, String>;

/// How the runner's pools connect their workers (`--transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Socketpair,
    Tls,
    Tcp,
}

static TRANSPORT: OnceLock<Transport> = OnceLock::new();

/// The parts of `scenarios.json` every scenario refers to.
struct Suite {
    codes: Map<String, Value>,
    defaults: Value,
    health: Value,
}

fn main() {
    let mut scenarios_path = None;
    let mut only = Vec::new();
    let mut worker = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--scenarios" => scenarios_path = args.next(),
            "--only" => only.extend(args.next()),
            "--transport" => {
                let t = match args.next().as_deref() {
                    Some("socketpair") => Transport::Socketpair,
                    Some("tls") => Transport::Tls,
                    Some("tcp") => Transport::Tcp,
                    other => usage(&format!(
                        "--transport is socketpair, tls or tcp, not {other:?}"
                    )),
                };
                let _ = TRANSPORT.set(t);
            }
            "--" => worker.extend(args.by_ref()),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let Some(path) = scenarios_path else {
        usage("--scenarios FILE is required")
    };
    if worker.is_empty() {
        usage("the worker command follows --");
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| usage(&format!("cannot read {path}: {e}")));
    let doc: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| usage(&format!("{path} is not JSON: {e}")));
    let suite = Suite {
        codes: doc["error_codes"].as_object().cloned().unwrap_or_default(),
        defaults: doc["defaults"].clone(),
        health: doc["health_check"].clone(),
    };
    let scenarios = doc["scenarios"].as_array().cloned().unwrap_or_default();
    notices::install();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        for sc in &scenarios {
            let name = sc["name"].as_str().unwrap_or("?");
            if !only.is_empty() && !only.iter().any(|o| o == name) {
                continue;
            }
            let bound = Duration::from_secs_f64(setting(&suite, sc, "timeout_s").as_f64().unwrap_or(60.0));
            let started = Instant::now();
            reset_peak_rss();
            let tmp = ScenarioDir::new();
            let outcome = match tokio::time::timeout(bound, run_scenario(&suite, sc, &worker, &tmp.0)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!("did not finish within its timeout_s of {bound:?}")),
            };
            drop(tmp);
            let (mut ok, mut detail) = match outcome {
                Ok(detail) => (true, detail),
                Err(detail) => (false, detail),
            };
            if let Some(limit) = setting(&suite, sc, "max_parent_rss_mb").as_f64() {
                let peak = peak_rss_mb();
                detail = format!("{detail}; parent peak RSS {peak:.0} MB");
                if ok && peak > limit {
                    ok = false;
                    detail = format!("{detail}, above the bound of {limit} MB");
                }
            }
            let line =
                json!({ "scenario": name, "ok": ok, "detail": detail, "elapsed": started.elapsed().as_secs_f64() });
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    });
}

fn usage(problem: &str) -> ! {
    eprintln!("conformance_parent: {problem}");
    eprintln!(
        "usage: conformance_parent --scenarios FILE [--only NAME ...] [--transport socketpair|tls|tcp] -- WORKER COMMAND..."
    );
    std::process::exit(2)
}

// ---------------------------------------------------------------------------------------------
// Scenario settings
// ---------------------------------------------------------------------------------------------

/// A top-level setting of the scenario, else of the defaults.
fn setting(suite: &Suite, sc: &Value, key: &str) -> Value {
    sc.get(key)
        .cloned()
        .unwrap_or_else(|| suite.defaults[key].clone())
}

fn pool_config(suite: &Suite, sc: &Value) -> Map<String, Value> {
    let mut cfg = suite.defaults["pool"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    if let Some(over) = sc.get("pool").and_then(Value::as_object) {
        cfg.extend(over.clone());
    }
    cfg
}

// ---------------------------------------------------------------------------------------------
// Hostile-worker settings: the worker's environment, the runner's memory and its children
// ---------------------------------------------------------------------------------------------

/// A fresh directory for one scenario ("{tmp}" in `worker_env`), removed afterwards.
struct ScenarioDir(String);

impl ScenarioDir {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("wirepool-scenario-{}-{n}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        ScenarioDir(dir.to_string_lossy().into_owned())
    }
}

impl Drop for ScenarioDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The pool config with the scenario's `worker_env` resolved into an `env` object.
fn with_env(mut cfg: Map<String, Value>, sc: &Value, tmp: &str) -> Map<String, Value> {
    if let Some(extra) = sc.get("worker_env").and_then(Value::as_object) {
        let env: Map<String, Value> = extra
            .iter()
            .map(|(k, v)| {
                let text = v
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string());
                (k.clone(), Value::String(text.replace("{tmp}", tmp)))
            })
            .collect();
        cfg.insert("env".into(), Value::Object(env));
    }
    cfg
}

fn number(cfg: &Map<String, Value>, key: &str) -> f64 {
    cfg.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("pool setting {key} is missing"))
}

fn builder(worker: &[String], cfg: &Map<String, Value>) -> PoolBuilder {
    let recycle = RecyclePolicy {
        max_requests: cfg.get("max_requests").and_then(Value::as_u64),
        ..Default::default()
    };
    let mut command = WorkerCommand::new(&worker[0]).args(&worker[1..]);
    for (k, v) in cfg
        .get("env")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        command = command.env(k, v.as_str().unwrap_or_default());
    }
    let builder = Pool::builder(command);
    // Remote workers (PROTOCOL.md 21): children that join over TCP with a ticket.
    let builder = match TRANSPORT.get().copied().unwrap_or(Transport::Socketpair) {
        Transport::Socketpair => builder,
        Transport::Tls => builder.launcher(Launcher::subprocess()),
        Transport::Tcp => builder
            .launcher(Launcher::subprocess())
            .listen(ListenerOptions::default().plain_tcp()),
    };
    // Optional: the SDK's default when a scenario file does not set it.
    let builder = match cfg.get("max_message_size").and_then(Value::as_u64) {
        Some(bytes) => builder.max_message_size(bytes),
        None => builder,
    };
    builder
        .recycle_policy(recycle)
        .drain_grace(Duration::from_secs_f64(number(cfg, "drain_grace_s")))
        .workers(number(cfg, "workers") as usize)
        .max_in_flight(number(cfg, "max_in_flight") as u32)
        .startup_timeout(Duration::from_secs_f64(number(cfg, "startup_timeout_s")))
        .heartbeat(Duration::from_millis(number(cfg, "heartbeat_ms") as u64))
        .cancel_grace(Duration::from_secs_f64(number(cfg, "cancel_grace_s")))
        .deadline_grace(Duration::from_secs_f64(number(cfg, "deadline_grace_s")))
        .max_frame_size(number(cfg, "max_frame_size") as u32)
        .stream_window(number(cfg, "window") as u32)
}

fn codec(name: &str) -> Check<Codec> {
    match name {
        "raw" => Ok(Codec::Raw),
        "json" => Ok(Codec::Json),
        "msgpack" => Ok(Codec::MsgPack),
        "cbor" => Ok(Codec::Cbor),
        other => Err(format!("unknown codec {other:?} in the scenario")),
    }
}

fn kind(name: &str) -> Check<MethodKind> {
    match name {
        "unary" => Ok(MethodKind::Unary),
        "stream" => Ok(MethodKind::Stream),
        other => Err(format!("unknown method kind {other:?} in the scenario")),
    }
}

/// A request in one of the scenario forms: a value for the codec, or bytes for the raw codec.
#[derive(Clone, Debug)]
enum Body {
    Value(Value),
    Bytes(Vec<u8>),
}

/// The deterministic bytes of `{"bytes": {"size": N}}`: byte i is (31 i + 17) mod 251.
fn pattern(size: usize) -> Vec<u8> {
    (0..size).map(|i| ((i * 31 + 17) % 251) as u8).collect()
}

/// The text of `{"string": {"size": N}}`: character i is 'a' + (31 i + 17) mod 26.
fn pattern_string(size: usize) -> String {
    (0..size)
        .map(|i| (b'a' + ((i * 31 + 17) % 26) as u8) as char)
        .collect()
}

fn request(form: &Value) -> Check<Body> {
    if let Some(v) = form.get("value") {
        Ok(Body::Value(v.clone()))
    } else if let Some(size) = form.get("string").and_then(|b| b["size"].as_u64()) {
        Ok(Body::Value(Value::String(pattern_string(size as usize))))
    } else if let Some(size) = form.get("bytes").and_then(|b| b["size"].as_u64()) {
        Ok(Body::Bytes(pattern(size as usize)))
    } else if let Some(text) = form.get("text").and_then(Value::as_str) {
        Ok(Body::Bytes(text.as_bytes().to_vec()))
    } else {
        Err(format!("unknown request form {form}"))
    }
}

fn describe(body: &Body) -> String {
    match body {
        Body::Value(Value::String(s)) if s.len() > 64 => {
            format!("a string of {} characters", s.chars().count())
        }
        Body::Value(v) => {
            let text = v.to_string();
            if text.len() > 200 {
                format!(
                    "{}...",
                    &text[..text.char_indices().nth(200).map_or(text.len(), |(i, _)| i)]
                )
            } else {
                text
            }
        }
        Body::Bytes(b) => format!("{} bytes", b.len()),
    }
}

fn same_body(want: &Body, got: &Body) -> Check {
    match (want, got) {
        (Body::Value(a), Body::Value(b)) if a == b => Ok(()),
        (Body::Bytes(a), Body::Bytes(b)) if a == b => Ok(()),
        (Body::Bytes(a), Body::Bytes(b)) => {
            let first = a
                .iter()
                .zip(b.iter())
                .position(|(x, y)| x != y)
                .unwrap_or(a.len().min(b.len()));
            Err(format!(
                "expected {} bytes, got {} bytes differing from offset {first}",
                a.len(),
                b.len()
            ))
        }
        _ => Err(format!(
            "expected {}, got {}",
            describe(want),
            describe(got)
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Outcomes
// ---------------------------------------------------------------------------------------------

/// An error as the scenario expectations see it, in every language.
struct Failure {
    code: u32,
    message: String,
    details: Value,
    signal: Option<i32>,
    stderr: String,
}

fn failure(e: &Error) -> Failure {
    let (message, details) = match e {
        Error::Remote {
            message, details, ..
        } => {
            let parsed = if details.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(details).unwrap_or_else(|_| Value::String(details.clone()))
            };
            (message.clone(), parsed)
        }
        other => (other.to_string(), Value::Null),
    };
    let (signal, stderr) = e
        .exit_info()
        .map(|x| (x.signal, x.stderr_tail.join("\n")))
        .unwrap_or((None, String::new()));
    Failure {
        code: e.code(),
        message,
        details,
        signal,
        stderr,
    }
}

fn expected_code(suite: &Suite, code: &Value) -> Check<u32> {
    match code {
        Value::Number(n) => n
            .as_u64()
            .map(|n| n as u32)
            .ok_or_else(|| format!("bad error code {n}")),
        Value::String(name) => suite
            .codes
            .get(name)
            .and_then(Value::as_u64)
            .map(|n| n as u32)
            .ok_or_else(|| format!("unknown error code name {name}")),
        other => Err(format!("bad error code {other}")),
    }
}

fn check_error(suite: &Suite, want: &Value, e: &Error) -> Check {
    let f = failure(e);
    let code = expected_code(suite, &want["code"])?;
    if f.code != code {
        return Err(format!(
            "expected error {} ({code}), got code {}: {e}",
            want["code"], f.code
        ));
    }
    let remote = TRANSPORT.get().is_some_and(|t| *t != Transport::Socketpair);
    if remote && code == wirepool::codes::WORKER_EXITED {
        // PROTOCOL.md 21.6: a remote worker's end is its connection's.
        let info = e.exit_info();
        if !info.is_some_and(|x| x.connection_lost && x.host.is_some()) {
            return Err(format!(
                "a remote worker's WORKER_EXITED must say its connection was lost, and where \
                 the worker ran: {info:?} ({e})"
            ));
        }
    }
    if let Some(pc) = want.get("protocol_code") {
        let got = match e {
            Error::ProtocolViolation { code, .. } => Some(*code),
            _ => None,
        };
        if got.map(|c| json!(c)).as_ref() != Some(pc) {
            return Err(format!(
                "expected protocol code {pc} in the error, got {got:?} ({e})"
            ));
        }
    }
    if let Some(part) = want.get("message_contains").and_then(Value::as_str) {
        if !f.message.contains(part) {
            return Err(format!(
                "error message {:?} does not contain {part:?}",
                f.message
            ));
        }
    }
    if let Some(details) = want.get("details") {
        if &f.details != details {
            return Err(format!(
                "error details {} differ from the expected {details}",
                f.details
            ));
        }
    }
    // A number, or null: unknown (a remote worker's death, PROTOCOL.md 21.6).
    if let Some(signal) = want.get("signal") {
        if f.signal.map(i64::from) != signal.as_i64() {
            return Err(format!(
                "expected the worker to die by signal {signal}, got {:?} ({e})",
                f.signal
            ));
        }
    }
    if let Some(status) = want.get("exit_status") {
        let got = e.exit_info().and_then(|x| x.code);
        if got.map(i64::from) != status.as_i64() {
            return Err(format!(
                "expected the worker to exit with status {status}, got {got:?} ({e})"
            ));
        }
    }
    if let Some(part) = want.get("stderr_contains").and_then(Value::as_str) {
        if !f.stderr.contains(part) {
            return Err(format!(
                "the stderr tail {:?} does not contain {part:?}",
                f.stderr
            ));
        }
    }
    Ok(())
}

fn check_elapsed(expect: &Value, elapsed: Duration) -> Check {
    let secs = elapsed.as_secs_f64();
    if let Some(min) = expect.get("min_elapsed_s").and_then(Value::as_f64) {
        // The worker counts its budget from receipt, so the outcome cannot come earlier.
        if secs + 0.001 < min {
            return Err(format!(
                "the outcome came after {secs:.3}s, before the {min}s deadline"
            ));
        }
    }
    if let Some(max) = expect.get("max_elapsed_s").and_then(Value::as_f64) {
        if secs > max {
            return Err(format!("the outcome took {secs:.3}s, more than {max}s"));
        }
    }
    Ok(())
}

async fn call(
    pool: &Pool,
    method: &str,
    codec: Codec,
    body: &Body,
    timeout: Option<Duration>,
) -> Result<Body, Error> {
    let opts = CallOptions {
        timeout,
        codec: Some(codec),
        ..Default::default()
    };
    match body {
        Body::Value(v) => pool
            .call_with::<Value, Value>(method, v, opts)
            .await
            .map(Body::Value),
        Body::Bytes(b) => {
            let req = ByteBuf::from(b.clone());
            pool.call_with::<ByteBuf, ByteBuf>(method, &req, opts)
                .await
                .map(|r| Body::Bytes(r.into_vec()))
        }
    }
}

fn check_call(suite: &Suite, expect: &Value, sent: &Body, outcome: &Result<Body, Error>) -> Check {
    if expect.get("any") == Some(&Value::Bool(true)) {
        return Ok(()); // any result or typed error: the call returned, one outcome
    }
    if let Some(want) = expect.get("error") {
        return match outcome {
            Ok(body) => Err(format!(
                "expected error {}, got the result {}",
                want["code"],
                describe(body)
            )),
            Err(e) => check_error(suite, want, e),
        };
    }
    let want = expect
        .get("result")
        .ok_or("the expectation has neither result nor error")?;
    let got = outcome
        .as_ref()
        .map_err(|e| format!("expected a result, got error {}: {e}", e.code()))?;
    if want == "echo" {
        same_body(sent, got)
    } else {
        same_body(&request(want)?, got)
    }
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

/// How each row must look, by its index k.
struct RowShape {
    shape: String,
    size: usize,
}

impl RowShape {
    fn new(expect: &Value) -> Self {
        let rows = &expect["rows"];
        RowShape {
            shape: rows["shape"].as_str().unwrap_or("any").to_string(),
            size: rows["size"].as_u64().unwrap_or(0) as usize,
        }
    }

    /// Checks row `k`; returns the index it carries (summed into the checksum).
    fn value(&self, k: u64, row: &Value) -> Check<u64> {
        let want = match self.shape.as_str() {
            "unchecked" => return Ok(0), // any_outcome: rows of any form
            "decl" => json!({ "i": k, "name": format!("decl_{k}"), "kind": "theorem" }),
            "int_index" => json!(k),
            other => {
                return Err(format!(
                    "row shape {other:?} does not apply to decoded rows"
                ))
            }
        };
        if row == &want {
            Ok(k)
        } else {
            Err(format!("row {k} is {row}, expected {want}"))
        }
    }

    fn bytes(&self, k: u64, row: &[u8]) -> Check<u64> {
        if self.shape == "unchecked" {
            return Ok(0);
        }
        if self.shape != "raw_index" {
            return Err(format!(
                "row shape {:?} does not apply to raw rows",
                self.shape
            ));
        }
        let prefix = self.size.min(8);
        let ok = row.len() == self.size
            && row[..prefix] == k.to_le_bytes()[..prefix]
            && row[prefix..].iter().all(|&b| b == 0xAB);
        if ok {
            Ok(k)
        } else {
            Err(format!(
                "raw row {k} ({} bytes) is not {} bytes of index {k} then 0xAB",
                row.len(),
                self.size
            ))
        }
    }
}

enum Rows {
    Values(RowStream<Value>),
    Bytes(RowStream<ByteBuf>),
}

/// How a stream ended: END with its summary, or an error.
enum Terminal {
    End(Option<Value>),
    Failed(Error),
}

/// A stream being read: rows checked one by one, counted and summed.
struct Reader {
    rows: Option<Rows>,
    shape: RowShape,
    count: u64,
    checksum: u64,
    terminal: Option<Terminal>,
}

impl Reader {
    async fn open(
        pool: &Pool,
        method: &str,
        codec: Codec,
        body: &Body,
        timeout: Option<Duration>,
        shape: RowShape,
    ) -> Reader {
        let opts = CallOptions {
            timeout,
            codec: Some(codec),
            ..Default::default()
        };
        let opened = match body {
            Body::Value(v) => pool
                .stream_with::<Value, Value>(method, v, opts)
                .await
                .map(Rows::Values),
            Body::Bytes(b) => pool
                .stream_with::<ByteBuf, ByteBuf>(method, &ByteBuf::from(b.clone()), opts)
                .await
                .map(Rows::Bytes),
        };
        let (rows, terminal) = match opened {
            Ok(rows) => (Some(rows), None),
            Err(e) => (None, Some(Terminal::Failed(e))),
        };
        Reader {
            rows,
            shape,
            count: 0,
            checksum: 0,
            terminal,
        }
    }

    /// Reads rows until `until` rows were read (or to the terminal with `None`). A bad row is an
    /// error; reaching the terminal is recorded in `self.terminal`.
    async fn read(&mut self, until: Option<u64>) -> Check {
        while self.terminal.is_none() && until.is_none_or(|u| self.count < u) {
            let Some(rows) = self.rows.as_mut() else {
                break;
            };
            let k = self.count;
            let next = match rows {
                Rows::Values(s) => match s.next().await {
                    Some(Ok(v)) => Some(Ok(self.shape.value(k, &v))),
                    Some(Err(e)) => Some(Err(e)),
                    None => None,
                },
                Rows::Bytes(s) => match s.next().await {
                    Some(Ok(b)) => Some(Ok(self.shape.bytes(k, &b))),
                    Some(Err(e)) => Some(Err(e)),
                    None => None,
                },
            };
            match next {
                Some(Ok(checked)) => {
                    self.checksum = self.checksum.wrapping_add(checked?);
                    self.count += 1;
                }
                Some(Err(e)) => {
                    if matches!(e, Error::Decode { what: "row", .. }) {
                        // A row that does not decode is that row's error, not the stream's
                        // terminal: a caller stops there (`row?`) and drops the stream, which
                        // cancels the request; `after` checks that it then ends.
                        self.rows = None;
                    }
                    self.terminal = Some(Terminal::Failed(e));
                }
                None => self.terminal = Some(Terminal::End(self.summary()?)),
            }
        }
        if self.terminal.is_some() {
            self.after_terminal().await?;
        }
        Ok(())
    }

    fn summary(&self) -> Check<Option<Value>> {
        match &self.rows {
            Some(Rows::Values(s)) => s
                .summary::<Value>()
                .map_err(|e| format!("the summary does not decode: {e}")),
            Some(Rows::Bytes(s)) => Ok(s
                .summary_bytes()
                .map(|b| json!(format!("{} raw bytes", b.len())))),
            None => Ok(None),
        }
    }

    /// Exactly one terminal: once a stream has ended, reading again yields nothing.
    async fn after_terminal(&mut self) -> Check {
        let again = match self.rows.as_mut() {
            Some(Rows::Values(s)) => s
                .next()
                .await
                .map(|r| r.map(|v| v.to_string()).map_err(|e| e.to_string())),
            Some(Rows::Bytes(s)) => s.next().await.map(|r| {
                r.map(|b| format!("{} bytes", b.len()))
                    .map_err(|e| e.to_string())
            }),
            None => None,
        };
        match again {
            None => Ok(()),
            Some(Ok(row)) => Err(format!("a row ({row}) arrived after the stream's terminal")),
            Some(Err(e)) => Err(format!(
                "a second outcome ({e}) after the stream's terminal"
            )),
        }
    }
}

fn check_stream(suite: &Suite, expect: &Value, reader: &Reader) -> Check<String> {
    let rows = &expect["rows"];
    let n = reader.count;
    if let Some(count) = rows.get("count").and_then(Value::as_u64) {
        if n != count {
            return Err(format!(
                "expected {count} rows, got {n} ({})",
                terminal_text(reader)
            ));
        }
    }
    if let Some(min) = rows.get("min").and_then(Value::as_u64) {
        if n < min {
            return Err(format!("expected at least {min} rows, got {n}"));
        }
    }
    if let Some(max) = rows.get("max").and_then(Value::as_u64) {
        if n > max {
            return Err(format!("expected at most {max} rows, got {n}"));
        }
    }
    if let Some(sum) = rows.get("checksum").and_then(Value::as_u64) {
        if reader.checksum != sum {
            return Err(format!(
                "row checksum {} differs from {sum}",
                reader.checksum
            ));
        }
    }
    match (&reader.terminal, expect.get("error")) {
        (None, _) => Err("the stream has not ended".into()),
        (Some(_), _) if expect.get("any") == Some(&Value::Bool(true)) => {
            Ok(format!("{n} rows, {}", terminal_text(reader)))
        }
        (Some(Terminal::Failed(e)), Some(want)) => {
            check_error(suite, want, e).map(|_| format!("{n} rows, then error {}", e.code()))
        }
        (Some(Terminal::Failed(e)), None) => Err(format!(
            "after {n} rows the stream failed with {}: {e}",
            e.code()
        )),
        (Some(Terminal::End(_)), Some(want)) => Err(format!(
            "expected error {} after the rows, the stream ended normally after {n} rows",
            want["code"]
        )),
        (Some(Terminal::End(summary)), None) => {
            match expect.get("summary") {
                Some(Value::String(none)) if none == "none" => {
                    if let Some(s) = summary {
                        return Err(format!("expected no summary, got {s}"));
                    }
                }
                Some(form) => {
                    let want = request(form)?;
                    let got = summary.clone().map(Body::Value);
                    if got.as_ref().map(|g| same_body(&want, g)) != Some(Ok(())) {
                        let got = got.as_ref().map_or("none".into(), describe);
                        return Err(format!(
                            "expected the summary {}, got {got}",
                            describe(&want)
                        ));
                    }
                }
                None => {}
            }
            Ok(format!("{n} rows, checksum {}", reader.checksum))
        }
    }
}

fn terminal_text(reader: &Reader) -> String {
    match &reader.terminal {
        None => "not ended".into(),
        Some(Terminal::End(_)) => "ended normally".into(),
        Some(Terminal::Failed(e)) => format!("then error {}: {e}", e.code()),
    }
}

// ---------------------------------------------------------------------------------------------
// The procedures
// ---------------------------------------------------------------------------------------------

struct Snapshot {
    pids: BTreeSet<u32>,
    restarts: u64,
}

fn snapshot(pool: &Pool) -> Snapshot {
    Snapshot {
        pids: pool.worker_pids().into_iter().collect(),
        restarts: pool.metrics().total_restarts(),
    }
}

fn in_flight(pool: &Pool) -> u64 {
    pool.metrics().workers.iter().map(|w| w.in_flight).sum()
}

/// Polls the pool's own accounting until `done` holds, up to `bound`.
async fn wait_for(pool: &Pool, bound: Duration, done: impl Fn(&Pool) -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if done(pool) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn run_scenario(suite: &Suite, sc: &Value, worker: &[String], tmp: &str) -> Check<String> {
    let kind_name = sc["kind"].as_str().unwrap_or("");
    let cfg = with_env(pool_config(suite, sc), sc, tmp);
    if kind_name == "startup" {
        return startup(suite, sc, worker, &cfg).await;
    }
    if kind_name == "shutdown_in_flight" {
        return shutdown_in_flight(suite, sc, worker, &cfg).await;
    }
    notices::reset();
    let pool = builder(worker, &cfg)
        .start()
        .await
        .map_err(|e| format!("the pool did not start: {} {e}", e.code()))?;
    let before = snapshot(&pool);
    let detail = match kind_name {
        "call" => call_scenario(suite, sc, &pool).await,
        "stream" => stream_scenario(suite, sc, &pool).await,
        "cancel_stream" => cancel_stream(sc, &pool).await,
        "cancel_call" => cancel_call(suite, sc, &pool).await,
        "slow_consumer" => slow_consumer(suite, sc, &pool).await,
        "concurrent" => concurrent(sc, &pool).await,
        "parallel_calls" => parallel_calls(suite, sc, &pool).await,
        "lease" => lease(suite, sc, &pool).await,
        "any_outcome" => any_outcome(sc, &pool).await,
        other => Err(format!("unknown scenario kind {other:?}")),
    };
    let result = match detail {
        Ok(detail) => after(suite, sc, &pool, &before)
            .await
            .and_then(|_| check_clamp_notices(sc))
            .map(|_| detail),
        Err(e) => Err(e),
    };
    pool.shutdown().await;
    result
}

/// The scenario's `clamp_notices`, if it has one, against the notices counted since its pool started.
fn check_clamp_notices(sc: &Value) -> Check {
    match sc["expect"]["clamp_notices"].as_u64() {
        Some(want) if notices::count() as u64 != want => Err(format!(
            "the pool logged {} clamp notice(s) (max_in_flight above the worker's max_concurrency), expected {want}",
            notices::count()
        )),
        _ => Ok(()),
    }
}

/// What every scenario checks once its outcome is in.
async fn after(suite: &Suite, sc: &Value, pool: &Pool, before: &Snapshot) -> Check {
    let settle = Duration::from_secs_f64(setting(suite, sc, "settle_s").as_f64().unwrap_or(3.0));
    if !wait_for(pool, settle, |p| in_flight(p) == 0).await {
        return Err(format!(
            "{} request(s) still in flight at the pool {settle:?} after the outcome: no terminal from the worker",
            in_flight(pool)
        ));
    }
    let health = &suite.health;
    let body = request(&health["request"])?;
    let method = health["method"].as_str().unwrap_or("add");
    // After any_outcome (a fuzzing worker), a health check routed to the broken worker before the
    // pool saw it break may fail like any request on it: the pool must serve within settle_s.
    let retry_until = Instant::now()
        + if sc["kind"] == "any_outcome" {
            settle
        } else {
            Duration::ZERO
        };
    loop {
        let outcome = call(
            pool,
            method,
            codec(health["codec"].as_str().unwrap_or("json"))?,
            &body,
            None,
        )
        .await;
        match check_call(suite, &health["expect"], &body, &outcome) {
            Ok(()) => break,
            Err(e) if Instant::now() >= retry_until => {
                return Err(format!("the pool no longer serves: {method}: {e}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let now = snapshot(pool);
    match setting(suite, sc, "restarted") {
        Value::Bool(false) if now.restarts != before.restarts || now.pids != before.pids => {
            Err(format!(
                "the worker was replaced (pids {:?} -> {:?}, restarts {} -> {})",
                before.pids, now.pids, before.restarts, now.restarts
            ))
        }
        Value::Bool(true) if !now.pids.is_disjoint(&before.pids) => Err(format!(
            "expected the worker to be replaced, pids {:?} -> {:?}",
            before.pids, now.pids
        )),
        _ => Ok(()),
    }?;
    check_live_workers(
        suite,
        sc,
        number(&pool_config(suite, sc), "workers") as usize,
    )
    .await
}

fn timeout_of(sc: &Value) -> Option<Duration> {
    sc.get("call_timeout_s")
        .and_then(Value::as_f64)
        .map(Duration::from_secs_f64)
}

fn method_of(sc: &Value) -> Check<(&str, Codec, Body)> {
    let method = sc["method"]
        .as_str()
        .ok_or("the scenario names no method")?;
    Ok((
        method,
        codec(sc["codec"].as_str().unwrap_or("json"))?,
        request(&sc["request"])?,
    ))
}

async fn call_scenario(suite: &Suite, sc: &Value, pool: &Pool) -> Check<String> {
    let (method, codec, body) = method_of(sc)?;
    let expect = &sc["expect"];
    let started = Instant::now();
    let outcome = call(pool, method, codec, &body, timeout_of(sc)).await;
    let elapsed = started.elapsed();
    check_call(suite, expect, &body, &outcome)?;
    check_elapsed(expect, elapsed)?;
    if let Some(limit) = expect.get("max_rss_after_mb").and_then(Value::as_f64) {
        check_rss_after(suite, sc, limit).await?; // the outcome is still held here, as a caller would
    }
    Ok(match outcome {
        Ok(b) => format!("result {} in {elapsed:?}", describe(&b)),
        Err(e) => format!("error {} in {elapsed:?}", e.code()),
    })
}

async fn stream_scenario(suite: &Suite, sc: &Value, pool: &Pool) -> Check<String> {
    let (method, codec, body) = method_of(sc)?;
    let expect = &sc["expect"];
    let started = Instant::now();
    let mut reader = Reader::open(
        pool,
        method,
        codec,
        &body,
        timeout_of(sc),
        RowShape::new(expect),
    )
    .await;
    if let Some(pause) = sc.get("pause") {
        // A consumer that stops reading for a while.
        reader
            .read(Some(pause[0].as_u64().ok_or("bad pause")?))
            .await?;
        tokio::time::sleep(Duration::from_secs_f64(
            pause[1].as_f64().ok_or("bad pause")?,
        ))
        .await;
    }
    reader.read(None).await?;
    let elapsed = started.elapsed();
    let detail = check_stream(suite, expect, &reader)?;
    check_elapsed(expect, elapsed)?;
    Ok(format!("{detail} in {elapsed:?}"))
}

async fn cancel_stream(sc: &Value, pool: &Pool) -> Check<String> {
    let (method, codec, body) = method_of(sc)?;
    let want = sc["read_rows"].as_u64().ok_or("read_rows is missing")?;
    let mut reader = Reader::open(
        pool,
        method,
        codec,
        &body,
        None,
        RowShape::new(&sc["expect"]),
    )
    .await;
    reader.read(Some(want)).await?;
    if reader.terminal.is_some() {
        return Err(format!(
            "the endless stream ended after {} rows ({})",
            reader.count,
            terminal_text(&reader)
        ));
    }
    // Not reading for a while lets the worker use up its credit and wait for more.
    tokio::time::sleep(Duration::from_secs_f64(
        sc.get("pause_s").and_then(Value::as_f64).unwrap_or(0.0),
    ))
    .await;
    drop(reader); // dropping the stream is how a Rust caller cancels it
    Ok(format!("cancelled after {want} rows"))
}

async fn cancel_call(suite: &Suite, sc: &Value, pool: &Pool) -> Check<String> {
    let (method, codec, body) = method_of(sc)?;
    let settle = Duration::from_secs_f64(setting(suite, sc, "settle_s").as_f64().unwrap_or(3.0));
    let task = {
        let pool = pool.clone();
        let method = method.to_string();
        tokio::spawn(async move { call(&pool, &method, codec, &body, None).await })
    };
    if !wait_for(pool, settle, |p| in_flight(p) >= 1).await {
        task.abort();
        return Err(format!("the call was not in flight within {settle:?}"));
    }
    task.abort(); // drops the call future: that is how a Rust caller cancels a call
    match task.await {
        Err(e) if e.is_cancelled() => Ok("cancelled while in flight".into()),
        Err(e) => Err(format!("the call task failed: {e}")),
        Ok(Ok(b)) => Err(format!(
            "the call returned {} instead of being cancelled",
            describe(&b)
        )),
        Ok(Err(e)) => Err(format!(
            "the call ended with {} before it was cancelled: {e}",
            e.code()
        )),
    }
}

async fn slow_consumer(suite: &Suite, sc: &Value, pool: &Pool) -> Check<String> {
    let (method, codec, body) = method_of(sc)?;
    let expect = &sc["expect"];
    let bound = sc["max_ahead_rows"]
        .as_u64()
        .ok_or("max_ahead_rows is missing")?;
    let checkpoints = sc["checkpoints"]
        .as_array()
        .ok_or("checkpoints are missing")?;
    let mut reader = Reader::open(pool, method, codec, &body, None, RowShape::new(expect)).await;
    let mut worst = 0;
    for point in checkpoints {
        let until = point[0].as_u64().ok_or("bad checkpoint")?;
        let pause = Duration::from_secs_f64(point[1].as_f64().ok_or("bad checkpoint")?);
        reader.read(Some(until)).await?;
        if reader.terminal.is_some() {
            return Err(format!(
                "the stream ended after {} rows, before checkpoint {until} ({})",
                reader.count,
                terminal_text(&reader)
            ));
        }
        // The consumer is slow: it stops reading for a while, and the producer must stall.
        tokio::time::sleep(pause).await;
        let produced: u64 = pool
            .call("raw_rows_produced", &Value::Null)
            .await
            .map_err(|e| format!("raw_rows_produced: {e}"))?;
        let ahead = produced.saturating_sub(reader.count);
        worst = worst.max(ahead);
        if ahead > bound {
            return Err(format!(
                "the worker produced {produced} rows while the consumer had read {}: {ahead} ahead, more than the {bound} flow control allows",
                reader.count
            ));
        }
    }
    reader.read(None).await?;
    let detail = check_stream(suite, expect, &reader)?;
    Ok(format!(
        "{detail}; producer at most {worst} rows ahead (bound {bound})"
    ))
}

async fn concurrent(sc: &Value, pool: &Pool) -> Check<String> {
    let calls = sc["calls"].as_u64().ok_or("calls is missing")?;
    let streams = sc["streams"].as_u64().ok_or("streams is missing")?;
    let stream_rows = sc["stream_rows"].as_u64().ok_or("stream_rows is missing")?;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..calls as i64 {
        let pool = pool.clone();
        tasks.spawn(async move {
            let got: Value = pool
                .call("add", &json!({ "a": i, "b": 2 * i }))
                .await
                .map_err(|e| format!("add #{i}: {e}"))?;
            if got != json!({ "sum": 3 * i }) {
                return Err(format!("add #{i} returned {got}"));
            }
            Ok(())
        });
    }
    for s in 0..streams {
        let pool = pool.clone();
        tasks.spawn(async move {
            let n = stream_rows + s;
            let shape = RowShape {
                shape: "decl".into(),
                size: 0,
            };
            let mut reader = Reader::open(
                &pool,
                "decls",
                Codec::Json,
                &Body::Value(json!({ "n": n })),
                None,
                shape,
            )
            .await;
            reader.read(None).await?;
            match &reader.terminal {
                Some(Terminal::End(Some(summary)))
                    if reader.count == n && summary == &json!({ "rows": n }) =>
                {
                    Ok(())
                }
                _ => Err(format!(
                    "stream #{s}: {} of {n} rows, {}",
                    reader.count,
                    terminal_text(&reader)
                )),
            }
        });
    }
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined
            .map_err(|e| format!("a task failed: {e}"))
            .and_then(|r| r);
        if let Err(e) = outcome {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(format!(
            "{calls} calls and {streams} streams at once, all correct"
        )),
    }
}

async fn startup(
    suite: &Suite,
    sc: &Value,
    worker: &[String],
    cfg: &Map<String, Value>,
) -> Check<String> {
    let mut b = builder(worker, cfg);
    for r in sc["require"].as_array().into_iter().flatten() {
        let name = r["method"].as_str().ok_or("require without a method")?;
        b = b.require_method_with_codec(
            name,
            kind(r["kind"].as_str().unwrap_or(""))?,
            codec(r["codec"].as_str().unwrap_or(""))?,
        );
    }
    let expect = &sc["expect"];
    let started = Instant::now();
    match (b.start().await, expect.get("error")) {
        (Ok(pool), Some(want)) => {
            pool.shutdown().await;
            Err(format!(
                "expected start-up to fail with {}, the pool started",
                want["code"]
            ))
        }
        (Ok(pool), None) => {
            let before = snapshot(&pool);
            let checked = after(suite, sc, &pool, &before).await;
            pool.shutdown().await;
            checked.map(|_| "started and served".into())
        }
        (Err(e), Some(want)) => {
            let elapsed = started.elapsed();
            check_error(suite, want, &e)?;
            check_elapsed(expect, elapsed)?;
            check_live_workers(suite, sc, 0)
                .await
                .map_err(|m| format!("{m} (the failed worker was not reaped)"))?;
            if sc.get("then_start") != Some(&Value::Bool(true)) {
                return Ok(format!("refused at start-up in {elapsed:?}: {e}"));
            }
            // A fresh pool (the next worker behaves) must serve.
            let again = builder(worker, cfg).start().await.map_err(|e2| {
                format!(
                    "refused at start-up as expected ({}), but the next pool failed: {} {e2}",
                    e.code(),
                    e2.code()
                )
            })?;
            let checked = after(suite, sc, &again, &snapshot(&again)).await;
            again.shutdown().await;
            checked
                .map(|_| format!("refused at start-up in {elapsed:?}: {e}; the next pool served"))
        }
        (Err(e), None) => Err(format!("the pool did not start: {} {e}", e.code())),
    }
}

/// Shuts the pool down while a call is in flight: the call ends as expected (finished within
/// the drain grace, or cancelled by the worker when the grace runs out), and the closed pool
/// refuses new calls with `POOL_CLOSED`.
async fn shutdown_in_flight(
    suite: &Suite,
    sc: &Value,
    worker: &[String],
    cfg: &Map<String, Value>,
) -> Check<String> {
    let (method, codec, body) = method_of(sc)?;
    let expect = &sc["expect"];
    let settle = Duration::from_secs_f64(setting(suite, sc, "settle_s").as_f64().unwrap_or(3.0));
    let pool = builder(worker, cfg)
        .start()
        .await
        .map_err(|e| format!("the pool did not start: {} {e}", e.code()))?;
    let sent = body.clone();
    let task = {
        let pool = pool.clone();
        let method = method.to_string();
        tokio::spawn(async move { call(&pool, &method, codec, &body, None).await })
    };
    if !wait_for(&pool, settle, |p| in_flight(p) >= 1).await {
        task.abort();
        pool.shutdown().await;
        return Err(format!("the call was not in flight within {settle:?}"));
    }
    let started = Instant::now();
    pool.shutdown().await;
    let shut = started.elapsed();
    let outcome = task
        .await
        .map_err(|e| format!("the call task failed: {e}"))?;
    check_call(suite, expect, &sent, &outcome)?;
    check_elapsed(expect, shut)?;
    match call(
        &pool,
        "add",
        Codec::Json,
        &Body::Value(json!({ "a": 1, "b": 2 })),
        None,
    )
    .await
    {
        Err(e) if e.code() == wirepool::codes::POOL_CLOSED => {}
        Err(e) => {
            return Err(format!(
                "a call after shutdown failed with {} instead of POOL_CLOSED: {e}",
                e.code()
            ))
        }
        Ok(b) => return Err(format!("a call after shutdown returned {}", describe(&b))),
    }
    Ok(format!(
        "shut down in {shut:?}; the call ended with {}",
        match &outcome {
            Ok(b) => describe(b),
            Err(e) => format!("error {}", e.code()),
        }
    ))
}

/// `calls` unary calls and `streams` streams at once, each ending in exactly one outcome of any
/// kind (a fuzzing worker's answers are unpredictable), within `max_elapsed_s`.
async fn any_outcome(sc: &Value, pool: &Pool) -> Check<String> {
    let (method, codec, body) = method_of(sc)?;
    let stream_method = sc["stream_method"].as_str().unwrap_or("decls").to_string();
    let timeout = timeout_of(sc);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..sc["calls"].as_u64().unwrap_or(0) {
        let (pool, method, body) = (pool.clone(), method.to_string(), body.clone());
        tasks.spawn(async move {
            Ok(match call(&pool, &method, codec, &body, timeout).await {
                Ok(_) => "a result".to_string(),
                Err(e) => format!("error {}", e.code()),
            })
        });
    }
    for _ in 0..sc["streams"].as_u64().unwrap_or(0) {
        let (pool, method, body) = (pool.clone(), stream_method.clone(), body.clone());
        tasks.spawn(async move {
            let shape = RowShape {
                shape: "unchecked".into(),
                size: 0,
            };
            let mut reader = Reader::open(&pool, &method, codec, &body, timeout, shape).await;
            match reader.read(None).await {
                Ok(()) => Ok(format!("{} rows, {}", reader.count, terminal_text(&reader))),
                // A summary this runner cannot decode into JSON is still one outcome.
                Err(e) if e.starts_with("the summary does not decode") => {
                    Ok(format!("{} rows, then {e}", reader.count))
                }
                Err(e) => Err(e), // e.g. a second outcome after the terminal
            }
        });
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        outcomes.push(joined.map_err(|e| format!("a task failed: {e}"))??);
    }
    check_elapsed(&sc["expect"], started.elapsed())?;
    Ok(outcomes.join("; "))
}

/// `count` identical calls at once, each checked against the expectation.
async fn parallel_calls(suite: &Suite, sc: &Value, pool: &Pool) -> Check<String> {
    let (method, codec, body) = method_of(sc)?;
    let count = sc["count"].as_u64().ok_or("count is missing")?;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (pool, method, body) = (pool.clone(), method.to_string(), body.clone());
        tasks.spawn(async move { call(&pool, &method, codec, &body, None).await });
    }
    let mut checked = 0;
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined.map_err(|e| format!("a call task failed: {e}"))?;
        check_call(suite, &sc["expect"], &body, &outcome)
            .map_err(|e| format!("call #{checked}: {e}"))?;
        checked += 1;
    }
    Ok(format!("{checked} calls at once, all as expected"))
}

/// A leased worker serves only its holder; once it dies, the lease's calls fail `LEASE_LOST`.
async fn lease(suite: &Suite, sc: &Value, pool: &Pool) -> Check<String> {
    let calls = sc["calls"].as_u64().ok_or("calls is missing")?;
    let lease = pool
        .lease()
        .await
        .map_err(|e| format!("lease: {} {e}", e.code()))?;
    let pid = lease.pid();
    for k in 0..calls {
        let got: u32 = lease
            .call("whoami", &Value::Null)
            .await
            .map_err(|e| format!("whoami #{k} on the lease: {e}"))?;
        if got != pid {
            return Err(format!(
                "call #{k} on the lease of pid {pid} was served by pid {got}"
            ));
        }
    }
    let other: u32 = pool
        .call("whoami", &Value::Null)
        .await
        .map_err(|e| format!("whoami on the pool: {e}"))?;
    if other == pid {
        return Err(format!("a pool call was served by the leased worker {pid}"));
    }
    let crashed = lease.call::<Value, Value>("crash", &Value::Null).await;
    let allowed = sc["crash_codes"]
        .as_array()
        .ok_or("crash_codes is missing")?;
    let codes: Vec<u32> = allowed
        .iter()
        .map(|c| expected_code(suite, c))
        .collect::<Check<_>>()?;
    match &crashed {
        Err(e) if codes.contains(&e.code()) => {}
        Err(e) => {
            return Err(format!(
                "crash on the lease failed with {} ({e}), expected one of {allowed:?}",
                e.code()
            ))
        }
        Ok(v) => return Err(format!("crash on the lease returned {v}")),
    }
    let lost = expected_code(suite, &json!("LEASE_LOST"))?;
    match lease
        .call::<Value, Value>("add", &json!({ "a": 1, "b": 2 }))
        .await
    {
        Err(e) if e.code() == lost => {
            // The lease's later calls carry the same exit record as the crash itself.
            let (was, now) = (
                crashed.as_ref().err().and_then(|c| c.exit_info()),
                e.exit_info(),
            );
            match (was, now) {
                (Some(a), Some(b))
                    if a.pid == b.pid
                        && a.signal == b.signal
                        && a.code == b.code
                        && a.stderr_tail == b.stderr_tail => {}
                _ => {
                    return Err(format!(
                        "LEASE_LOST lacks the crash's exit record: crash {was:?}, lost {now:?}"
                    ))
                }
            }
        }
        Err(e) => {
            return Err(format!(
                "a call on the lost lease failed with {} ({e}), expected LEASE_LOST",
                e.code()
            ))
        }
        Ok(v) => return Err(format!("a call on the lost lease returned {v}")),
    }
    drop(lease);
    Ok(format!(
        "{calls} calls on pid {pid}; crash -> {}; then LEASE_LOST",
        crashed.err().map_or(0, |e| e.code())
    ))
}
