//! Replays every row of `conformance/bad_input.json` (PROTOCOL.md 22) against this parent with
//! the Rust conformance worker: each row passes, or is skipped for the reason the row itself
//! gives (`inexpressible` naming Rust, or `only` not listing it). Any other outcome, a panic of
//! the library included, fails the test with the row's id.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use serde::ser::{Error as _, Serialize, Serializer};
use serde_json::{json, Value};
use wirepool::{
    CallOptions, Codec, Pool, PoolBuilder, RecyclePolicy, RestartPolicy, RetryPolicy, WorkerCommand,
};

/// Upper bound of one row (a pool start, a call, a shutdown).
const ROW_TIMEOUT: Duration = Duration::from_secs(30);

fn table() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance/bad_input.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("bad_input.json is JSON")
}

/// The conformance worker, built (a no-op when up to date) in this test's profile.
fn conformance_worker() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args([
            "build",
            "-q",
            "-p",
            "wirepool-conformance",
            "--bin",
            "conformance_worker",
        ]);
        if !cfg!(debug_assertions) {
            cargo.arg("--release");
        }
        assert!(cargo.status().expect("run cargo").success(), "build failed");
        let exe = std::env::current_exe().expect("test binary path");
        exe.parent()
            .and_then(|deps| deps.parent())
            .expect("target dir")
            .join("conformance_worker")
    })
    .clone()
}

fn builder() -> PoolBuilder {
    Pool::builder(WorkerCommand::new(conformance_worker()))
        .workers(1)
        .shm_lane(None)
}

/// Why this row does not apply to Rust, as the row says.
fn skip_reason(row: &Value) -> Option<String> {
    if let Some(why) = row["inexpressible"]["rust"].as_str() {
        return Some(format!("inexpressible: {why}"));
    }
    let only = row["only"].as_array()?;
    (!only.iter().any(|l| l == "rust")).then(|| format!("only {only:?}"))
}

// ---------------------------------------------------------------------------------------
// Values

fn ms(v: &Value) -> Result<Duration, String> {
    if v == "max_duration" || v["$"] == "max_duration" {
        return Ok(Duration::MAX);
    }
    if let Some(n) = v.as_u64() {
        return Ok(Duration::from_millis(n));
    }
    match v.as_f64() {
        Some(f) if f >= 0.0 && f.is_finite() => Ok(Duration::from_secs_f64(f / 1000.0)),
        _ => Err(format!("no Duration for {v}")),
    }
}

fn int<T: TryFrom<u64>>(v: &Value) -> Result<T, String> {
    v.as_u64()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| format!("no integer of this type for {v}"))
}

/// A method name: a string, or `{"$": "repeat", "s", "n"}`.
fn text(v: &Value) -> String {
    match v["$"].as_str() {
        Some("repeat") => v["s"]
            .as_str()
            .unwrap()
            .repeat(v["n"].as_u64().unwrap() as usize),
        _ => v.as_str().expect("a string").to_string(),
    }
}

/// Sets pool option `name` to `v` on `b` (the canonical names of the table).
fn apply(b: PoolBuilder, name: &str, v: &Value) -> Result<PoolBuilder, String> {
    Ok(match name {
        "workers" => b.workers(int(v)?),
        "max_in_flight" => b.max_in_flight(int(v)?),
        "startup_timeout_ms" => b.startup_timeout(ms(v)?),
        "heartbeat_ms" => b.heartbeat(ms(v)?),
        "cancel_grace_ms" => b.cancel_grace(ms(v)?),
        "deadline_grace_ms" => b.deadline_grace(ms(v)?),
        "drain_grace_ms" => b.drain_grace(ms(v)?),
        "max_frame_size" => b.max_frame_size(int(v)?),
        "initial_credit" => b.stream_window(int(v)?),
        "max_message_size" => b.max_message_size(int(v)?),
        "stderr_tail_lines" => b.stderr_tail_lines(int(v)?),
        "retry_attempts" => b.retry(RetryPolicy::idempotent(["echo"]).attempts(int(v)?)),
        "max_requests" => b.recycle_policy(RecyclePolicy {
            max_requests: Some(int(v)?),
            ..Default::default()
        }),
        "max_rss_bytes" => b.recycle_policy(RecyclePolicy {
            max_rss_bytes: Some(int(v)?),
            ..Default::default()
        }),
        "max_idle_ms" => b.recycle_policy(RecyclePolicy {
            max_idle: Some(ms(v)?),
            ..Default::default()
        }),
        "command" => {
            let argv: Vec<&str> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            let cmd = match argv.split_first() {
                Some((program, args)) => WorkerCommand::new(program).args(args.iter().copied()),
                None => WorkerCommand::new(""),
            };
            replace_command(b, cmd)
        }
        _ => return Err(format!("no builder method for {name}")),
    })
}

