//! Request routing: calls, streams, the method list, health, readiness, metrics.

use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::value::RawValue;
use tokio::sync::OwnedSemaphorePermit;
use wirepool::{CallOptions, Codec, MethodKind, WorkerState};
use wirepool_codec::Encoded;

use crate::status::{pool_error_json, status_of_code, Refusal};
use crate::stream_body::{self, Framing};
use crate::{Gateway, RouteLimits, TIMEOUT_HEADER};

/// The body of every response: a whole buffer, or rows streamed as the client reads them.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

const JSON: &str = "application/json";

/// Route names, the `route` label of the gateway's counters.
const ROUTES: [&str; 7] = [
    "call", "stream", "methods", "healthz", "readyz", "metrics", "other",
];

pub(crate) fn full(status: StatusCode, content_type: &str, body: Bytes) -> Response<ResponseBody> {
    let mut resp = Response::new(Full::new(body).boxed_unsync());
    *resp.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(CONTENT_TYPE, v);
    }
    resp
}

fn refuse(r: Refusal) -> Response<ResponseBody> {
    full(r.status, JSON, r.body())
}

fn pool_error(err: &wirepool::Error) -> Response<ResponseBody> {
    let status = StatusCode::from_u16(status_of_code(err.code()))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    full(status, JSON, pool_error_json(err))
}

/// The codec of a `Content-Type` (parameters ignored; absent means JSON).
fn codec_of(content_type: Option<&HeaderValue>) -> Result<(Codec, &'static str), Refusal> {
    let Some(v) = content_type else {
        return Ok((Codec::Json, JSON));
    };
    let text = v.to_str().unwrap_or("");
    let essence = text.split(';').next().unwrap_or("").trim();
    match essence.to_ascii_lowercase().as_str() {
        "application/json" => Ok((Codec::Json, JSON)),
        "application/msgpack" | "application/x-msgpack" | "application/vnd.msgpack" => {
            Ok((Codec::MsgPack, "application/msgpack"))
        }
        "application/cbor" => Ok((Codec::Cbor, "application/cbor")),
        "application/octet-stream" => Ok((Codec::Raw, "application/octet-stream")),
        _ => Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            format!(
                "Content-Type {:?} is not one of application/json, application/msgpack, \
                 application/cbor, application/octet-stream",
                crate::status::cut(text)
            ),
        )),
    }
}

/// The method name of `/v1/call/{method}`: 1 to 256 bytes of letters, digits, `_ . - :`.
pub(crate) fn method_name(rest: &str) -> Result<&str, Refusal> {
    let ok = !rest.is_empty()
        && rest.len() <= 256
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'));
    if ok {
        Ok(rest)
    } else {
        Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "BAD_METHOD_NAME",
            "a method name is 1 to 256 characters of letters, digits, '_', '.', '-' and ':'",
        ))
    }
}

/// The call's options: its codec, and its deadline from the `wirepool-timeout` header, else
/// from the route's default.
fn call_options<B>(
    req: &Request<B>,
    codec: Codec,
    route: Option<&RouteLimits>,
) -> Result<CallOptions, Refusal> {
    let mut opts = CallOptions::codec(codec);
    if let Some(d) = route.and_then(|r| r.get_timeout()) {
        opts = opts.with_timeout(d);
    }
    if let Some(v) = req.headers().get(TIMEOUT_HEADER) {
        let d = v
            .to_str()
            .ok()
            .and_then(crate::parse_timeout)
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "BAD_TIMEOUT",
                    "wirepool-timeout is digits and a unit: ns us ms s h, or n u m S M H",
                )
            })?;
        opts = opts.with_timeout(d);
    }
    Ok(opts)
}

/// Reads a body of at most `limit` bytes: 413 from `Content-Length` before reading, or when
/// the body grows past the limit while read.
async fn read_body<B>(req: Request<B>, limit: usize, within: Duration) -> Result<Bytes, Refusal>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let too_large = || {
        Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BODY_TOO_LARGE",
            format!("the request body is larger than {limit} bytes"),
        )
    };
    if let Some(len) = req.headers().get(CONTENT_LENGTH) {
        match len.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
            Some(n) if n > limit as u64 => return Err(too_large()),
            Some(_) => {}
            None => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "BAD_CONTENT_LENGTH",
                    "Content-Length is not a number",
                ))
            }
        }
    }
    let read = tokio::time::timeout(within, Limited::new(req.into_body(), limit).collect());
    let Ok(read) = read.await else {
        return Err(Refusal::new(
            StatusCode::REQUEST_TIMEOUT,
            "BODY_TIMEOUT",
            format!("the request body took longer than {within:?}"),
        ));
    };
    match read {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(_) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "BODY_READ_FAILED",
            "the request body could not be read",
        )),
    }
}

