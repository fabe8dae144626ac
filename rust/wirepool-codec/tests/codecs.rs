use bytes::Bytes;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use wirepool_codec::{Codec, CodecErrorKind};

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Decl {
    i: u64,
    name: String,
    kind: String,
}

/// The serde codecs compiled into this build (tests run with and without default features).
fn typed() -> Vec<Codec> {
    Codec::available()
        .into_iter()
        .filter(|c| !c.is_opaque())
        .collect()
}

#[test]
fn ids_round_trip_and_reserved_ids_are_unknown() {
    for id in 0..=255u8 {
        match Codec::from_id(id) {
            Some(c) => assert_eq!(c.id(), id),
            None => assert!((6..128).contains(&id), "id {id} should be known"),
        }
    }
    assert_eq!(Codec::from_id(1), Some(Codec::Json));
    assert_eq!(Codec::from_id(200), Some(Codec::Private(200)));
}

#[cfg(feature = "json")]
#[test]
fn json_rows_match_the_shape_every_language_reads() {
    let row = Decl {
        i: 3,
        name: "decl_3".into(),
        kind: "theorem".into(),
    };
    assert_eq!(
        Codec::Json.to_vec(&row).unwrap(),
        br#"{"i":3,"name":"decl_3","kind":"theorem"}"#
    );
}

#[cfg(feature = "msgpack")]
#[test]
fn msgpack_writes_structs_as_maps() {
    let row = Decl {
        i: 1,
        name: "a".into(),
        kind: "b".into(),
    };
    let body = Codec::MsgPack.to_vec(&row).unwrap();
    assert_eq!(body[0], 0x83, "fixmap of 3 entries");
}

#[test]
fn encode_appends_to_the_callers_buffer() {
    let mut frame = b"HEADER".to_vec();
    Codec::Raw.encode("42", &mut frame).unwrap();
    assert_eq!(frame, b"HEADER42");
    let mut frame = bytes::BytesMut::from(&b"H"[..]);
    Codec::Raw
        .encode(&Bytes::from_static(b"xyz"), &mut frame)
        .unwrap();
    assert_eq!(&frame[..], b"Hxyz");
}

#[test]
fn raw_decode_of_bytes_shares_the_buffer() {
    let body = Bytes::from(vec![1u8, 2, 3, 4]);
    for codec in [
        Codec::Raw,
        Codec::ArrowIpc,
        Codec::Protobuf,
        Codec::Private(130),
    ] {
        let out: Bytes = codec.decode_bytes(body.clone()).unwrap();
        assert_eq!(out.as_ptr(), body.as_ptr());
    }
}

#[test]
fn encode_bytes_passes_bytes_through_opaque_codecs() {
    let body = Bytes::from(vec![9u8; 10_000]);
    let out = Codec::Raw.encode_bytes(body.clone()).unwrap();
    assert_eq!(out.as_ptr(), body.as_ptr());
    let out = Codec::Raw.encode_bytes(String::from("abc")).unwrap();
    assert_eq!(&out[..], b"abc");
}

#[test]
fn encoded_passes_through_every_codec() {
    let body = Bytes::from_static(b"\x93\x01\x02\x03");
    for codec in Codec::available() {
        let value: wirepool_codec::Encoded = codec.decode_bytes(body.clone()).unwrap();
        assert_eq!(value.0.as_ptr(), body.as_ptr());
        let out = codec.encode_bytes(value).unwrap();
        assert_eq!(out.as_ptr(), body.as_ptr());
    }
}

#[test]
fn raw_carries_every_byte_like_type() {
    let payload = vec![0u8, 255, 7];
    for body in [
        Codec::Raw.to_vec(&payload).unwrap(),
        Codec::Raw
            .to_vec(&serde_bytes::ByteBuf::from(payload.clone()))
            .unwrap(),
        Codec::Raw.to_vec(&Bytes::from(payload.clone())).unwrap(),
        Codec::Raw.to_vec(payload.as_slice()).unwrap(),
    ] {
        assert_eq!(body, payload);
    }
    let v: Vec<u8> = Codec::Raw.decode(&payload).unwrap();
    assert_eq!(v, payload);
    let b: serde_bytes::ByteBuf = Codec::Raw.decode(&payload).unwrap();
    assert_eq!(b.into_vec(), payload);
    let s: String = Codec::Raw.decode(b"hello").unwrap();
    assert_eq!(s, "hello");
    let () = Codec::Raw.decode(b"").unwrap();
}

#[test]
fn missing_codecs_say_so() {
    for codec in [Codec::Json, Codec::MsgPack, Codec::Cbor] {
        let result = codec.to_vec(&1u8);
        if codec.is_available() {
            assert!(result.is_ok());
        } else {
            assert_eq!(result.unwrap_err().kind(), CodecErrorKind::Unavailable);
        }
    }
}

#[test]
fn raw_refuses_structured_values_with_a_clear_error() {
    let row = Decl {
        i: 1,
        name: "a".into(),
        kind: "b".into(),
    };
    let err = Codec::Raw.to_vec(&row).unwrap_err();
    assert_eq!(err.kind(), CodecErrorKind::Encode);
    assert!(err.message().contains("bytes only"), "{err}");
    let err = Codec::Raw.decode::<Decl>(b"xx").unwrap_err();
    assert_eq!(err.kind(), CodecErrorKind::Decode);
    assert!(Codec::Raw.decode::<String>(&[0xff, 0xfe]).is_err());
    assert!(Codec::Raw.decode::<()>(b"x").is_err());
}

