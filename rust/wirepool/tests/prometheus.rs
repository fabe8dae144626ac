//! `PoolMetrics::to_prometheus` against the shared metrics contract (`spec/metrics.json`): a real
//! pool's exposition is parsed and every family, help text, type, label set and bucket bound is
//! compared with the contract, and every required series must be there (a renamed series fails
//! here); then the values after calls, a stream, errors, a retry and two restarts. The `metrics`
//! example serves it over HTTP.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{bounded, builder};
use serde_json::Value;
/// Samples by (name, labels as written), checking every line on the way: `# HELP`/`# TYPE`
/// once per family and before its samples, `name{k="v",...} number` otherwise.
fn parse(text: &str) -> BTreeMap<(String, String), f64> {
    let mut samples = BTreeMap::new();
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(["gauge", "counter", "histogram"].contains(&kind), "{line}");
            assert!(
                typed.insert(name.into(), kind.into()).is_none(),
                "twice: {line}"
            );
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample: series value");
        let value: f64 = value
            .parse()
            .or_else(|_| {
                if value == "+Inf" {
                    Ok(f64::INFINITY)
                } else {
                    Err(())
                }
            })
            .unwrap_or_else(|_| panic!("value of {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').expect("labels close")),
            None => (series, ""),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| typed.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        assert!(typed.contains_key(family), "sample before its TYPE: {line}");
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let (k, _) = pair.split_once("=\"").expect("label k=\"v\"");
            assert!(
                k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
        }
        samples.insert((name.to_string(), labels.to_string()), value);
    }
    samples
}

fn sum(samples: &BTreeMap<(String, String), f64>, name: &str, label: &str) -> f64 {
    samples
        .iter()
        .filter(|((n, l), _)| n == name && l.contains(label))
        .map(|(_, v)| v)
        .sum()
}

fn count(samples: &BTreeMap<(String, String), f64>, name: &str) -> usize {
    samples.keys().filter(|(n, _)| n == name).count()
}

/// spec/metrics.json and the error code names of spec/constants.json (None outside the
/// repository's tree).
fn contract() -> Option<(Value, BTreeSet<String>)> {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spec");
    let read = |f: &str| -> Option<Value> {
        let text = std::fs::read_to_string(spec.join(f)).ok()?;
        Some(serde_json::from_str(&text).expect("valid JSON"))
    };
    let (metrics, constants) = (read("metrics.json")?, read("constants.json")?);
    let mut codes: BTreeSet<String> = constants["error_codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    // The names PROTOCOL.md section 3 gives a code the table does not list, by range (a
    // handler's own code >= 1000 is APPLICATION).
    for n in [
        "PROTOCOL",
        "REQUEST_ERROR",
        "LOCAL_ERROR",
        "APPLICATION",
        "UNKNOWN",
    ] {
        codes.insert(n.to_string());
    }
    Some((metrics, codes))
}

/// A label set as written, in order: `k="v",...` (values unescaped enough for the contract's
/// label values, which hold no quotes).
fn labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (k, after) = rest.split_once("=\"").expect("k=\"v\"");
        let mut end = 0;
        let bytes = after.as_bytes();
        while bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        out.push((k.to_string(), after[..end].to_string()));
        rest = after[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&after[end + 1..]);
    }
    out
}

