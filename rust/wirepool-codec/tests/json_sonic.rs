//! The `json-sonic` encoder writes exactly serde_json's bytes (and fails where serde_json fails):
//! every value here is encoded by `Codec::Json` (long strings escaped by sonic-rs) and by
//! `serde_json::to_vec` and the two compared.
#![cfg(feature = "json-sonic")]

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde::Serialize;
use serde_json::value::RawValue;
use wirepool_codec::Codec;

#[track_caller]
fn same<T: Serialize + ?Sized + std::fmt::Debug>(value: &T) {
    let ours = Codec::Json.to_vec(value);
    match serde_json::to_vec(value) {
        Ok(want) => assert_eq!(
            String::from_utf8_lossy(ours.as_ref().expect("encodes")),
            String::from_utf8_lossy(&want),
            "{value:?}"
        ),
        Err(e) => assert!(
            ours.is_err(),
            "{value:?}: serde_json fails ({e}), we wrote {ours:?}"
        ),
    }
}

#[test]
fn every_escape_and_character_class() {
    let mut chars: Vec<char> = (0u32..0x800).filter_map(char::from_u32).collect();
    chars.extend([
        '\u{2028}',
        '\u{2029}',
        '\u{feff}',
        '\u{ffff}',
        '\u{10ffff}',
        '\u{1f600}',
    ]);
    let long = "x".repeat(70);
    for c in chars {
        same(&c.to_string());
        same(&c);
        // Inside and at both ends of a run longer than a SIMD block.
        same(&format!("{long}{c}{long}"));
        same(&format!("{c}{long}{c}"));
    }
    same(&"\"\\/\u{8}\u{c}\n\r\t\u{0}\u{1f}\u{7f}".repeat(20));
    same(&"");
}

#[test]
fn floats_and_integers_at_their_edges() {
    for v in [
        0.0,
        -0.0,
        0.1,
        1.0,
        -1.5,
        1e21,
        1e22,
        1e-7,
        123456789012345680.0,
        5e-324,
        f64::MIN_POSITIVE,
        f64::MAX,
        f64::MIN,
        f64::EPSILON,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ] {
        same(&v);
        same(&(v as f32));
        same(&[v, v]);
    }
    same(&(i64::MIN, i64::MAX, u64::MAX, 0u8, -1i8, i16::MIN, u32::MAX));
    same(&(i128::from(i64::MIN), u128::from(u64::MAX)));
    // Outside 64 bits: an error either way (the message is the codec's: tests/codecs.rs).
    assert!(Codec::Json.to_vec(&(1u128 << 64)).is_err());
    assert!(Codec::Json.to_vec(&[i128::MIN]).is_err());
}

#[derive(Serialize, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    A,
    B,
}

#[derive(Serialize, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct NewKey(u16);

#[derive(Serialize, Debug)]
enum E {
    Unit,
    Newtype(String),
    Tuple(u8, Option<bool>),
    Struct { a: Vec<u8>, b: () },
}

#[derive(Serialize, Debug)]
struct Row {
    i: u64,
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    missing: Option<u8>,
    #[serde(with = "serde_bytes")]
    bytes: Vec<u8>,
    #[serde(flatten)]
    extra: BTreeMap<String, E>,
    tuple: (u8, (), Option<String>),
}

#[derive(Serialize, Debug)]
struct Unit;

/// Serialises with `collect_str` (as `Display` types with serde's `collect_str` helper do).
#[derive(Debug)]
struct Shown(&'static str);

impl Serialize for Shown {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self.0)
    }
}

#[test]
fn every_shape_of_the_serde_data_model() {
    let extra: BTreeMap<String, E> = [
        ("u".into(), E::Unit),
        ("n".into(), E::Newtype("q\"".into())),
        ("t".into(), E::Tuple(1, None)),
        (
            "s".into(),
            E::Struct {
                a: vec![1, 2],
                b: (),
            },
        ),
    ]
    .into_iter()
    .collect();
    same(&Row {
        i: 7,
        name: "decl_7".into(),
        missing: None,
        bytes: vec![0, 255],
        extra,
        tuple: (1, (), Some("\u{1}".into())),
    });
    same(&Unit);
    same(&());
    same(&Some(Some(3)));
    same(&None::<u8>);
    same(&Vec::<u8>::new());
    same(&BTreeMap::<String, u8>::new());
    same(&Shown("tab\there \"quoted\""));
    same(&serde_json::json!({"a": [1, 2.5, null, true, "x"], "b": {"c": {}}}));
    same(&bytes::Bytes::from_static(b"\x00\x01"));
}

#[test]
fn map_keys_of_every_kind_succeed_or_fail_as_in_serde_json() {
    same(&[(true, 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(&[(-3i32, 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(&[(u64::MAX, 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(
        &[(i128::from(i64::MIN), 1)]
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
    );
    let big_key: BTreeMap<_, _> = [(i128::MIN, 1)].into_iter().collect();
    assert!(Codec::Json.to_vec(&big_key).is_err());
    same(&[('\n', 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(
        &[(Key::A, 1), (Key::B, 2)]
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
    );
    same(&[(NewKey(4), 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(&[((), 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(&[(Some(1), 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(&[(None::<u8>, 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(&[((1, 2), 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(&[(vec![1u8], 1)].into_iter().collect::<BTreeMap<_, _>>());
    same(
        &[("k\u{0}\"".to_string(), 1)]
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
    );
    for key in [1.5, -0.0, 1e21, f64::NAN, f64::INFINITY] {
        same(&FloatKey(key));
    }
}

/// A map with one float key (`f64` is not `Ord`, so not a `BTreeMap` key).
#[derive(Debug)]
struct FloatKey(f64);

impl Serialize for FloatKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(&self.0, &1)?;
        m.end()
    }
}

#[test]
fn raw_values_are_written_as_serde_json_writes_them() {
    let raw = RawValue::from_string(r#"{ "kept":  "as is" }"#.into()).unwrap();
    same(&raw);
    same(&[Some(&raw)]);
    #[derive(Serialize, Debug)]
    struct Request<'a> {
        body: &'a RawValue,
        n: u8,
    }
    same(&Request { body: &raw, n: 1 });
    let mut out = Vec::new();
    Codec::Json
        .encode(&Request { body: &raw, n: 1 }, &mut out)
        .unwrap();
    assert_eq!(out, br#"{"body":{ "kept":  "as is" },"n":1}"#);
}

#[test]
fn appends_to_the_callers_buffer_at_any_size() {
    let mut out = bytes::BytesMut::from(&b"head"[..]);
    Codec::Json.encode(&"x".repeat(5000), &mut out).unwrap();
    assert_eq!(&out[..5], b"head\"");
    assert_eq!(out.len(), 4 + 5002);
    // A value far above the kept scratch size, then a small one: both right.
    let big = "\u{1}".repeat(300_000);
    same(&big);
    same(&"small");
}

proptest! {
    #[test]
    fn random_strings_and_rows(s in any::<String>(), v in any::<Vec<(String, i64, f64)>>()) {
        same(&s);
        same(&v);
    }
}
