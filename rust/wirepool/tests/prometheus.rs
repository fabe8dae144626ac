//! `PoolMetrics::to_prometheus`: the series move with calls, streams and crashes, the text parses
//! as the exposition format, and the `metrics` example serves it over HTTP.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{bounded, builder};

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

#[tokio::test]
async fn series_move_with_calls_streams_and_crashes() {
    bounded(60, async {
        let pool = builder(2).start().await.unwrap();
        let before = parse(&pool.metrics().to_prometheus("t"));
        assert_eq!(sum(&before, "wirepool_worker_requests_total", ""), 0.0);
        assert_eq!(sum(&before, "wirepool_workers", "pool=\"t\""), 2.0);
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
        let pids = pool.worker_pids();
        let s = parse(&pool.metrics().to_prometheus("t"));
        assert_eq!(sum(&s, "wirepool_worker_requests_total", ""), 26.0);
        assert_eq!(sum(&s, "wirepool_worker_rows_total", ""), 300.0);
        assert!(sum(&s, "wirepool_worker_received_bytes_total", "") > 300.0 * 20.0);
        assert!(sum(&s, "wirepool_worker_sent_bytes_total", "") > 26.0 * 16.0);
        assert_eq!(sum(&s, "wirepool_worker_in_flight", ""), 0.0);
        assert_eq!(sum(&s, "wirepool_worker_state", "state=\"ready\""), 2.0);
        assert_eq!(sum(&s, "wirepool_worker_state", ""), 2.0); // one state per slot
        let mut seen_pids: Vec<u32> = s
            .iter()
            .filter(|((n, _), _)| n == "wirepool_worker_pid")
            .map(|(_, v)| *v as u32)
            .collect();
        seen_pids.sort();
        let mut want = pids.clone();
        want.sort();
        assert_eq!(seen_pids, want);
        assert!(sum(&s, "wirepool_worker_rss_bytes", "") > 1e6);
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
        assert!(buckets.len() > 10, "{buckets:?}");
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

        // A crash: one restart, counted under its cause, on the slot that had it.
        let err = pool.call::<_, ()>("crash", &3).await.unwrap_err();
        assert!(matches!(err, wirepool::Error::WorkerExited(_)), "{err}");
        let restarted = loop {
            let s = parse(&pool.metrics().to_prometheus("t"));
            if sum(&s, "wirepool_worker_state", "state=\"ready\"") == 2.0
                && sum(&s, "wirepool_worker_restarts_total", "") == 1.0
            {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(
            sum(
                &restarted,
                "wirepool_worker_restarts_total",
                "cause=\"crashed\""
            ),
            1.0
        );
        pool.shutdown().await;
    })
    .await
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