/// Every family the text exports is the contract's (HELP, TYPE, labels and their values,
/// buckets), and every required one is there.
fn check_against_contract(text: &str, c: &Value, codes: &BTreeSet<String>, pool: &str) {
    let mut help: BTreeMap<&str, &str> = BTreeMap::new();
    let mut kind: BTreeMap<&str, &str> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').unwrap();
            help.insert(name, h);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, k) = rest.split_once(' ').unwrap();
            kind.insert(name, k);
        }
    }
    let series: BTreeMap<&str, &Value> = c["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s))
        .collect();
    let prefix = c["prefix"].as_str().unwrap();
    for name in kind.keys() {
        assert!(
            !name.starts_with(prefix) || series.contains_key(name),
            "{name} is not in the contract"
        );
    }
    for (name, s) in &series {
        if s["required"].as_bool().unwrap() {
            assert!(kind.contains_key(name), "{name} is missing");
        }
        let Some(k) = kind.get(name) else { continue };
        assert_eq!(*k, s["type"].as_str().unwrap(), "{name}'s TYPE");
        assert_eq!(help.get(name).copied(), s["help"].as_str(), "{name}'s HELP");
        let want: BTreeSet<&str> = s["labels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap())
            .collect();
        let mut les: BTreeMap<Vec<(String, String)>, Vec<f64>> = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series_text, value) = line.rsplit_once(' ').unwrap();
            let (sample, label_text) = series_text.split_once('{').unwrap_or((series_text, "}"));
            let suffix = sample.strip_prefix(*name);
            let ok = matches!(
                (*k, suffix),
                ("histogram", Some("_bucket" | "_sum" | "_count")) | (_, Some(""))
            );
            if !ok {
                continue;
            }
            let ls = labels(label_text.strip_suffix('}').unwrap());
            let got: BTreeSet<&str> = ls
                .iter()
                .map(|(k, _)| k.as_str())
                .filter(|k| *k != "le" || !sample.ends_with("_bucket"))
                .collect();
            assert_eq!(got, want, "{line}: labels");
            assert_eq!(
                ls.len(),
                want.len() + usize::from(sample.ends_with("_bucket")),
                "{line}"
            );
            let v: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            assert!(v.is_finite(), "{line}");
            for (key, val) in &ls {
                if key == "pool" {
                    assert_eq!(val, pool, "{line}");
                }
                let rule = &c["labels"][key.as_str()];
                if let Some(values) = rule["values"].as_array() {
                    assert!(
                        values.iter().any(|x| x == val.as_str()),
                        "{line}: {key}={val}"
                    );
                }
                if let Some(p) = rule["pattern"].as_str() {
                    assert_eq!(p, "^(0|[1-9][0-9]*)$", "the test knows this pattern only");
                    assert!(
                        val == "0" || (!val.starts_with('0') && val.parse::<u64>().is_ok()),
                        "{line}: {key}"
                    );
                }
                if key == "code" {
                    assert!(codes.contains(val), "{line}: code {val}");
                }
            }
            if sample.ends_with("_bucket") {
                let le = &ls.iter().find(|(k, _)| k == "le").unwrap().1;
                let rest: Vec<_> = ls.iter().filter(|(k, _)| k != "le").cloned().collect();
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                les.entry(rest).or_default().push(bound);
            }
        }
        if *k == "histogram" {
            let mut bounds: Vec<f64> = c["buckets"][s["buckets"].as_str().unwrap()]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_f64().unwrap())
                .collect();
            bounds.push(f64::INFINITY);
            for (key, got) in &les {
                assert_eq!(got, &bounds, "{name}{key:?}'s buckets");
            }
        }
    }
}