/// The builder's options on another command (the builder keeps its command from `builder`).
fn replace_command(_b: PoolBuilder, cmd: WorkerCommand) -> PoolBuilder {
    Pool::builder(cmd).workers(1).shm_lane(None)
}

/// A builder with the row's pool option(s) set.
fn pool_builder(base: PoolBuilder, option: &str, v: &Value) -> Result<PoolBuilder, String> {
    let options: Vec<(String, Value)> = match v["$"].as_str() {
        Some("options") => v
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "$")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        _ => vec![(option.to_string(), v.clone())],
    };
    let mut restart = RestartPolicy::default();
    let mut touched = false;
    let mut b = base;
    for (name, v) in &options {
        match name.as_str() {
            "restart_backoff_ms" => restart.initial_backoff = ms(v)?,
            "restart_backoff_max_ms" => restart.max_backoff = ms(v)?,
            "max_restarts" => restart.max_restarts = int(v)?,
            "restart_window_ms" => restart.within = ms(v)?,
            _ => {
                b = apply(b, name, v)?;
                continue;
            }
        }
        touched = true;
    }
    Ok(if touched {
        b.restart_policy(restart)
    } else {
        b
    })
}

/// A serde value that refuses to be encoded (an "object of no codec type").
struct Opaque;

impl Serialize for Opaque {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(S::Error::custom("an opaque object has no encoding"))
    }
}

// ---------------------------------------------------------------------------------------
// Rows

type Outcome = Result<(), String>;

fn expect_code<T: std::fmt::Debug>(row: &Value, got: wirepool::Result<T>) -> Outcome {
    let want = row["code"].as_u64().expect("an error row has a code") as u32;
    match got {
        Ok(v) => Err(format!("expected code {want}, got Ok({v:?})")),
        Err(e) if e.code() != want => Err(format!("expected code {want}, got {}: {e}", e.code())),
        Err(e) => {
            let len = e.to_string().chars().count();
            match row["message_max_chars"].as_u64() {
                Some(max) if len as u64 > max => {
                    Err(format!("message of {len} characters, above {max}"))
                }
                _ => Ok(()),
            }
        }
    }
}

async fn add_works(pool: &Pool) -> Outcome {
    let sum: Value = pool
        .call("add", &json!({"a": 1, "b": 2}))
        .await
        .map_err(|e| format!("add after the row: {e}"))?;
    (sum == json!({"sum": 3}))
        .then_some(())
        .ok_or_else(|| format!("add answered {sum}"))
}

async fn pool_option_row(row: Value) -> Outcome {
    let option = row["option"].as_str().unwrap_or_default();
    let b = pool_builder(builder(), option, &row["value"])?;
    if row["at"] == "ok" {
        let pool = b.start().await.map_err(|e| format!("start failed: {e}"))?;
        let r = add_works(&pool).await;
        pool.shutdown().await;
        return r;
    }
    let got = b.start().await;
    expect_code(&row, got.as_ref().map(|_| ()).map_err(Clone::clone))?;
    drop(got);
    if row["code"] == 308 && option != "command" {
        // Raised before anything is spawned: the same options on a program that does not
        // exist still give INVALID_ARGUMENT, not SPAWN_FAILED.
        let missing = Pool::builder(WorkerCommand::new("/nonexistent/wirepool-no-such-program"))
            .workers(1)
            .shm_lane(None);
        let got = pool_builder(missing, option, &row["value"])?.start().await;
        expect_code(&row, got.map(|_| ())).map_err(|e| format!("before spawning: {e}"))?;
    }
    Ok(())
}

