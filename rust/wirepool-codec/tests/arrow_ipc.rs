//! `encode_batches` writes the very stream arrow-rs's `StreamWriter` writes, byte for byte,
//! whether it lays a batch out itself (flat columns, sliced or not, with or without nulls) or
//! hands it to arrow-rs (nested and dictionary columns); and `decode_batches_shared` reads it
//! back with the arrays pointing into the body.
#![cfg(feature = "arrow")]

use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::*;
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use wirepool_codec::arrow::{decode_batches, decode_batches_shared, encode_batches};

fn reference(batches: &[RecordBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut out, &batches[0].schema()).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap();
    drop(w);
    out
}

fn check(batches: &[RecordBatch]) {
    let mut ours = Vec::new();
    encode_batches(batches, &mut ours).unwrap();
    assert_eq!(
        ours,
        reference(batches),
        "the stream of {:?}",
        batches[0].schema()
    );
    assert_eq!(decode_batches(&ours).unwrap(), batches);
    assert_eq!(decode_batches_shared(ours.into()).unwrap(), batches);
}

fn flat(n: usize) -> RecordBatch {
    let ints: Int64Array = (0..n as i64).map(|i| (i % 7 != 3).then_some(i)).collect();
    let strings: StringArray = (0..n)
        .map(|i| (i % 5 != 1).then(|| format!("decl_{i}")))
        .collect();
    let large: LargeStringArray = (0..n).map(|i| Some("x".repeat(i % 9))).collect();
    let bytes: BinaryArray = (0..n).map(|i| Some(vec![i as u8; i % 4])).collect();
    let bools: BooleanArray = (0..n).map(|i| (i % 3 != 0).then_some(i % 2 == 0)).collect();
    let fixed =
        FixedSizeBinaryArray::try_from_sparse_iter_with_size((0..n).map(|i| Some([i as u8; 3])), 3)
            .unwrap();
    let floats = Float32Array::from_iter_values((0..n).map(|i| i as f32 / 3.0));
    let small = UInt8Array::from_iter_values((0..n).map(|i| i as u8));
    let dates = Date32Array::from_iter_values(0..n as i32);
    let times = TimestampMicrosecondArray::from_iter_values(0..n as i64).with_timezone("UTC");
    let decimals = Decimal128Array::from_iter_values((0..n).map(|i| i as i128 * 1000))
        .with_precision_and_scale(20, 3)
        .unwrap();
    RecordBatch::try_from_iter([
        ("ints", Arc::new(ints) as ArrayRef),
        ("strings", Arc::new(strings) as _),
        ("large", Arc::new(large) as _),
        ("bytes", Arc::new(bytes) as _),
        ("bools", Arc::new(bools) as _),
        ("fixed", Arc::new(fixed) as _),
        ("floats", Arc::new(floats) as _),
        ("small", Arc::new(small) as _),
        ("dates", Arc::new(dates) as _),
        ("times", Arc::new(times) as _),
        ("decimals", Arc::new(decimals) as _),
    ])
    .unwrap()
}

#[test]
fn flat_batches_are_written_as_arrow_rs_writes_them() {
    check(&[flat(1000)]);
    check(&[flat(0)]);
    check(&[flat(1)]);
    // Several batches, and slices (offsets not at 0, booleans not on a byte boundary).
    let b = flat(1003);
    check(&[
        b.slice(0, 10),
        b.slice(13, 500),
        b.slice(517, 486),
        b.slice(1003, 0),
    ]);
}

#[test]
fn nested_and_dictionary_batches_go_through_arrow_rs() {
    let mut list = ListBuilder::new(arrow_array::builder::Int32Builder::new());
    for i in 0..50 {
        for j in 0..(i % 4) {
            list.values().append_value(j);
        }
        list.append(i % 6 != 2);
    }
    let mut dict = StringDictionaryBuilder::<Int32Type>::new();
    for i in 0..50 {
        dict.append_value(["a", "b", "c"][i % 3]);
    }
    let flat = flat(50);
    let nested = RecordBatch::try_from_iter([
        ("list", Arc::new(list.finish()) as ArrayRef),
        ("dict", Arc::new(dict.finish()) as _),
        ("ints", flat.column(0).clone()),
    ])
    .unwrap();
    check(&[nested.clone(), nested.slice(5, 20)]);
    // A non-nullable flat column.
    let schema = Arc::new(Schema::new(vec![Field::new(
        "t",
        DataType::Time64(TimeUnit::Nanosecond),
        false,
    )]));
    let times = RecordBatch::try_new(
        schema,
        vec![Arc::new(Time64NanosecondArray::from_iter_values(0..10))],
    )
    .unwrap();
    check(&[times]);
}

#[test]
fn shared_decoding_points_into_the_body() {
    let mut body = Vec::new();
    encode_batches(&[flat(4096)], &mut body).unwrap();
    let body = bytes::Bytes::from(body);
    let span = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
    let batches = decode_batches_shared(body.clone()).unwrap();
    for column in batches[0].columns() {
        for b in column.to_data().buffers() {
            assert!(
                span.contains(&(b.as_ptr() as usize)),
                "a buffer outside the body"
            );
        }
    }
}
