//! The gateway end to end with real worker processes (`examples/gw_test_worker.rs`): routes,
//! codecs, streams, h2c, deadlines, cancellation on disconnect, shedding, limits, hostile
//! clients, drain on shutdown.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wirepool::Codec;

#[tokio::test]
async fn routes_health_ready_methods_metrics() {
    bounded(30, async {
        let gw = start(1, |b| b).await;
        let (s, _, body) = send(gw.addr, request("GET", "/healthz", &[], "")).await;
        assert_eq!((s, json(&body)["ok"].as_bool()), (200, Some(true)));
        let (s, _, body) = send(gw.addr, request("GET", "/readyz", &[], "")).await;
        assert_eq!(s, 200);
        assert_eq!(json(&body)["live_workers"], 1);
        let (s, _, body) = send(gw.addr, request("GET", "/v1/methods", &[], "")).await;
        assert_eq!(s, 200);
        // The workers' HELLO, also the methods the pool was not told to require.
        let methods = json(&body)["methods"].as_array().unwrap().clone();
        let find = |name: &str| {
            methods
                .iter()
                .find(|m| m["name"] == name)
                .unwrap_or_else(|| panic!("{name} not in {methods:?}"))
                .clone()
        };
        assert_eq!(
            find("echo"),
            serde_json::json!({"name": "echo", "kind": "unary", "codecs": ["json", "msgpack", "cbor"]})
        );
        assert_eq!(find("echo_raw")["codecs"], serde_json::json!(["raw"]));
        assert_eq!(find("count")["kind"], "stream");
        let (s, _, _) = send(gw.addr, request("GET", "/nope", &[], "")).await;
        assert_eq!(s, 404);
        let (s, h, _) = send(gw.addr, request("GET", "/v1/call/echo", &[], "")).await;
        assert_eq!((s, h["allow"].to_str().unwrap()), (405, "POST"));
        let (s, _, body) = send(gw.addr, request("POST", "/v1/call/no_such", &[], "1")).await;
        assert_eq!((s, json(&body)["name"].as_str()), (404, Some("UNKNOWN_METHOD")));
        let (s, _, body) = send(gw.addr, request("POST", "/v1/call/bad%20name", &[], "1")).await;
        assert_eq!((s, json(&body)["name"].as_str()), (400, Some("BAD_METHOD_NAME")));
        let (s, h, body) = send(gw.addr, request("GET", "/metrics", &[], "")).await;
        assert_eq!(s, 200);
        assert!(h["content-type"].to_str().unwrap().starts_with("text/plain"));
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains("wirepool_gateway_responses_total{route=\"call\",status=\"404\"} 1"), "{text}");
        assert!(text.contains("wirepool_gateway_shed_total 0"), "{text}");
        assert!(text.contains("wirepool_worker_requests_total"), "{text}");
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn every_codec_and_errors() {
    bounded(30, async {
        let gw = start(1, |b| b).await;
        let value = serde_json::json!({"a": [1, 2, 3], "b": "text"});
        // JSON.
        let (s, h, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/call/echo",
                &[("content-type", "application/json")],
                value.to_string(),
            ),
        )
        .await;
        assert_eq!(
            (s, h["content-type"].to_str().unwrap()),
            (200, "application/json")
        );
        assert_eq!(json(&body), value);
        // MessagePack and CBOR: the answer in the request's codec.
        for (codec, ct) in [
            (Codec::MsgPack, "application/msgpack"),
            (Codec::Cbor, "application/cbor"),
        ] {
            let encoded = codec.to_vec(&value).unwrap();
            let (s, h, body) = send(
                gw.addr,
                request("POST", "/v1/call/echo", &[("content-type", ct)], encoded),
            )
            .await;
            assert_eq!((s, h["content-type"].to_str().unwrap()), (200, ct));
            let back: serde_json::Value = codec.decode(&body).unwrap();
            assert_eq!(back, value, "{ct}");
        }
        // Raw bytes, not UTF-8.
        let raw = Bytes::from_static(&[0, 255, 1, 254]);
        let (s, _, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/call/echo_raw",
                &[("content-type", "application/octet-stream")],
                raw.clone(),
            ),
        )
        .await;
        assert_eq!((s, body), (200, raw));
        // 415, 400 (a body not in its codec), 422 (the handler's own code), 400 (raw to a JSON method).
        let (s, _, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/call/echo",
                &[("content-type", "text/plain")],
                "x",
            ),
        )
        .await;
        assert_eq!(
            (s, json(&body)["name"].as_str()),
            (415, Some("UNSUPPORTED_MEDIA_TYPE"))
        );
        let (s, _, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/call/echo",
                &[("content-type", "application/json")],
                "{nope",
            ),
        )
        .await;
        assert_eq!((s, json(&body)["name"].as_str()), (400, Some("BAD_BODY")));
        let (s, _, body) = send(gw.addr, request("POST", "/v1/call/fail", &[], "null")).await;
        assert_eq!(s, 422);
        let e = json(&body);
        assert_eq!(
            (
                e["code"].as_u64(),
                e["name"].as_str(),
                e["message"].as_str()
            ),
            (Some(1001), Some("APPLICATION"), Some("the handler refused"))
        );
        let (s, _, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/call/echo",
                &[("content-type", "application/octet-stream")],
                "x",
            ),
        )
        .await;
        // The worker does not take raw bytes for `echo`: CODEC_UNSUPPORTED.
        assert_eq!(
            (s, json(&body)["name"].as_str()),
            (415, Some("CODEC_UNSUPPORTED"))
        );
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn ndjson_and_sse_streams() {
    bounded(30, async {
        let gw = start(1, |b| b).await;
        let (s, h, body) = send(gw.addr, request("POST", "/v1/stream/count", &[], "3")).await;
        assert_eq!(
            (s, h["content-type"].to_str().unwrap()),
            (200, "application/x-ndjson")
        );
        let lines: Vec<serde_json::Value> = body
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(json)
            .collect();
        assert_eq!(
            lines,
            vec![
                serde_json::json!({"i": 0}),
                serde_json::json!({"i": 1}),
                serde_json::json!({"i": 2}),
                serde_json::json!({"summary": 3}),
            ]
        );
        // Rows of a MessagePack request come back as JSON lines too.
        let req = Codec::MsgPack.to_vec(&2u64).unwrap();
        let (s, _, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/stream/count",
                &[("content-type", "application/msgpack")],
                req,
            ),
        )
        .await;
        assert_eq!(
            (s, &body[..]),
            (200, &b"{\"i\":0}\n{\"i\":1}\n{\"summary\":2}\n"[..])
        );
        let (s, h, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/stream/count",
                &[("accept", "text/event-stream")],
                "2",
            ),
        )
        .await;
        assert_eq!(
            (s, h["content-type"].to_str().unwrap()),
            (200, "text/event-stream")
        );
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            "data: {\"i\":0}\n\ndata: {\"i\":1}\n\nevent: summary\ndata: 2\n\n"
        );
        // A stream whose worker sent no summary (an empty one on the wire) ends with null, in
        // both framings (it printed `{"summary":}`, not JSON, for the Python worker's streams).
        let (s, _, body) = send(gw.addr, request("POST", "/v1/stream/count", &[], "0")).await;
        assert_eq!((s, &body[..]), (200, &b"{\"summary\":null}\n"[..]));
        let (s, _, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/stream/count",
                &[("accept", "text/event-stream")],
                "0",
            ),
        )
        .await;
        assert_eq!(
            (s, &body[..]),
            (200, &b"event: summary\ndata: null\n\n"[..])
        );
        // A stream that fails before its first row gets its status.
        let (s, _, _) = send(gw.addr, request("POST", "/v1/stream/echo", &[], "1")).await;
        assert_eq!(s, 404);
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn h2c_and_keep_alive() {
    bounded(30, async {
        let gw = start(1, |b| b).await;
        let mut c = h2(gw.addr).await;
        for i in 0..3 {
            let resp = c
                .send_request(request(
                    "POST",
                    "http://test/v1/call/echo",
                    &[],
                    i.to_string(),
                ))
                .await
                .unwrap();
            assert_eq!(resp.version(), http::Version::HTTP_2);
            let (s, _, body) = read(resp).await;
            assert_eq!((s, json(&body)), (200, serde_json::json!(i)));
        }
        let mut c = h1(gw.addr).await;
        for i in 0..3 {
            c.ready().await.unwrap();
            let (s, _, body) = read(
                c.send_request(request("POST", "/v1/call/echo", &[], i.to_string()))
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(
                (s, json(&body)),
                (200, serde_json::json!(i)),
                "request {i} on one connection"
            );
        }
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn deadline_header() {
    bounded(30, async {
        let gw = start(1, |b| b).await;
        let started = Instant::now();
        let (s, _, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/call/sleep",
                &[("wirepool-timeout", "200m")],
                "5000",
            ),
        )
        .await;
        assert_eq!(s, 504, "{body:?}");
        assert_eq!(json(&body)["name"], "DEADLINE_EXCEEDED");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        let (s, _, body) = send(
            gw.addr,
            request(
                "POST",
                "/v1/call/sleep",
                &[("wirepool-timeout", "soon")],
                "1",
            ),
        )
        .await;
        assert_eq!(
            (s, json(&body)["name"].as_str()),
            (400, Some("BAD_TIMEOUT"))
        );
        let (s, _, _) = send(
            gw.addr,
            request("POST", "/v1/call/sleep", &[("wirepool-timeout", "2s")], "1"),
        )
        .await;
        assert_eq!(s, 200);
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn disconnect_cancels_on_the_worker() {
    bounded(30, async {
        let gw = start(1, |b| b).await;
        // A unary call: the client goes away while the worker sleeps.
        let mut raw = TcpStream::connect(gw.addr).await.unwrap();
        raw.write_all(b"POST /v1/call/sleep HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\n20000")
            .await
            .unwrap();
        let pool = gw.pool.clone();
        let end = Instant::now() + Duration::from_secs(10);
        while worker_sleeps(&pool).await < 1 {
            assert!(Instant::now() < end, "the call never reached the handler");
        }
        drop(raw);
        let mut seen = 0;
        while seen < 1 {
            assert!(Instant::now() < end, "the worker never saw CANCEL");
            seen = worker_cancels(&pool).await;
        }
        // A stream: read its first chunk, then go away.
        let mut c = h1(gw.addr).await;
        let resp = c
            .send_request(request("POST", "/v1/stream/forever", &[], "100"))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        use http_body_util::BodyExt;
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.data_ref().is_some_and(|d| d.starts_with(b"\"xxx")));
        drop(body);
        drop(c);
        while seen < 2 {
            assert!(
                Instant::now() < end,
                "the streaming worker never saw CANCEL"
            );
            seen = worker_cancels(&pool).await;
        }
        until("nothing in flight", 10, || in_flight(&gw.pool) == 0).await;
        let (_, _, body) = send(gw.addr, request("GET", "/metrics", &[], "")).await;
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            text.contains("wirepool_gateway_client_disconnects_total 2"),
            "{text}"
        );
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn sheds_with_503_when_full() {
    bounded(30, async {
        let gw = start(1, |b| b.max_pending(1).retry_after_secs(2)).await;
        let mut hold = TcpStream::connect(gw.addr).await.unwrap();
        hold.write_all(
            b"POST /v1/call/sleep HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\n20000",
        )
        .await
        .unwrap();
        until("the first call is in flight", 10, || {
            in_flight(&gw.pool) == 1
        })
        .await;
        let (s, h, body) = send(gw.addr, request("POST", "/v1/call/echo", &[], "1")).await;
        assert_eq!((s, h["retry-after"].to_str().unwrap()), (503, "2"));
        assert_eq!(json(&body)["name"], "OVERLOADED");
        drop(hold);
        until("the held call ended", 10, || in_flight(&gw.pool) == 0).await;
        // The permit came back: admitted again (the disconnect's permit is released at once).
        let mut ok = false;
        for _ in 0..100 {
            let (s, _, _) = send(gw.addr, request("POST", "/v1/call/echo", &[], "1")).await;
            if s == 200 {
                ok = true;
                break;
            }
            assert_eq!(s, 503);
            tokio::task::yield_now().await;
        }
        assert!(ok, "never admitted again");
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn body_and_header_limits() {
    bounded(30, async {
        let gw = start(1, |b| b.max_body_bytes(1000).body_timeout(Duration::from_millis(300))).await;
        // A body trickled slower than the body timeout: 408, and the permit is back.
        let mut raw = TcpStream::connect(gw.addr).await.unwrap();
        raw.write_all(b"POST /v1/call/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\n1").await.unwrap();
        let mut head = [0u8; 12];
        raw.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 408");
        let big = format!("\"{}\"", "x".repeat(2000));
        let (s, _, body) = send(gw.addr, request("POST", "/v1/call/echo", &[], big.clone())).await;
        assert_eq!((s, json(&body)["name"].as_str()), (413, Some("BODY_TOO_LARGE")));
        // Chunked, no Content-Length: refused while read.
        let mut raw = TcpStream::connect(gw.addr).await.unwrap();
        let chunk = format!("{:x}\r\n{}\r\n", 600, "y".repeat(600));
        raw.write_all(format!("POST /v1/call/echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n{chunk}{chunk}0\r\n\r\n").as_bytes()).await.unwrap();
        let mut head = [0u8; 12];
        raw.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 413");
        // Headers beyond max_header_bytes (16 KiB): 431.
        let mut raw = TcpStream::connect(gw.addr).await.unwrap();
        let long = "a".repeat(20_000);
        raw.write_all(format!("GET /healthz HTTP/1.1\r\nhost: t\r\nx-long: {long}\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = raw.read_to_end(&mut out).await;
        assert!(out.starts_with(b"HTTP/1.1 431"), "{:?}", String::from_utf8_lossy(&out[..out.len().min(40)]));
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn hostile_clients_garbage_and_slowloris() {
    bounded(30, async {
        let gw = start(1, |b| b.header_timeout(Duration::from_millis(500))).await;
        let mut raw = TcpStream::connect(gw.addr).await.unwrap();
        raw.write_all(b"\x16\x03\x01 GARBAGE \xff\xfe\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = raw.read_to_end(&mut out).await;
        assert!(
            out.starts_with(b"HTTP/1.1 400"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
        // Slowloris: a header byte every 50 ms, never the end of the head.
        let raw = TcpStream::connect(gw.addr).await.unwrap();
        let (mut rd, mut wr) = raw.into_split();
        let trickle = tokio::spawn(async move {
            let _ = wr.write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ").await;
            for _ in 0..200 {
                if wr.write_all(b"a").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let started = Instant::now();
        let mut out = Vec::new();
        let _ = rd.read_to_end(&mut out).await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "closed after {took:?}");
        assert!(
            took >= Duration::from_millis(400),
            "closed before the header timeout: {took:?}"
        );
        assert!(
            out.is_empty() || out.starts_with(b"HTTP/1.1 408"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
        trickle.abort();
        // The gateway still serves.
        let (s, _, _) = send(gw.addr, request("GET", "/healthz", &[], "")).await;
        assert_eq!(s, 200);
        gw.stop().await;
    })
    .await;
}

/// Writes `bytes` on a new connection and reads until the gateway closes it.
async fn raw_exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut raw = TcpStream::connect(addr).await.unwrap();
    raw.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = raw.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn hostile_requests_get_their_status_and_a_close() {
    bounded(30, async {
        let gw = start(1, |b| b.header_timeout(Duration::from_millis(500))).await;
        // Invalid UTF-8 in a path: raw bytes are not a valid request target; percent-encoded
        // ones are not a method name.
        let out = raw_exchange(gw.addr, b"POST /v1/call/\xff\xfe HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 400"), "{out:?}");
        let out = raw_exchange(
            gw.addr,
            b"POST /v1/call/%ff%fe HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\nconnection: close\r\n\r\n1",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 400"), "{out:?}");
        assert!(out.contains("BAD_METHOD_NAME"), "{out:?}");
        // An HTTP method no route has: 405 with Allow.
        let out = raw_exchange(
            gw.addr,
            b"BREW /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 405"), "{out:?}");
        assert!(out.to_ascii_lowercase().contains("allow: get"), "{out:?}");
        // Garbage pipelined behind a valid request: the first is answered, then 400 and a close.
        let out = raw_exchange(
            gw.addr,
            b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n\x00\x01 NOT HTTP \xff\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out:?}");
        let second = out.find("HTTP/1.1 400").unwrap_or_else(|| panic!("{out:?}"));
        assert!(second > 0, "{out:?}");
        // The gateway still serves.
        let (s, _, _) = send(gw.addr, request("GET", "/healthz", &[], "")).await;
        assert_eq!(s, 200);
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    bounded(30, async {
        let mut gw = start(1, |b| b.shutdown_grace(Duration::from_secs(10))).await;
        let addr = gw.addr;
        let call =
            tokio::spawn(
                async move { send(addr, request("POST", "/v1/call/sleep", &[], "300")).await },
            );
        until("the call is in flight", 10, || in_flight(&gw.pool) == 1).await;
        let served = gw.begin_stop();
        let (s, _, body) = call.await.unwrap();
        assert_eq!((s, json(&body)), (200, serde_json::json!(300)));
        served.await.unwrap();
        // No longer accepting.
        assert!(TcpStream::connect(addr).await.is_err());
        gw.pool.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn slow_reader_holds_the_worker_back() {
    bounded(60, async {
        let gw = start(1, |b| b).await;
        let mut c = h1(gw.addr).await;
        let resp = c
            .send_request(request("POST", "/v1/stream/forever", &[], "1000"))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        // The body is never read: the worker must stall once the credit window, hyper's
        // buffer and the socket buffers are full. Waits for the stall itself: the count of
        // rows received stops moving across 200 ms.
        let mut last = u64::MAX;
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let now = gw.pool.metrics().total_rows();
            if now == last && now > 0 {
                break;
            }
            assert!(
                Instant::now() < end,
                "the stream never stalled ({now} rows)"
            );
            last = now;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!("rows taken by the pool for a reader that reads nothing: {last}");
        // 1 MiB window + a 4 MiB frame + socket buffers, in 1 KB rows: far below 10 M.
        assert!(
            last < 20_000,
            "{last} rows buffered for a reader that reads nothing"
        );
        drop(resp);
        drop(c);
        until("the stream was cancelled", 10, || in_flight(&gw.pool) == 0).await;
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn per_route_body_limit_and_default_timeout() {
    bounded(30, async {
        use wirepool_gateway::RouteLimits;
        let gw = start(1, |b| {
            b.route("echo", RouteLimits::new().max_body_bytes(10))
                .route(
                    "sleep",
                    RouteLimits::new().timeout(Duration::from_millis(200)),
                )
        })
        .await;
        // echo: 10 bytes at most, by Content-Length and while read (chunked).
        let (s, _, _) = send(gw.addr, request("POST", "/v1/call/echo", &[], "1234567890")).await;
        assert_eq!(s, 200);
        let (s, _, body) = send(
            gw.addr,
            request("POST", "/v1/call/echo", &[], "12345678901"),
        )
        .await;
        assert_eq!(
            (s, json(&body)["name"].as_str()),
            (413, Some("BODY_TOO_LARGE"))
        );
        assert!(
            json(&body)["message"]
                .as_str()
                .unwrap()
                .contains("10 bytes"),
            "{body:?}"
        );
        let out = raw_exchange(
            gw.addr,
            b"POST /v1/call/echo HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\
              transfer-encoding: chunked\r\n\r\n6\r\n123456\r\n6\r\n789012\r\n0\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 413"), "{out:?}");
        // Other methods keep the gateway's limit (1 MiB): a 100-byte body to echo_raw passes.
        let (s, _, _) = send(
            gw.addr,
            request(
                "POST",
                "/v1/call/echo_raw",
                &[("content-type", "application/octet-stream")],
                "x".repeat(100),
            ),
        )
        .await;
        assert_eq!(s, 200);
        // sleep: 200 ms unless the request says otherwise.
        let started = Instant::now();
        let (s, _, body) = send(gw.addr, request("POST", "/v1/call/sleep", &[], "5000")).await;
        assert_eq!(
            (s, json(&body)["name"].as_str()),
            (504, Some("DEADLINE_EXCEEDED"))
        );
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        let (s, _, _) = send(
            gw.addr,
            request(
                "POST",
                "/v1/call/sleep",
                &[("wirepool-timeout", "5s")],
                "400",
            ),
        )
        .await;
        assert_eq!(s, 200, "the header's deadline counts over the route's");
        // A method without a route of its own has no default deadline: echo answers.
        let (s, _, _) = send(gw.addr, request("POST", "/v1/call/echo", &[], "1")).await;
        assert_eq!(s, 200);
        gw.stop().await;
    })
    .await;
}

#[tokio::test]
async fn the_gateway_as_a_tower_service() {
    bounded(30, async {
        use std::future::poll_fn;
        use tower_service::Service;
        let pool = pool(1).await;
        let mut svc = wirepool_gateway::Gateway::builder(pool.clone())
            .max_pending(1)
            .build()
            .unwrap();
        // Always ready; an answer for every request, never an error.
        poll_fn(|cx| {
            Service::<http::Request<http_body_util::Full<Bytes>>>::poll_ready(&mut svc, cx)
        })
        .await
        .unwrap();
        let resp = svc
            .call(request("POST", "/v1/call/echo", &[], "[1]"))
            .await
            .unwrap();
        let status = resp.status();
        use http_body_util::BodyExt;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            (status.as_u16(), json(&body)),
            (200, serde_json::json!([1]))
        );
        // Admission is inside the service: with one call in flight, the next is 503 at once.
        let held = svc.call(request("POST", "/v1/call/sleep", &[], "300"));
        let held = tokio::spawn(held);
        until("the call is in flight", 10, || in_flight(&pool) == 1).await;
        let resp = svc
            .call(request("POST", "/v1/call/echo", &[], "1"))
            .await
            .unwrap();
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "1");
        let resp = svc.call(request("GET", "/nope", &[], "")).await.unwrap();
        assert_eq!(resp.status(), 404);
        assert_eq!(held.await.unwrap().unwrap().status(), 200);
        pool.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn builder_refuses_bad_options() {
    bounded(30, async {
        let pool = pool(1).await;
        let bad = [
            wirepool_gateway::Gateway::builder(pool.clone())
                .max_body_bytes(0)
                .build(),
            wirepool_gateway::Gateway::builder(pool.clone())
                .max_header_bytes(100)
                .build(),
            wirepool_gateway::Gateway::builder(pool.clone())
                .max_pending(0)
                .build(),
            wirepool_gateway::Gateway::builder(pool.clone())
                .header_timeout(Duration::ZERO)
                .build(),
            wirepool_gateway::Gateway::builder(pool.clone())
                .route("bad name", wirepool_gateway::RouteLimits::new())
                .build(),
            wirepool_gateway::Gateway::builder(pool.clone())
                .route(
                    "echo",
                    wirepool_gateway::RouteLimits::new().max_body_bytes(0),
                )
                .build(),
            wirepool_gateway::Gateway::builder(pool.clone())
                .route(
                    "echo",
                    wirepool_gateway::RouteLimits::new().timeout(Duration::ZERO),
                )
                .build(),
            wirepool_gateway::Gateway::builder(pool.clone())
                .route(
                    "echo",
                    wirepool_gateway::RouteLimits::new().timeout(Duration::from_secs(1 << 40)),
                )
                .build(),
        ];
        for r in bad {
            assert!(matches!(
                r,
                Err(wirepool_gateway::GatewayError::InvalidArgument(_))
            ));
        }
        pool.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn binary_serves_and_stops_on_sigterm() {
    bounded(60, async {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wirepool-gateway"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--workers",
                "1",
                "--method",
                "count:stream",
                "--",
            ])
            .arg(worker())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("the gateway printed its address");
            if let Some(a) = line.strip_prefix("wirepool-gateway: listening on http://") {
                break a.parse().unwrap();
            }
        };
        let (s, _, body) = send(addr, request("POST", "/v1/stream/count", &[], "1")).await;
        assert_eq!((s, &body[..]), (200, &b"{\"i\":0}\n{\"summary\":1}\n"[..]));
        let (s, _, body) = send(addr, request("GET", "/v1/methods", &[], "")).await;
        let count = json(&body)["methods"]
            .as_array()
            .and_then(|l| l.iter().find(|m| m["name"] == "count").cloned());
        assert_eq!(
            (s, count.map(|m| m["kind"].clone())),
            (200, Some("stream".into()))
        );
        let pid = child.id().unwrap() as i32;
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let status = child.wait().await.unwrap();
        assert!(status.success(), "{status:?}");
        // A bad argument: a typed error and a failure status, no panic.
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wirepool-gateway"))
            .args(["--header-timeout", "soon", "--", "x"])
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("not a duration"));
    })
    .await;
}

#[tokio::test]
async fn binary_config_file_with_flags_over_it() {
    bounded(60, async {
        let dir = TempDir::new("config");
        let file = dir.0.join("gateway.toml");
        let text = format!(
            "listen = \"127.0.0.1:0\"\nworkers = 1\ncommand = [{:?}]\n\
             methods = [\"count:stream\", \"echo\"]\n\
             [limits]\nmax_body_bytes = 5\n\
             [routes.echo]\nmax_body_bytes = 1000\n\
             [routes.sleep]\ntimeout = \"200ms\"\n",
            worker().display().to_string()
        );
        std::fs::write(&file, text).unwrap();
        let file = file.to_str().unwrap();
        // --max-body-bytes 50 over the file's 5, --workers 2 over its 1.
        let (child, scheme, addr) =
            spawn_binary(&["--config", file, "--max-body-bytes", "50", "--workers", "2"]).await;
        assert_eq!(scheme, "http");
        let (s, _, body) = send(addr, request("GET", "/readyz", &[], "")).await;
        assert_eq!((s, json(&body)["live_workers"].as_u64()), (200, Some(2)));
        let raw = [("content-type", "application/octet-stream")];
        let (s, _, _) = send(
            addr,
            request("POST", "/v1/call/echo_raw", &raw, "x".repeat(40)),
        )
        .await;
        assert_eq!(s, 200, "the flag's 50 bytes, not the file's 5");
        let (s, _, _) = send(
            addr,
            request("POST", "/v1/call/echo_raw", &raw, "x".repeat(60)),
        )
        .await;
        assert_eq!(s, 413);
        // The file's routes: echo takes 1000 bytes, sleep has a 200 ms deadline.
        let big = format!("\"{}\"", "y".repeat(500));
        let (s, _, body) = send(addr, request("POST", "/v1/call/echo", &[], big.clone())).await;
        assert_eq!((s, json(&body)), (200, json(big.as_bytes())));
        let (s, _, body) = send(addr, request("POST", "/v1/call/sleep", &[], "5000")).await;
        assert_eq!(
            (s, json(&body)["name"].as_str()),
            (504, Some("DEADLINE_EXCEEDED"))
        );
        let status = terminate(child).await;
        assert!(status.success(), "{status:?}");
    })
    .await;
}

#[tokio::test]
async fn binary_config_remote_workers_join_the_pool() {
    bounded(60, async {
        let dir = TempDir::new("remote");
        let worker = worker().display().to_string();
        // Subprocess: the gateway's own children join its listener with a ticket.
        let file = dir.0.join("subprocess.toml");
        let text = format!(
            "listen = \"127.0.0.1:0\"\nworkers = 1\ncommand = [{worker:?}]\n\
             [remote]\nworkers = 1\nlauncher = \"subprocess\"\njoin_wait = \"20s\"\n"
        );
        std::fs::write(&file, text).unwrap();
        let (child, _, addr) = spawn_binary(&["--config", file.to_str().unwrap()]).await;
        let (s, _, body) = send(addr, request("GET", "/readyz", &[], "")).await;
        assert_eq!((s, json(&body)["live_workers"].as_u64()), (200, Some(2)));
        let (s, _, body) = send(addr, request("GET", "/metrics", &[], "")).await;
        assert_eq!(s, 200);
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains("wirepool_worker"), "{text}");
        assert!(terminate(child).await.success());
        // External: the pool's ticket is written to ticket_file; a worker started from it
        // joins, and only then does the gateway listen.
        let ticket = dir.0.join("ticket");
        let file = dir.0.join("external.toml");
        let text = format!(
            "listen = \"127.0.0.1:0\"\nworkers = 1\ncommand = [{worker:?}]\n\
             [remote]\nlisten = \"127.0.0.1:0\"\nworkers = 1\nlauncher = \"external\"\n\
             ticket_file = {:?}\njoin_wait = \"20s\"\n",
            ticket.display().to_string()
        );
        std::fs::write(&file, text).unwrap();
        let file = file.to_str().unwrap().to_string();
        let gateway = tokio::spawn(async move { spawn_binary(&["--config", &file]).await });
        until("the ticket file is written", 20, || {
            std::fs::read_to_string(&ticket).is_ok_and(|t| !t.is_empty())
        })
        .await;
        let mut joined = tokio::process::Command::new(&worker)
            .env("WIREPOOL_TICKET_FILE", &ticket)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (child, _, addr) = gateway.await.unwrap();
        let (s, _, body) = send(addr, request("GET", "/readyz", &[], "")).await;
        assert_eq!((s, json(&body)["live_workers"].as_u64()), (200, Some(2)));
        for i in 0..4 {
            let (s, _, body) =
                send(addr, request("POST", "/v1/call/echo", &[], i.to_string())).await;
            assert_eq!((s, json(&body)), (200, serde_json::json!(i)));
        }
        assert!(terminate(child).await.success());
        // The joined worker ends with its connection.
        let status = tokio::time::timeout(Duration::from_secs(10), joined.wait()).await;
        assert!(status.is_ok(), "the external worker outlived the gateway");
    })
    .await;
}

#[tokio::test]
async fn binary_refuses_bad_config_files_with_status_2() {
    bounded(60, async {
        let dir = TempDir::new("bad-config");
        let worker = worker().display().to_string();
        for (i, (text, words)) in [
            (
                "listne = \"127.0.0.1:0\"",
                &["unknown field", "listne", "line 1"][..],
            ),
            (
                "[limits]\nheader_timeout = \"soon\"",
                &["header_timeout", "not a duration"][..],
            ),
            ("workers = \"two\"", &["workers", "expected usize"][..]),
            (
                "[tls]\ncert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\"",
                &["/nonexistent/c.pem"][..],
            ),
            // Out of the builder's range: refused once checked, still status 2.
            (
                "listen = \"127.0.0.1:0\"\n[limits]\nmax_header_bytes = 100",
                &["max_header_bytes"][..],
            ),
            (
                "listen = \"127.0.0.1:0\"\n[routes.\"bad name\"]\ntimeout = \"1s\"",
                &["bad name"][..],
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let file = dir.0.join(format!("{i}.toml"));
            std::fs::write(&file, text).unwrap();
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wirepool-gateway"))
                .args([
                    "--workers",
                    "1",
                    "--config",
                    file.to_str().unwrap(),
                    "--",
                    &worker,
                ])
                .kill_on_drop(true)
                .output()
                .await
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
            assert!(
                err.contains(file.to_str().unwrap()) || i >= 3,
                "{text:?}: {err}"
            );
            for w in words {
                assert!(err.contains(w), "{text:?}: {w:?} not in {err}");
            }
            assert!(!err.contains("panicked"), "{err}");
        }
        // A missing file: named, status 2.
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wirepool-gateway"))
            .args(["--config", "/nonexistent/gateway.toml", "--", &worker])
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/gateway.toml"));
    })
    .await;
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Raises this process's soft descriptor limit to `want` (or the hard limit, if lower).
fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    assert!(
        lim.rlim_cur >= 2100,
        "the crowd test needs 2,100 descriptors; the hard limit is {}",
        lim.rlim_max
    );
}

#[tokio::test]
async fn silent_crowd_is_closed_and_fds_stay_flat() {
    bounded(60, async {
        let _one_crowd = CROWDS.lock().await;
        // 1,000 client sockets and the gateway's 1,000 in this one process.
        raise_fd_limit(4096);
        let gw = start(1, |b| {
            b.header_timeout(Duration::from_millis(500))
                .max_connections(800)
        })
        .await;
        // One served request first, so every lazily opened descriptor exists.
        let (s, _, _) = send(gw.addr, request("GET", "/healthz", &[], "")).await;
        assert_eq!(s, 200);
        let before = open_fds();
        for round in 0..2 {
            // 1,000 connections that never send (200 over max_connections): every one is
            // closed, the extra ones at accept, the others at the header timeout.
            let mut crowd = Vec::new();
            for _ in 0..1000 {
                crowd.push(TcpStream::connect(gw.addr).await.unwrap());
            }
            let started = Instant::now();
            for mut c in crowd {
                let mut buf = [0u8; 64];
                let n = c.read(&mut buf).await.unwrap_or(0);
                assert!(n == 0 || buf.starts_with(b"HTTP/1.1 408"), "round {round}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "round {round}: {:?}",
                started.elapsed()
            );
        }
        let (s, _, body) = send(gw.addr, request("GET", "/metrics", &[], "")).await;
        assert_eq!(s, 200);
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            !text.contains("wirepool_gateway_connections_refused_total 0\n"),
            "{text}"
        );
        // The gateway's side of every connection is closed too (polled: the close is async).
        until("descriptors back to where they were", 10, || {
            open_fds() <= before + 2
        })
        .await;
        gw.stop().await;
    })
    .await;
}

/// The two crowd tests one at a time: each counts this process's descriptors.
static CROWDS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The resident set of process `pid` in KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

// The gateway is the binary, so its descriptors and memory are its own, whatever the tests
// running beside this one do; two runtime threads for the crowd's 10,000 writes a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_crowd_is_closed_at_the_header_timeout_with_fds_and_memory_flat() {
    bounded(120, async {
        const CROWD: usize = 1000;
        const ROUNDS: usize = 6;
        let _one_crowd = CROWDS.lock().await;
        // The child inherits the raised limit: 1,000 client sockets here, 1,000 there.
        raise_fd_limit(4096);
        let header_timeout = Duration::from_millis(1000);
        let worker = worker().display().to_string();
        let (child, _, addr) = spawn_binary(&[
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--header-timeout",
            "1s",
            "--",
            &worker,
        ])
        .await;
        let pid = child.id().expect("running");
        // One served request first, so every lazily opened descriptor exists.
        let (s, _, _) = send(addr, request("GET", "/healthz", &[], "")).await;
        assert_eq!(s, 200);
        let fds_before = fds_of(pid);
        let mut rss = vec![rss_kib(pid)];
        let mut during = Vec::new();
        for round in 0..ROUNDS {
            // Every connection sends a request line, then one header byte every 100 ms and
            // never the end of the head. Each task starts as soon as its connection is up,
            // and times its own close.
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..CROWD {
                let conn = TcpStream::connect(addr).await.unwrap();
                let connected = Instant::now();
                tasks.spawn(async move {
                    let (mut rd, mut wr) = conn.into_split();
                    let trickle = async move {
                        let _ = wr
                            .write_all(b"POST /v1/call/echo HTTP/1.1\r\nx-slow: ")
                            .await;
                        let mut ticks = tokio::time::interval(Duration::from_millis(100));
                        // 30 s of trickling at most; the gateway must close long before.
                        for _ in 0..300 {
                            ticks.tick().await;
                            if wr.write_all(b"a").await.is_err() {
                                break;
                            }
                        }
                    };
                    let closed = async move {
                        let mut out = Vec::new();
                        let _ = rd.read_to_end(&mut out).await;
                        (connected.elapsed(), out)
                    };
                    tokio::pin!(trickle);
                    tokio::pin!(closed);
                    // A failed write ends the trickle: the close is then read.
                    tokio::select! {
                        r = &mut closed => r,
                        () = &mut trickle => closed.await,
                    }
                });
            }
            // The gateway still serves while the crowd trickles (what it holds then is
            // reported, not asserted: on a loaded machine the first ones may be closed already).
            let (s, _, _) = send(addr, request("GET", "/healthz", &[], "")).await;
            assert_eq!(s, 200, "round {round}: not served during the crowd");
            during.push((fds_of(pid), rss_kib(pid)));
            let mut closes = Vec::with_capacity(CROWD);
            while let Some(r) = tasks.join_next().await {
                let (took, out) = r.unwrap();
                assert!(
                    out.is_empty() || out.starts_with(b"HTTP/1.1 408"),
                    "round {round}: {:?}",
                    String::from_utf8_lossy(&out)
                );
                closes.push(took);
            }
            closes.sort();
            let (first, median, last) = (closes[0], closes[CROWD / 2], closes[CROWD - 1]);
            eprintln!(
                "round {round}: {CROWD} trickling connections, each closed {first:?} (median \
                 {median:?}, last {last:?}) after its connect"
            );
            // The header timeout closes them: not the first bytes (a connect's own wake-up can
            // be late on a loaded machine, hence the median), and none long after it.
            assert!(
                median >= header_timeout.mul_f64(0.9),
                "round {round}: closed before the header timeout (median {median:?})"
            );
            assert!(
                last < header_timeout + Duration::from_secs(5),
                "round {round}: the last one closed after {last:?}"
            );
            until("the gateway's descriptors back to the baseline", 10, || {
                fds_of(pid) <= fds_before
            })
            .await;
            rss.push(rss_kib(pid));
        }
        eprintln!(
            "gateway descriptors {fds_before} before; (descriptors, VmRSS KiB) during each \
             round: {during:?}; VmRSS KiB before and after each round: {rss:?}"
        );
        // Memory is bounded by one round's connections, not by their sum. Seen over 10
        // rounds: 13 MiB, then 31, 39, 40, 41, 42, 42, 43, 43, 43, 43 (allocator arenas
        // settling). 48 MiB over 6,000 connections in all leaves under 5 KiB a connection
        // for a leak beside the ~18 MiB one round holds; the last two rounds, a third of them.
        let base = rss[0];
        let peak = rss
            .iter()
            .chain(during.iter().map(|(_, r)| r))
            .max()
            .copied()
            .unwrap_or(base);
        let last_two = rss[ROUNDS].saturating_sub(rss[ROUNDS - 2]);
        assert!(
            peak - base < 48 * 1024,
            "{} KiB over {ROUNDS} rounds: {rss:?}",
            peak - base
        );
        assert!(
            last_two < 12 * 1024,
            "the last two rounds took {last_two} KiB more: {rss:?}"
        );
        let (s, _, _) = send(addr, request("GET", "/healthz", &[], "")).await;
        assert_eq!(s, 200);
        let status = terminate(child).await;
        assert!(status.success(), "{status:?}");
    })
    .await;
}
