//! Arrow IPC helpers for [`Codec::ArrowIpc`] (cargo feature `arrow`).
//!
//! On the wire an Arrow value is one self-contained Arrow IPC *stream* (schema message, record
//! batches, end-of-stream marker), so any Arrow implementation reads it without agreeing on a
//! schema out of band. The protocol carries it opaquely: a handler declares `ArrowIpc` for its
//! method and sends the bytes made here as a `Bytes` result or row.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! let batch = RecordBatch::try_from_iter([("i", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
//! let mut body = Vec::new();
//! wirepool_codec::arrow::encode_batches(&[batch.clone()], &mut body).unwrap();
//! let back = wirepool_codec::arrow::decode_batches(&body).unwrap();
//! assert_eq!(back, vec![batch]);
//! ```

use arrow_array::RecordBatch;
use bytes::BufMut;

use crate::{Codec, CodecError};

/// Appends one Arrow IPC stream holding `batches` (which must share one schema) to `out`.
/// An empty slice is an error: a stream needs a schema.
pub fn encode_batches<B: BufMut>(batches: &[RecordBatch], out: &mut B) -> Result<(), CodecError> {
    let first = batches
        .first()
        .ok_or_else(|| CodecError::encode(Codec::ArrowIpc, "no record batch to encode"))?;
    let mut writer =
        arrow_ipc::writer::StreamWriter::try_new(out.writer(), first.schema_ref().as_ref())
            .map_err(|e| CodecError::encode(Codec::ArrowIpc, e))?;
    for batch in batches {
        writer
            .write(batch)
            .map_err(|e| CodecError::encode(Codec::ArrowIpc, e))?;
    }
    writer
        .finish()
        .map_err(|e| CodecError::encode(Codec::ArrowIpc, e))
}

/// Reads every record batch of one Arrow IPC stream.
pub fn decode_batches(body: &[u8]) -> Result<Vec<RecordBatch>, CodecError> {
    let reader = arrow_ipc::reader::StreamReader::try_new(body, None)
        .map_err(|e| CodecError::decode(Codec::ArrowIpc, e))?;
    reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CodecError::decode(Codec::ArrowIpc, e))
}