fn call_options(row: &Value) -> Result<CallOptions, String> {
    match row["option"].as_str() {
        Some("timeout_ms") => Ok(CallOptions::timeout(ms(&row["value"])?)),
        Some(other) => Err(format!("no call option {other}")),
        None => Ok(CallOptions::default()),
    }
}

/// A call (or a stream) of the row's method and request on `pool`.
async fn call(
    pool: &Pool,
    row: &Value,
    method: &str,
    opts: CallOptions,
) -> wirepool::Result<Value> {
    if row["stream"] == true {
        let mut rows = pool
            .stream_with::<_, Value>(method, &row["request"], opts)
            .await?;
        return Ok(Value::Array(rows.collect_rows().await?));
    }
    pool.call_with(method, &row["request"], opts).await
}

async fn call_option_row(pool: Pool, row: Value) -> Outcome {
    let method = text(&row["method"]);
    let got = call(&pool, &row, &method, call_options(&row)?).await;
    if row["at"] == "ok" {
        let v = got.map_err(|e| format!("call failed: {e}"))?;
        return (v == row["result"])
            .then_some(())
            .ok_or_else(|| format!("result {v}"));
    }
    expect_code(&row, got)
}

async fn method_row(pool: Pool, row: Value) -> Outcome {
    let method = text(&row["method"]);
    expect_code(
        &row,
        call(&pool, &row, &method, CallOptions::default()).await,
    )
}

async fn request_row(pool: Pool, row: Value) -> Outcome {
    let codec = match row["codec"].as_str() {
        Some("json") => Codec::Json,
        Some("msgpack") => Codec::MsgPack,
        Some("raw") => Codec::Raw,
        other => return Err(format!("codec {other:?}")),
    };
    let opts = CallOptions::codec(codec);
    let req = &row["request"];
    let got: wirepool::Result<Value> = match req["$"].as_str() {
        Some("bigint") => pool.call_with("echo", &(1u128 << 64), opts).await,
        Some("opaque_object") => pool.call_with("echo", &Opaque, opts).await,
        Some("non_string_key") => {
            let map: BTreeMap<(i32, i32), i32> = [((1, 2), 3)].into();
            pool.call_with("echo", &map, opts).await
        }
        Some("string_of_bytes") => return too_large_row(row).await,
        other => return Err(format!("no request value for {other:?}")),
    };
    expect_code(&row, got)
}

/// A raw request above the pool's `max_message_size`: refused locally, the pool lives on.
async fn too_large_row(row: Value) -> Outcome {
    let b = pool_builder(builder(), "", &{
        let mut o = row["pool"].clone();
        o["$"] = json!("options");
        o
    })?;
    let pool = b.start().await.map_err(|e| format!("start failed: {e}"))?;
    let n = row["request"]["n"].as_u64().unwrap() as usize;
    let got = pool.call_raw("echo", Bytes::from(vec![b'x'; n])).await;
    let r = expect_code(&row, got).and(
        match pool.call_raw("echo", Bytes::from_static(b"ok")).await {
            Ok(b) if b == "ok" => Ok(()),
            other => Err(format!("the next call: {other:?}")),
        },
    );
    pool.shutdown().await;
    r
}

