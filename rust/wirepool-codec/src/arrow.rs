//! Arrow IPC helpers for [`Codec::ArrowIpc`] (cargo feature `arrow`).
//!
//! On the wire an Arrow value is one self-contained Arrow IPC *stream* (schema message, record
//! batches, end-of-stream marker), so any Arrow implementation reads it without agreeing on a
//! schema out of band. The protocol carries it opaquely: a handler declares `ArrowIpc` for its
//! method and sends the bytes made here as a `Bytes` result or row.
//!
//! A large batch moves best through the shared-memory lane without a copy: written into a
//! worker's `Context::body_buf` sized with [`encoded_len_hint`] (the region the parent then
//! maps), and read on the other side with [`decode_batches_shared`], whose arrays point into
//! the received body instead of copies of it.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! let batch = RecordBatch::try_from_iter([("i", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
//! let mut body = Vec::new();
//! wirepool_codec::arrow::encode_batches(&[batch.clone()], &mut body).unwrap();
//! let back = wirepool_codec::arrow::decode_batches(&body).unwrap();
//! assert_eq!(back, vec![batch.clone()]);
//!
//! // Zero-copy decode: the arrays are views of the body.
//! let body = bytes::Bytes::from(body);
//! let shared = wirepool_codec::arrow::decode_batches_shared(body.clone()).unwrap();
//! assert_eq!(shared, vec![batch]);
//! let values = shared[0].column(0).to_data().buffers()[0].as_ptr() as usize;
//! assert!((body.as_ptr() as usize..body.as_ptr() as usize + body.len()).contains(&values));
//! ```

use arrow_array::{Array, RecordBatch};
use bytes::{BufMut, Bytes};

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

/// Reads every record batch of one Arrow IPC stream held in `body` without copying it: the
/// arrays' buffers are slices of `body` (which they keep alive), so a body that is a view of a
/// shared-memory region is read in place. A buffer the stream does not align for its type is
/// copied (arrow-rs's rule); streams written by arrow-rs or pyarrow are aligned.
pub fn decode_batches_shared(body: Bytes) -> Result<Vec<RecordBatch>, CodecError> {
    let mut decoder = arrow_ipc::reader::StreamDecoder::new();
    let mut buffer = arrow_buffer::Buffer::from(body);
    let mut out = Vec::new();
    while !buffer.is_empty() {
        match decoder
            .decode(&mut buffer)
            .map_err(|e| CodecError::decode(Codec::ArrowIpc, e))?
        {
            Some(batch) => out.push(batch),
            None if buffer.is_empty() => break,
            None => {}
        }
    }
    decoder
        .finish()
        .map_err(|e| CodecError::decode(Codec::ArrowIpc, e))?;
    Ok(out)
}

/// A capacity for the IPC stream of `batches` that is rarely exceeded (the arrays' memory, at
/// least the bytes written, plus room for the metadata and the padding of each buffer): what
/// to ask of a `BodyBuf`, so the stream is written into it without growing it.
pub fn encoded_len_hint(batches: &[RecordBatch]) -> usize {
    let mut n = 8 << 10;
    for batch in batches {
        n += 1 << 10;
        for column in batch.columns() {
            n += column.get_array_memory_size() + 512;
        }
    }
    n
}