#[test]
fn trailing_bytes_after_a_value_are_a_decode_error() {
    for codec in typed() {
        let mut body = codec.to_vec("five").unwrap();
        body.extend_from_slice(&codec.to_vec("six").unwrap());
        let err = codec.decode::<String>(&body).unwrap_err();
        assert_eq!(err.kind(), CodecErrorKind::Decode, "{codec}");
    }
}

#[test]
fn garbage_is_a_decode_error_not_a_panic() {
    for codec in typed() {
        assert!(
            codec.decode::<Decl>(&[0xc1, 0xff, 0x00]).is_err(),
            "{codec}"
        );
        assert!(codec.decode::<Decl>(&[]).is_err(), "{codec}");
    }
}

#[test]
fn json_with_invalid_utf8_is_a_decode_error() {
    // JSON text is UTF-8: a bad byte in a string (or anywhere) is refused, not read as Latin-1.
    for body in [
        &b"{\"i\":1,\"name\":\"d\xff\",\"kind\":\"t\"}"[..],
        b"{\"i\":1,\"name\":\"d\",\"kind\":\"t\"}\xc3",
    ] {
        let e = Codec::Json.decode::<Decl>(body).unwrap_err();
        assert_eq!(e.kind(), wirepool_codec::CodecErrorKind::Decode, "{e}");
    }
    let ok: Decl = Codec::Json
        .decode("{\"i\":1,\"name\":\"d\\u00e9\u{e9}\",\"kind\":\"t\"}".as_bytes())
        .unwrap();
    assert_eq!(ok.name, "d\u{e9}\u{e9}");
}

proptest! {
    #[test]
    fn typed_codecs_round_trip(i in any::<u64>(), name in ".{0,40}", kind in ".{0,10}") {
        let row = Decl { i, name, kind };
        for codec in typed() {
            let body = codec.to_vec(&row).unwrap();
            let back: Decl = codec.decode(&body).unwrap();
            prop_assert_eq!(&back, &row);
            let back: Decl = codec.decode_bytes(Bytes::from(body)).unwrap();
            prop_assert_eq!(&back, &row);
        }
    }

    #[test]
    fn raw_round_trips_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let body = Codec::Raw.to_vec(&Bytes::from(data.clone())).unwrap();
        prop_assert_eq!(&body, &data);
        let back: Vec<u8> = Codec::Raw.decode(&body).unwrap();
        prop_assert_eq!(back, data);
    }

    #[test]
    fn decoders_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        for codec in typed() {
            let _ = codec.decode::<Decl>(&data);
            let _ = codec.decode::<serde_json::Value>(&data);
        }
    }
}

#[cfg(feature = "arrow")]
#[test]
fn arrow_batches_round_trip_and_garbage_fails() {
    use arrow_array::{Int64Array, RecordBatch, StringArray};
    use std::sync::Arc;
    let batch = RecordBatch::try_from_iter([
        ("i", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
        (
            "name",
            Arc::new(StringArray::from(vec!["a", "b", "c"])) as _,
        ),
    ])
    .unwrap();
    let mut body = Vec::new();
    wirepool_codec::arrow::encode_batches(&[batch.clone(), batch.clone()], &mut body).unwrap();
    assert_eq!(
        wirepool_codec::arrow::decode_batches(&body).unwrap(),
        vec![batch.clone(), batch]
    );
    assert!(wirepool_codec::arrow::decode_batches(b"not arrow").is_err());
    assert!(wirepool_codec::arrow::encode_batches(&[], &mut body).is_err());
}

/// JSON and MessagePack refuse integers outside the 64-bit range (PROTOCOL.md 22.4) wherever
/// they sit in the value (rmp_serde alone writes a `u128` as 16 bytes of binary); a 128-bit
/// value that fits 64 bits encodes as its 64-bit self.
#[test]
fn integers_outside_64_bits_are_refused_in_json_and_msgpack() {
    #[derive(Serialize)]
    struct Outer {
        ok: u64,
        inner: Vec<Option<std::collections::BTreeMap<String, (u8, i128)>>>,
    }
    #[derive(Serialize)]
    enum E {
        Newtype(u128),
        Struct { v: i128 },
    }
    let nested = |v: i128| Outer {
        ok: 1,
        inner: vec![
            None,
            Some([("k".to_string(), (1, v))].into_iter().collect()),
        ],
    };
    for codec in typed()
        .into_iter()
        .filter(|c| matches!(c, Codec::Json | Codec::MsgPack))
    {
        for bad in [
            codec.to_vec(&(1u128 << 64)).err(),
            codec.to_vec(&(i128::from(i64::MIN) - 1)).err(),
            codec.to_vec(&nested(i128::from(u64::MAX) + 1)).err(),
            codec.to_vec(&E::Newtype(u128::MAX)).err(),
            codec.to_vec(&E::Struct { v: i128::MIN }).err(),
            codec.to_vec(&Some(vec![[1u128 << 64]])).err(),
        ] {
            let e = bad.unwrap_or_else(|| panic!("{codec:?} sent an integer above 64 bits"));
            assert_eq!(e.kind(), CodecErrorKind::Encode, "{codec:?}: {e}");
            assert!(e.to_string().contains("64-bit"), "{codec:?}: {e}");
        }
        assert_eq!(
            codec.to_vec(&u128::from(u64::MAX)).unwrap(),
            codec.to_vec(&u64::MAX).unwrap()
        );
        assert_eq!(
            codec.to_vec(&i128::from(i64::MIN)).unwrap(),
            codec.to_vec(&i64::MIN).unwrap()
        );
        assert_eq!(
            codec.to_vec(&nested(-5)).unwrap(),
            codec.to_vec(&nested(-5)).unwrap()
        );
        let back: u64 = codec.decode(&codec.to_vec(&7u128).unwrap()).unwrap();
        assert_eq!(back, 7);
    }
}