#[tokio::test]
async fn the_series_are_the_contracts_and_follow_the_pool() {
    let Some((c, codes)) = contract() else {
        eprintln!("no spec/metrics.json: skipped");
        return;
    };
    bounded(60, async {
        let pool = builder(2)
            .heartbeat(Duration::from_millis(100))
            .retry(wirepool::RetryPolicy::idempotent(["crash"]).attempts(2))
            .start()
            .await
            .unwrap();
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        // Before any call: every required family, the per-worker ones for slots 0 and 1.
        let text = pool.metrics().to_prometheus("t");
        check_against_contract(&text, &c, &codes, "t");
        let before = parse(&text);
        assert_eq!(sum(&before, "wirepool_worker_requests_total", ""), 0.0);
        assert_eq!(sum(&before, "wirepool_workers", "pool=\"t\""), 2.0);
        assert_eq!(count(&before, "wirepool_worker_pid"), 2);
        let first_pids = pool.worker_pids();

        for i in 0..25i64 {
            assert_eq!(pool.call::<_, i64>("add", &(i, 1)).await.unwrap(), i + 1);
        }
        let mut rows = pool
            .stream::<_, serde_json::Value>("decls", &300u64)
            .await
            .unwrap();
        while let Some(row) = rows.next().await {
            row.unwrap();
        }
        drop(rows);
        let e = pool.call::<_, ()>("panic", &()).await.unwrap_err();
        assert_eq!(e.code(), 204, "{e}"); // HANDLER_PANIC
        let e = pool.call::<_, ()>("fail", &1042u32).await.unwrap_err();
        assert_eq!(e.code(), 1042, "{e}");
        let e = pool.call::<_, ()>("no_such_method", &()).await.unwrap_err();
        assert_eq!(e.code(), wirepool::codes::UNKNOWN_METHOD, "{e}"); // an error, never sent
                                                                      // Two tries, two deaths, two replacements.
        let err = pool.call::<_, ()>("crash", &3).await.unwrap_err();
        assert!(matches!(err, wirepool::Error::WorkerExited(_)), "{err}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let (text, s) = loop {
            let text = pool.metrics().to_prometheus("t");
            let s = parse(&text);
            if sum(&s, "wirepool_workers_alive", "") == 2.0
                && count(&s, "wirepool_worker_heartbeat_rtt_seconds") == 2
                && sum(&s, "wirepool_restarts_total", "") == 2.0
            {
                break (text, s);
            }
            assert!(
                Instant::now() < deadline,
                "two workers alive and pinged:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        check_against_contract(&text, &c, &codes, "t");
        assert_eq!(sum(&s, "wirepool_calls_total", ""), 25.0 + 2.0 + 2.0);
        assert_eq!(sum(&s, "wirepool_streams_total", ""), 1.0);
        assert_eq!(sum(&s, "wirepool_retries_total", ""), 1.0);
        assert_eq!(
            sum(&s, "wirepool_errors_total", "code=\"HANDLER_PANIC\""),
            1.0
        );
        assert_eq!(
            sum(&s, "wirepool_errors_total", "code=\"APPLICATION\""),
            1.0
        );
        assert_eq!(
            sum(&s, "wirepool_errors_total", "code=\"WORKER_EXITED\""),
            2.0
        );
        assert_eq!(
            sum(&s, "wirepool_errors_total", "code=\"UNKNOWN_METHOD\""),
            1.0
        );
        assert_eq!(sum(&s, "wirepool_errors_total", ""), 5.0);
        assert_eq!(sum(&s, "wirepool_restarts_total", "cause=\"crashed\""), 2.0);
        assert_eq!(
            sum(&s, "wirepool_worker_restarts_total", "cause=\"crashed\""),
            2.0
        );
        assert_eq!(count(&s, "wirepool_recycles_total"), 0);
        // The slots' counters, kept across the replacements.
        // 25 adds, the stream, the panic, the fail, two crashes.
        assert_eq!(sum(&s, "wirepool_worker_requests_total", ""), 30.0);
        assert_eq!(sum(&s, "wirepool_worker_rows_total", ""), 300.0);
        assert!(sum(&s, "wirepool_worker_received_bytes_total", "") > 300.0 * 20.0);
        assert!(sum(&s, "wirepool_worker_sent_bytes_total", "") > 30.0 * 16.0);
        assert_eq!(sum(&s, "wirepool_worker_in_flight", ""), 0.0);
        assert_eq!(sum(&s, "wirepool_worker_state", "state=\"ready\""), 2.0);
        assert_eq!(sum(&s, "wirepool_worker_state", ""), 2.0); // one state per slot
        let mut seen_pids: Vec<u32> = s
            .iter()
            .filter(|((n, _), _)| n == "wirepool_worker_pid")
            .map(|(_, v)| *v as u32)
            .collect();
        seen_pids.sort();
        let mut want = pool.worker_pids();
        want.sort();
        assert_eq!(seen_pids, want);
        assert_ne!(want, first_pids);
        assert!(sum(&s, "wirepool_worker_rss_bytes", "") > 1e6);
        for ((n, l), v) in &s {
            if n == "wirepool_worker_heartbeat_rtt_seconds" {
                assert!(*v > 0.0 && *v < 5.0, "{l}: {v}");
            }
        }
        assert_eq!(sum(&s, "wirepool_queue_wait_seconds_count", ""), 30.0);
        // The histogram: every call counted once, buckets cumulative up to +Inf.
        let add = "method=\"add\"";
        assert_eq!(sum(&s, "wirepool_method_duration_seconds_count", add), 25.0);
        assert_eq!(
            sum(
                &s,
                "wirepool_method_duration_seconds_bucket",
                &format!("{add},le=\"+Inf\"")
            ),
            25.0
        );
        let mut buckets: Vec<(f64, f64)> = s
            .iter()
            .filter(|((n, l), _)| n == "wirepool_method_duration_seconds_bucket" && l.contains(add))
            .map(|((_, l), v)| {
                let le = l.rsplit_once("le=\"").unwrap().1.trim_end_matches('"');
                (le.parse::<f64>().unwrap_or(f64::INFINITY), *v)
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(buckets.len(), 24, "{buckets:?}");
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
        let total = sum(&s, "wirepool_method_duration_seconds_sum", add);
        assert!(total > 0.0 && total < 25.0 * 10.0, "{total}");
        assert_eq!(
            sum(
                &s,
                "wirepool_method_duration_seconds_count",
                "method=\"decls\""
            ),
            1.0
        );
        // The quantiles of the snapshot: interpolated, never above the slowest call.
        let add_lat = &pool.metrics().methods["add"];
        assert!(
            add_lat.p50 <= add_lat.max && add_lat.p99 <= add_lat.max,
            "{add_lat:?}"
        );
        pool.shutdown().await;
        // A shut-down pool: the families, no samples.
        let text = pool.metrics().to_prometheus("t");
        check_against_contract(&text, &c, &codes, "t");
        assert!(text.lines().all(|l| l.starts_with('#')), "{text}");
    })
    .await
}

#[tokio::test]
async fn a_recycle_is_a_recycle_not_a_restart() {
    let Some((c, codes)) = contract() else {
        return;
    };
    bounded(60, async {
        let pool = builder(1)
            .recycle_policy(wirepool::RecyclePolicy {
                max_requests: Some(3),
                ..Default::default()
            })
            .start()
            .await
            .unwrap();
        for i in 0..3i64 {
            assert_eq!(pool.call::<_, i64>("add", &(i, 1)).await.unwrap(), i + 1);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let (text, s) = loop {
            let text = pool.metrics().to_prometheus("r");
            let s = parse(&text);
            if sum(&s, "wirepool_recycles_total", "") == 1.0
                && sum(&s, "wirepool_workers_alive", "") == 1.0
            {
                break (text, s);
            }
            assert!(Instant::now() < deadline, "the recycle:\n{text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        check_against_contract(&text, &c, &codes, "r");
        assert_eq!(
            sum(&s, "wirepool_recycles_total", "reason=\"requests\""),
            1.0
        );
        assert_eq!(count(&s, "wirepool_restarts_total"), 0, "{text}");
        assert_eq!(count(&s, "wirepool_worker_restarts_total"), 0, "{text}");
        assert_eq!(
            sum(&s, "wirepool_worker_requests_total", "worker=\"0\""),
            3.0
        );
        pool.shutdown().await;
    })
    .await
}

#[test]
fn a_renamed_series_fails_the_check() {
    let Some((c, codes)) = contract() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let text = rt.block_on(bounded(30, async {
        let pool = builder(1).start().await.unwrap();
        let text = pool.metrics().to_prometheus("t");
        pool.shutdown().await;
        text
    }));
    check_against_contract(&text, &c, &codes, "t");
    let renamed = text.replace(
        "wirepool_worker_rows_total",
        "wirepool_worker_rows_received_total",
    );
    let err = std::panic::catch_unwind(|| check_against_contract(&renamed, &c, &codes, "t"))
        .expect_err("a renamed series fails");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("not in the contract"), "{msg}");
    let dropped: String = text
        .lines()
        .filter(|l| !l.contains("wirepool_retries_total"))
        .map(|l| format!("{l}\n"))
        .collect();
    let err = std::panic::catch_unwind(|| check_against_contract(&dropped, &c, &codes, "t"))
        .expect_err("a missing series fails");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("wirepool_retries_total is missing"), "{msg}");
}

#[test]
fn the_example_serves_metrics_over_http() {
    let exe = common::test_worker().with_file_name("metrics");
    assert!(
        exe.exists(),
        "{} missing: run through `cargo test`",
        exe.display()
    );
    let mut child = Command::new(&exe)
        .args(["--port", "0", "--calls", "25", "--scrapes", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // A hung example is killed, so the reads below end (in failure) instead of hanging.
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(60)).is_err() {
            common::kill(pid, libc::SIGKILL);
        }
    });
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("HTTP head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains(wirepool::prometheus::CONTENT_TYPE), "{head}");
    let s = parse(body);
    // Bounded: the example exits after its one scrape, its pool shut down.
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    let _ = done.send(());
    watchdog.join().unwrap();
    assert!(status.success(), "{status}");
    assert!(rest.contains("stopped"), "{rest}");
    assert_eq!(
        sum(&s, "wirepool_worker_requests_total", "pool=\"example\""),
        26.0
    );
    assert_eq!(sum(&s, "wirepool_worker_rows_total", ""), 1000.0);
    assert_eq!(
        sum(
            &s,
            "wirepool_method_duration_seconds_count",
            "method=\"add\""
        ),
        25.0
    );
    assert_eq!(sum(&s, "wirepool_workers", ""), 2.0);
}