/// Counts a request whose future is dropped before its end: the client went away.
struct DisconnectGuard<'a> {
    gateway: &'a Gateway,
    done: bool,
}

impl Drop for DisconnectGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.gateway.inner.stats.disconnects.fetch_add(1, Relaxed);
        }
    }
}

/// A request value that serializes as the body it came from, in its codec.
enum Req {
    Raw(Bytes),
    Json(Box<RawValue>),
    Value(ciborium::Value),
}

impl serde::Serialize for Req {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Req::Raw(b) => s.serialize_bytes(b),
            Req::Json(v) => v.serialize(s),
            Req::Value(v) => v.serialize(s),
        }
    }
}

fn decode_request(codec: Codec, body: Bytes) -> Result<Req, Refusal> {
    let bad = |e: &dyn std::fmt::Display| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "BAD_BODY",
            format!("the body is not valid {}: {e}", codec.name()),
        )
    };
    match codec {
        Codec::Raw => Ok(Req::Raw(body)),
        Codec::Json => serde_json::from_slice(&body)
            .map(Req::Json)
            .map_err(|e| bad(&e)),
        _ => codec.decode(&body).map(Req::Value).map_err(|e| bad(&e)),
    }
}

impl Gateway {
    /// Answers one request (the service the accept loop runs; usable with any hyper server).
    pub async fn handle<B>(&self, req: Request<B>) -> Response<ResponseBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut guard = DisconnectGuard {
            gateway: self,
            done: false,
        };
        let (route, resp) = self.route(req).await;
        guard.done = true;
        self.inner.stats.count(route, resp.status().as_u16());
        resp
    }

    async fn route<B>(&self, req: Request<B>) -> (&'static str, Response<ResponseBody>)
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = req.uri().path().to_owned();
        let post = req.method() == Method::POST;
        let get = req.method() == Method::GET || req.method() == Method::HEAD;
        let (route, allowed) = if let Some(rest) = path.strip_prefix("/v1/call/") {
            if post {
                return (ROUTES[0], self.call(rest, req).await);
            }
            (ROUTES[0], "POST")
        } else if let Some(rest) = path.strip_prefix("/v1/stream/") {
            if post {
                return (ROUTES[1], self.stream(rest, req).await);
            }
            (ROUTES[1], "POST")
        } else {
            let route = match path.as_str() {
                "/v1/methods" => ROUTES[2],
                "/healthz" => ROUTES[3],
                "/readyz" => ROUTES[4],
                "/metrics" => ROUTES[5],
                _ => {
                    let r = Refusal::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such route");
                    return (ROUTES[6], refuse(r));
                }
            };
            if get {
                return (route, self.get(route));
            }
            (route, "GET")
        };
        let mut resp = refuse(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!("this route takes {allowed}"),
        ));
        resp.headers_mut()
            .insert(http::header::ALLOW, HeaderValue::from_static(allowed));
        (route, resp)
    }

    fn get(&self, route: &'static str) -> Response<ResponseBody> {
        match route {
            "healthz" => full(StatusCode::OK, JSON, Bytes::from_static(b"{\"ok\":true}")),
            "readyz" => {
                let m = self.inner.pool.metrics();
                let live = m
                    .workers
                    .iter()
                    .filter(|w| matches!(w.state, WorkerState::Ready | WorkerState::Leased))
                    .count();
                let status = if live > 0 {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                let body = serde_json::json!({"ready": live > 0, "live_workers": live});
                full(status, JSON, Bytes::from(body.to_string()))
            }
            "methods" => {
                // The workers' own list (their HELLO), not a declared one.
                let list: Vec<_> = self
                    .inner
                    .pool
                    .methods()
                    .iter()
                    .map(|m| {
                        let kind = match m.kind {
                            MethodKind::Stream => "stream",
                            _ => "unary",
                        };
                        let codecs: Vec<&str> = m.codecs.iter().map(|c| c.name()).collect();
                        serde_json::json!({"name": m.name, "kind": kind, "codecs": codecs})
                    })
                    .collect();
                let body = serde_json::json!({ "methods": list });
                full(StatusCode::OK, JSON, Bytes::from(body.to_string()))
            }
            _ => {
                let mut text = self.inner.pool.metrics().to_prometheus("gateway");
                let pending = self.inner.admission_in_use();
                self.inner.stats.prometheus(&mut text, pending);
                full(
                    StatusCode::OK,
                    wirepool::prometheus::CONTENT_TYPE,
                    Bytes::from(text),
                )
            }
        }
    }

    /// The request's body within the gateway's size and time limits, decoded in `codec`.
    /// The route's own body limit applies instead of the gateway's.
    async fn request_value<B>(
        &self,
        req: Request<B>,
        codec: Codec,
        route: Option<&RouteLimits>,
    ) -> Result<Req, Refusal>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let limits = &self.inner.limits;
        let max = route
            .and_then(|r| r.get_max_body_bytes())
            .unwrap_or(limits.max_body_bytes);
        let body = read_body(req, max, limits.body_timeout).await?;
        decode_request(codec, body)
    }

    fn admit(&self) -> Result<OwnedSemaphorePermit, Box<Response<ResponseBody>>> {
        self.inner
            .admission
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                self.inner.stats.shed.fetch_add(1, Relaxed);
                let mut resp = refuse(Refusal::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "OVERLOADED",
                    "every worker is busy and the gateway queue is full",
                ));
                let secs = self.inner.limits.retry_after_secs.to_string();
                if let Ok(v) = HeaderValue::from_str(&secs) {
                    resp.headers_mut().insert(RETRY_AFTER, v);
                }
                Box::new(resp)
            })
    }

    async fn call<B>(&self, rest: &str, req: Request<B>) -> Response<ResponseBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let prepared = (|| {
            let method = method_name(rest)?.to_owned();
            let (codec, content_type) = codec_of(req.headers().get(CONTENT_TYPE))?;
            let opts = call_options(&req, codec, self.inner.routes.get(&method))?;
            Ok::<_, Refusal>((method, codec, content_type, opts))
        })();
        let (method, codec, content_type, opts) = match prepared {
            Ok(p) => p,
            Err(r) => return refuse(r),
        };
        let permit = match self.admit() {
            Ok(p) => p,
            Err(resp) => return *resp,
        };
        let route = self.inner.routes.get(&method);
        let value = match self.request_value(req, codec, route).await {
            Ok(v) => v,
            Err(r) => return refuse(r),
        };
        let result = self
            .inner
            .pool
            .call_with::<_, Encoded>(&method, &value, opts)
            .await;
        drop(permit);
        match result {
            Ok(Encoded(body)) => full(StatusCode::OK, content_type, body),
            Err(e) => pool_error(&e),
        }
    }

    async fn stream<B>(&self, rest: &str, req: Request<B>) -> Response<ResponseBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let prepared = (|| {
            let method = method_name(rest)?.to_owned();
            let (codec, _) = codec_of(req.headers().get(CONTENT_TYPE))?;
            if codec == Codec::Raw {
                return Err(Refusal::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UNSUPPORTED_MEDIA_TYPE",
                    "streams answer rows as JSON: send application/json, msgpack or cbor",
                ));
            }
            let opts = call_options(&req, codec, self.inner.routes.get(&method))?;
            let sse = req
                .headers()
                .get(ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("text/event-stream"));
            let framing = if sse { Framing::Sse } else { Framing::Ndjson };
            Ok::<_, Refusal>((method, codec, opts, framing))
        })();
        let (method, codec, opts, framing) = match prepared {
            Ok(p) => p,
            Err(r) => return refuse(r),
        };
        let permit = match self.admit() {
            Ok(p) => p,
            Err(resp) => return *resp,
        };
        let route = self.inner.routes.get(&method);
        let value = match self.request_value(req, codec, route).await {
            Ok(v) => v,
            Err(r) => return refuse(r),
        };
        let mut rows = match self
            .inner
            .pool
            .stream_with::<_, serde::de::IgnoredAny>(&method, &value, opts)
            .await
        {
            Ok(rows) => rows,
            Err(e) => return pool_error(&e),
        };
        // The first frame before the headers: an early failure gets its own status.
        let first = match rows.next_frame().await {
            Some(Err(e)) => return pool_error(&e),
            other => other,
        };
        stream_body::response(rows, first, codec, framing, permit, self.clone())
    }
}

impl crate::Inner {
    fn admission_in_use(&self) -> usize {
        // Permits in use = the configured bound minus those available.
        self.max_pending
            .saturating_sub(self.admission.available_permits())
    }
}
