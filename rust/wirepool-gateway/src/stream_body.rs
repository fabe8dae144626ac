//! A stream's rows as an HTTP body: NDJSON lines or Server-Sent Events, one frame of rows per
//! poll of the body, so the client's reading pace is the worker's (credit is granted only as
//! rows are taken from the [`RowStream`]). Dropping the body (the client went away) drops the
//! stream, which sends CANCEL.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tokio::sync::OwnedSemaphorePermit;
use wirepool::{Codec, RowStream, RowsPayload};

use std::sync::atomic::Ordering::Relaxed;

use crate::routes::ResponseBody;
use crate::status::pool_error_json;
use crate::Gateway;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    Ndjson,
    Sse,
}

struct State {
    rows: RowStream<serde::de::IgnoredAny>,
    first: Option<Option<wirepool::Result<RowsPayload>>>,
    codec: Codec,
    framing: Framing,
    done: bool,
    gateway: Gateway,
    _permit: OwnedSemaphorePermit,
}

impl Drop for State {
    fn drop(&mut self) {
        if !self.done {
            // The client went away mid-stream; dropping `rows` sends CANCEL.
            self.gateway.inner.stats.disconnects.fetch_add(1, Relaxed);
        }
    }
}

pub(crate) fn response(
    rows: RowStream<serde::de::IgnoredAny>,
    first: Option<wirepool::Result<RowsPayload>>,
    codec: Codec,
    framing: Framing,
    permit: OwnedSemaphorePermit,
    gateway: Gateway,
) -> Response<ResponseBody> {
    let state = State {
        rows,
        first: Some(first),
        codec,
        framing,
        done: false,
        gateway,
        _permit: permit,
    };
    let chunks = futures_util::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let item = match s.first.take() {
            Some(first) => first,
            None => s.rows.next_frame().await,
        };
        let mut out = BytesMut::new();
        match item {
            Some(Ok(frame)) => {
                for row in frame.iter() {
                    if let Err(message) = row_json(s.codec, row, &mut out, s.framing) {
                        let err = wirepool::Error::Decode {
                            what: "row",
                            message,
                        };
                        error_event(&err, &mut out, s.framing);
                        s.done = true;
                        break;
                    }
                }
            }
            Some(Err(e)) => {
                error_event(&e, &mut out, s.framing);
                s.done = true;
            }
            None => {
                let summary = match s.rows.summary_bytes() {
                    Some(b) => to_json(s.codec, b).unwrap_or_else(|_| b"null".to_vec()),
                    None => b"null".to_vec(), // the worker sent none
                };
                match s.framing {
                    Framing::Ndjson => {
                        out.put_slice(b"{\"summary\":");
                        out.put_slice(&summary);
                        out.put_slice(b"}\n");
                    }
                    Framing::Sse => {
                        out.put_slice(b"event: summary\ndata: ");
                        out.put_slice(&summary);
                        out.put_slice(b"\n\n");
                    }
                }
                s.done = true;
            }
        }
        let chunk: Bytes = out.freeze();
        Some((Ok::<_, std::convert::Infallible>(Frame::data(chunk)), s))
    });
    let mut resp = Response::new(StreamBody::new(chunks).boxed_unsync());
    *resp.status_mut() = StatusCode::OK;
    let content_type = match framing {
        Framing::Ndjson => "application/x-ndjson",
        Framing::Sse => "text/event-stream",
    };
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// A row (or summary) in the stream's codec as one line of JSON text.
fn to_json(codec: Codec, bytes: &[u8]) -> Result<Vec<u8>, String> {
    if codec == Codec::Json {
        // A raw newline in JSON text can only be whitespace between tokens: one line.
        return Ok(bytes
            .iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b })
            .collect());
    }
    let value: ciborium::Value = codec.decode(bytes).map_err(|e| e.to_string())?;
    serde_json::to_vec(&value).map_err(|e| format!("a row has no JSON form: {e}"))
}

fn row_json(codec: Codec, row: &[u8], out: &mut BytesMut, framing: Framing) -> Result<(), String> {
    let json = to_json(codec, row)?;
    match framing {
        Framing::Ndjson => {
            out.put_slice(&json);
            out.put_u8(b'\n');
        }
        Framing::Sse => {
            out.put_slice(b"data: ");
            out.put_slice(&json);
            out.put_slice(b"\n\n");
        }
    }
    Ok(())
}

/// The last line of a stream that failed after its 200: `{"error": {code, name, message}}`.
fn error_event(err: &wirepool::Error, out: &mut BytesMut, framing: Framing) {
    let body = pool_error_json(err);
    match framing {
        Framing::Ndjson => {
            out.put_slice(b"{\"error\":");
            out.put_slice(&body);
            out.put_slice(b"}\n");
        }
        Framing::Sse => {
            out.put_slice(b"event: error\ndata: ");
            out.put_slice(&body);
            out.put_slice(b"\n\n");
        }
    }
}
