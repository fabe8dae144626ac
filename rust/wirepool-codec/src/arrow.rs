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
///
/// The stream is the one arrow-rs's `StreamWriter` writes (default options), byte for byte,
/// but the buffers of a batch whose columns are flat (numbers, dates and times, booleans,
/// fixed-size binary, strings and binary; no dictionary) are written into `out` straight from
/// the arrays, once: arrow-rs first gathers a batch's body into a `Vec` of its own (a second
/// copy, and fresh pages each time). Into a worker's `Context::body_buf`, that one copy is the
/// whole cost of handing the batch to the parent. Other batches go through arrow-rs's writer.
pub fn encode_batches<B: BufMut>(batches: &[RecordBatch], out: &mut B) -> Result<(), CodecError> {
    let first = batches
        .first()
        .ok_or_else(|| CodecError::encode(Codec::ArrowIpc, "no record batch to encode"))?;
    let fail = |e: arrow_schema::ArrowError| CodecError::encode(Codec::ArrowIpc, e);
    let options = arrow_ipc::writer::IpcWriteOptions::default();
    let generator = arrow_ipc::writer::IpcDataGenerator::default();
    let mut tracker = arrow_ipc::writer::DictionaryTracker::new(false);
    let schema = generator.schema_to_bytes_with_dictionary_tracker(
        first.schema_ref().as_ref(),
        &mut tracker,
        &options,
    );
    arrow_ipc::writer::write_message(out.writer(), schema, &options).map_err(fail)?;
    for batch in batches {
        if batch.schema_ref() != first.schema_ref() {
            return Err(CodecError::encode(
                Codec::ArrowIpc,
                "the batches of one stream must share one schema",
            ));
        }
        if !direct::write_batch(batch, out) {
            let (dictionaries, message) = generator
                .encoded_batch(batch, &mut tracker, &options)
                .map_err(fail)?;
            for d in dictionaries {
                arrow_ipc::writer::write_message(out.writer(), d, &options).map_err(fail)?;
            }
            arrow_ipc::writer::write_message(out.writer(), message, &options).map_err(fail)?;
        }
    }
    // End of stream: the continuation marker and a zero length (IPC format 1.0, metadata V5).
    out.put_slice(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    Ok(())
}

/// A record batch message written without gathering its body first (see [`encode_batches`]).
mod direct {
    use arrow_array::RecordBatch;
    use arrow_buffer::Buffer;
    use arrow_data::ArrayData;
    use arrow_schema::DataType;
    use bytes::BufMut;

    /// Whether this writer lays `data` out itself (flat, not a dictionary).
    fn flat(data: &ArrayData) -> bool {
        let t = data.data_type();
        data.child_data().is_empty()
            && (matches!(
                t,
                DataType::Boolean
                    | DataType::Utf8
                    | DataType::Binary
                    | DataType::LargeUtf8
                    | DataType::LargeBinary
                    | DataType::FixedSizeBinary(_)
            ) || ((t.is_numeric() || t.is_temporal()) && data.buffers().len() == 1))
    }

    /// Bytes `offset .. offset + len + 1` of an offsets buffer of `O`, re-based to start at 0
    /// (arrow-rs's rule: as they are when they start at 0, else copied), and the range of the
    /// values they cover.
    fn offsets<O: arrow_array::OffsetSizeTrait>(data: &ArrayData) -> (Buffer, usize, usize) {
        let all: &[O] = data.buffers()[0].typed_data::<O>();
        let mine = &all[data.offset()..data.offset() + data.len() + 1];
        let (start, end) = (mine[0].as_usize(), mine[data.len()].as_usize());
        let rebased = if start == 0 {
            let size = std::mem::size_of::<O>();
            data.buffers()[0].slice_with_length(data.offset() * size, (data.len() + 1) * size)
        } else {
            mine.iter().map(|x| *x - mine[0]).collect()
        };
        (rebased, start, end - start)
    }

    /// The buffers arrow-rs writes for `data`, in order (its `write_array_data` for the flat
    /// types).
    fn buffers_of(data: &ArrayData, out: &mut Vec<Buffer>) {
        let len = data.len();
        out.push(match data.nulls() {
            Some(nulls) => nulls.inner().sliced(),
            None => {
                let n = (len + 7) / 8;
                arrow_buffer::MutableBuffer::new(n)
                    .with_bitset(n, true)
                    .into()
            }
        });
        match data.data_type() {
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary
                if len == 0 =>
            {
                out.push(Buffer::from_vec(Vec::<u8>::new()));
                out.push(Buffer::from_vec(Vec::<u8>::new()));
            }
            DataType::Utf8 | DataType::Binary => {
                let (o, start, n) = offsets::<i32>(data);
                out.push(o);
                out.push(data.buffers()[1].slice_with_length(start, n));
            }
            DataType::LargeUtf8 | DataType::LargeBinary => {
                let (o, start, n) = offsets::<i64>(data);
                out.push(o);
                out.push(data.buffers()[1].slice_with_length(start, n));
            }
            DataType::Boolean => out.push(data.buffers()[0].bit_slice(data.offset(), len)),
            t => {
                let width = match t {
                    DataType::FixedSizeBinary(w) => *w as usize,
                    t => t.primitive_width().unwrap_or(0),
                };
                let buffer = &data.buffers()[0];
                let from = data.offset() * width;
                let n = (len * width).min(buffer.len().saturating_sub(from));
                out.push(buffer.slice_with_length(from, n));
            }
        }
    }

    fn pad(len: usize, alignment: usize) -> usize {
        (len + alignment - 1) / alignment * alignment - len
    }

    /// Writes `batch` as one IPC message into `out` when every column is flat; `false` (and
    /// nothing written) otherwise.
    /// Laid out as with `IpcWriteOptions::default()`: metadata V5, 64-byte alignment, no
    /// compression.
    pub(super) fn write_batch<B: BufMut>(batch: &RecordBatch, out: &mut B) -> bool {
        let columns: Vec<ArrayData> = batch.columns().iter().map(|c| c.to_data()).collect();
        if !columns.iter().all(flat) {
            return false;
        }
        let alignment = 64usize;
        let mut body: Vec<Buffer> = Vec::new();
        let mut nodes = Vec::with_capacity(columns.len());
        for data in &columns {
            nodes.push(arrow_ipc::FieldNode::new(
                data.len() as i64,
                data.null_count() as i64,
            ));
            buffers_of(data, &mut body);
        }
        let mut specs = Vec::with_capacity(body.len());
        let mut at = 0usize;
        for b in &body {
            specs.push(arrow_ipc::Buffer::new(at as i64, b.len() as i64));
            at += b.len() + pad(b.len(), alignment);
        }
        let body_len = at;

        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let buffers = fbb.create_vector(&specs);
        let nodes = fbb.create_vector(&nodes);
        let header = {
            let mut rb = arrow_ipc::RecordBatchBuilder::new(&mut fbb);
            rb.add_length(batch.num_rows() as i64);
            rb.add_nodes(nodes);
            rb.add_buffers(buffers);
            rb.finish().as_union_value()
        };
        let mut message = arrow_ipc::MessageBuilder::new(&mut fbb);
        message.add_version(arrow_ipc::MetadataVersion::V5);
        message.add_header_type(arrow_ipc::MessageHeader::RecordBatch);
        message.add_bodyLength(body_len as i64);
        message.add_header(header);
        let root = message.finish();
        fbb.finish(root, None);
        let meta = fbb.finished_data();

        // As arrow-rs's write_message: marker, the padded metadata length, metadata, padding.
        let aligned = (meta.len() + 8 + alignment - 1) / alignment * alignment;
        const ZEROS: [u8; 64] = [0; 64];
        out.put_slice(&[0xff; 4]);
        out.put_slice(&((aligned - 8) as i32).to_le_bytes());
        out.put_slice(meta);
        out.put_slice(&ZEROS[..aligned - 8 - meta.len()]);
        for b in &body {
            out.put_slice(b.as_slice());
            out.put_slice(&ZEROS[..pad(b.len(), alignment)]);
        }
        true
    }
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
///
/// Trust: the checks made here (offsets, UTF-8 of string columns) hold for the bytes as they
/// are now. A body on the shared-memory lane stays mapped in the worker too, and sealing stops
/// it from shrinking, not from being written: a worker that writes into a range it has lent
/// (which PROTOCOL.md 20.4 forbids) could invalidate them after the fact. For a worker you do
/// not trust, use [`decode_batches`], which copies the batch out first.
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