async fn lifecycle_row(pool: Pool, row: Value) -> Outcome {
    let action = row["action"].as_str().unwrap();
    if action == "every_refusal_then_call" {
        return add_works(&pool).await;
    }
    if matches!(action, "stream_read_after_end" | "cancel_after_end") {
        let mut rows = pool
            .stream::<_, Value>("decls", &json!({"n": 3}))
            .await
            .map_err(|e| e.to_string())?;
        let all = rows.collect_rows().await.map_err(|e| e.to_string())?;
        if all.len() != 3 {
            return Err(format!("{} rows", all.len()));
        }
        if let Some(more) = rows.next().await {
            return Err(format!("read past the end: {more:?}"));
        }
        // Cancelling (dropping) a stream that has ended has no effect.
        drop(rows);
        return add_works(&pool).await;
    }
    let own = builder().start().await.map_err(|e| format!("start: {e}"))?;
    if action == "close_concurrently" {
        // Two shutdowns of an open pool at once (one through a clone, one through the pool
        // itself): both return, and the pool is closed after them.
        let other = own.clone();
        tokio::join!(own.shutdown(), other.shutdown());
        return match own.call::<_, Value>("add", &json!({"a": 1, "b": 2})).await {
            Err(e) if e.code() == 304 => Ok(()),
            other => Err(format!("a call after both shutdowns: {other:?}")),
        };
    }
    own.shutdown().await;
    match action {
        "call_after_close" => expect_code(
            &row,
            own.call::<_, Value>("add", &json!({"a": 1, "b": 2})).await,
        ),
        "stream_after_close" => expect_code(
            &row,
            own.stream::<_, Value>("decls", &json!({"n": 1}))
                .await
                .map(|_| ()),
        ),
        "lease_after_close" => expect_code(&row, own.lease().await.map(|_| ())),
        "close_twice" => {
            own.shutdown().await;
            tokio::join!(own.shutdown(), own.shutdown());
            Ok(())
        }
        other => Err(format!("no action {other}")),
    }
}

/// One row, in a task of its own (a panic of the library is the row's failure), bounded.
async fn run_row(pool: &Pool, row: &Value) -> Outcome {
    let (pool, row) = (pool.clone(), row.clone());
    let task = tokio::spawn(async move {
        match row["kind"].as_str().unwrap() {
            "pool_option" => pool_option_row(row).await,
            "call_option" => call_option_row(pool, row).await,
            "method" => method_row(pool, row).await,
            "request" => request_row(pool, row).await,
            "lifecycle" => lifecycle_row(pool, row).await,
            other => Err(format!("unknown kind {other}")),
        }
    });
    let abort = task.abort_handle();
    let outcome = tokio::time::timeout(ROW_TIMEOUT, task).await;
    abort.abort();
    match outcome {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) if e.is_panic() => Err(format!("panicked: {e}")),
        Ok(Err(e)) => Err(format!("task failed: {e}")),
        Err(_) => Err(format!("no outcome within {ROW_TIMEOUT:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_bad_input_json() {
    let t = table();
    let rows = t["rows"].as_array().expect("rows");
    assert!(rows.len() >= 100, "only {} rows", rows.len());
    // One pool takes every call-time row in turn; `pool.survives` then calls it once more.
    let pool = common::bounded(30, builder().start())
        .await
        .expect("the shared pool starts");
    let (mut passed, mut skipped, mut failed) = (0, 0, Vec::new());
    for row in rows {
        let id = row["id"].as_str().expect("id");
        if let Some(why) = skip_reason(row) {
            println!("skip {id}: {why}");
            skipped += 1;
            continue;
        }
        match run_row(&pool, row).await {
            Ok(()) => passed += 1,
            Err(why) => failed.push(format!("{id}: {why}")),
        }
    }
    common::bounded(30, pool.shutdown()).await;
    println!(
        "{passed} passed, {skipped} skipped, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "rows failed:\n{}", failed.join("\n"));
}

// ---------------------------------------------------------------------------------------
// The numeric options' whole space: a value starts a pool or is INVALID_ARGUMENT at once.

#[derive(Debug, Clone)]
struct Numbers {
    workers: usize,
    max_in_flight: u32,
    max_frame_size: u32,
    window: u32,
    heartbeat_ms: u64,
    startup_ms: u64,
    grace_ms: u64,
}

impl Numbers {
    fn builder(&self, cmd: WorkerCommand) -> PoolBuilder {
        Pool::builder(cmd)
            .shm_lane(None)
            .workers(self.workers)
            .max_in_flight(self.max_in_flight)
            .max_frame_size(self.max_frame_size)
            .stream_window(self.window)
            .heartbeat(Duration::from_millis(self.heartbeat_ms))
            .startup_timeout(Duration::from_millis(self.startup_ms))
            .drain_grace(Duration::from_millis(self.grace_ms))
    }

    /// PROTOCOL.md 22.2's ranges, written out independently of the library's.
    fn valid(&self) -> bool {
        let max_ms = 2_147_483_647;
        (1..=4096).contains(&self.workers)
            && self.max_in_flight >= 1
            && (65_536..=16_777_216).contains(&self.max_frame_size)
            && (1..=(1u32 << 31) - 1).contains(&self.window)
            && self.heartbeat_ms <= max_ms
            && (1..=max_ms).contains(&self.startup_ms)
            && self.grace_ms <= max_ms
    }
}

fn numbers() -> impl proptest::strategy::Strategy<Value = Numbers> {
    use proptest::prelude::*;
    let edge_ms = prop_oneof![
        Just(0u64),
        Just(1),
        Just(2_147_483_647),
        Just(2_147_483_648),
        any::<u64>(),
        1u64..20_000
    ];
    (
        prop_oneof![
            Just(0usize),
            Just(1),
            Just(4096),
            Just(4097),
            0usize..10_000
        ],
        prop_oneof![Just(0u32), Just(1), any::<u32>()],
        prop_oneof![
            Just(65_535u32),
            Just(65_536),
            Just(16_777_216),
            Just(16_777_217),
            any::<u32>()
        ],
        prop_oneof![Just(0u32), Just(1), Just(1 << 31), any::<u32>()],
        edge_ms.clone(),
        edge_ms.clone(),
        edge_ms,
    )
        .prop_map(
            |(
                workers,
                max_in_flight,
                max_frame_size,
                window,
                heartbeat_ms,
                startup_ms,
                grace_ms,
            )| Numbers {
                workers,
                max_in_flight,
                max_frame_size,
                window,
                heartbeat_ms,
                startup_ms,
                grace_ms,
            },
        )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..Default::default() })]

    /// Through the pool's own start, on a program that does not exist: an invalid value is
    /// INVALID_ARGUMENT, a valid one gets as far as spawning (SPAWN_FAILED), never anything
    /// else, never a panic.
    #[test]
    fn any_numeric_option_is_valid_or_refused_at_once(n in numbers()) {
        let missing = WorkerCommand::new("/nonexistent/wirepool-no-such-program");
        let got = runtime().block_on(n.builder(missing).start());
        let code = got.err().map(|e| e.code());
        let want = if n.valid() { 303 } else { 308 };
        proptest::prop_assert_eq!(code, Some(want), "{:?}", n);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 4, ..Default::default() })]

    /// A few valid values start a real pool of conformance workers that answers.
    #[test]
    fn valid_numeric_options_start_a_working_pool(
        workers in 1usize..=2,
        max_in_flight in 1u32..=100,
        max_frame_size in 65_536u32..=16_777_216,
        window in 1u32..=(1 << 31) - 1,
        heartbeat_ms in proptest::prop_oneof![proptest::strategy::Just(0u64), 50u64..=5_000],
    ) {
        let n = Numbers { workers, max_in_flight, max_frame_size, window, heartbeat_ms, startup_ms: 10_000, grace_ms: 1_000 };
        let outcome = runtime().block_on(async {
            let pool = n.builder(WorkerCommand::new(conformance_worker())).start().await.map_err(|e| e.to_string())?;
            let r = tokio::time::timeout(ROW_TIMEOUT, add_works(&pool)).await.map_err(|_| "timed out".to_string());
            pool.shutdown().await;
            r?
        });
        proptest::prop_assert_eq!(outcome, Ok(()), "{:?}", n);
    }
}
