//! `Codec::MsgPack.decode` gives exactly what rmp_serde gives (the codec's own deserializer for
//! the common values, rmp_serde for the rest): the same value, made by the same visitor calls,
//! or the same error, on well-formed, mutated, truncated and random bytes.
#![cfg(feature = "msgpack")]

use std::collections::BTreeMap;
use std::fmt;

use proptest::prelude::*;
use serde::de::{self, DeserializeOwned, Deserializer, IgnoredAny, Visitor};
use serde::{Deserialize, Serialize};
use wirepool_codec::Codec;

/// The decode of `Codec::MsgPack` before the codec had its own deserializer.
fn reference<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let fail = |e: &dyn fmt::Display| format!("cannot decode with codec msgpack: {e}");
    let mut de = rmp_serde::Deserializer::from_read_ref(body);
    let value = T::deserialize(&mut de).map_err(|e| fail(&e))?;
    match IgnoredAny::deserialize(&mut de) {
        Err(rmp_serde::decode::Error::InvalidMarkerRead(e))
            if e.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            Ok(value)
        }
        _ => Err(fail(&"bytes left after the value")),
    }
}

fn same<T: DeserializeOwned + fmt::Debug>(body: &[u8]) -> Result<(), TestCaseError> {
    let got = Codec::MsgPack.decode::<T>(body).map_err(|e| e.to_string());
    let want = reference::<T>(body);
    // Debug text: equal for NaN too, and shows what differs.
    prop_assert_eq!(
        format!("{got:?}"),
        format!("{want:?}"),
        "body {:02x?}",
        body
    );
    Ok(())
}

/// Every visitor call, in order, with what it was given (compared through `Debug`).
#[derive(Debug)]
#[allow(dead_code)]
enum Trace {
    Unit,
    None,
    Some(Box<Trace>),
    Newtype(Box<Trace>),
    Bool(bool),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    F32(u32),
    F64(u64),
    Char(char),
    Str(String),
    BorrowedStr(String),
    StringOwned(String),
    Bytes(Vec<u8>),
    BorrowedBytes(Vec<u8>),
    ByteBuf(Vec<u8>),
    Seq(Option<usize>, Vec<Trace>),
    Map(Option<usize>, Vec<(Trace, Trace)>),
}

struct TraceVisitor;

impl<'de> Visitor<'de> for TraceVisitor {
    type Value = Trace;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }
    fn visit_unit<E>(self) -> Result<Trace, E> {
        Ok(Trace::Unit)
    }
    fn visit_none<E>(self) -> Result<Trace, E> {
        Ok(Trace::None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Trace, D::Error> {
        Ok(Trace::Some(Box::new(d.deserialize_any(TraceVisitor)?)))
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Trace, D::Error> {
        Ok(Trace::Newtype(Box::new(d.deserialize_any(TraceVisitor)?)))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Trace, E> {
        Ok(Trace::Bool(v))
    }
    fn visit_u8<E>(self, v: u8) -> Result<Trace, E> {
        Ok(Trace::U8(v))
    }
    fn visit_u16<E>(self, v: u16) -> Result<Trace, E> {
        Ok(Trace::U16(v))
    }
    fn visit_u32<E>(self, v: u32) -> Result<Trace, E> {
        Ok(Trace::U32(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Trace, E> {
        Ok(Trace::U64(v))
    }
    fn visit_i8<E>(self, v: i8) -> Result<Trace, E> {
        Ok(Trace::I8(v))
    }
    fn visit_i16<E>(self, v: i16) -> Result<Trace, E> {
        Ok(Trace::I16(v))
    }
    fn visit_i32<E>(self, v: i32) -> Result<Trace, E> {
        Ok(Trace::I32(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Trace, E> {
        Ok(Trace::I64(v))
    }
    fn visit_f32<E>(self, v: f32) -> Result<Trace, E> {
        Ok(Trace::F32(v.to_bits()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Trace, E> {
        Ok(Trace::F64(v.to_bits()))
    }
    fn visit_char<E>(self, v: char) -> Result<Trace, E> {
        Ok(Trace::Char(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Trace, E> {
        Ok(Trace::Str(v.to_owned()))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Trace, E> {
        Ok(Trace::BorrowedStr(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Trace, E> {
        Ok(Trace::StringOwned(v))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<Trace, E> {
        Ok(Trace::Bytes(v.to_vec()))
    }
    fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Trace, E> {
        Ok(Trace::BorrowedBytes(v.to_vec()))
    }
    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Trace, E> {
        Ok(Trace::ByteBuf(v))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<Trace, A::Error> {
        let hint = a.size_hint();
        let mut items = Vec::new();
        while let Some(t) = a.next_element()? {
            items.push(t);
        }
        Ok(Trace::Seq(hint, items))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut a: A) -> Result<Trace, A::Error> {
        let hint = a.size_hint();
        let mut items = Vec::new();
        while let Some(kv) = a.next_entry()? {
            items.push(kv);
        }
        Ok(Trace::Map(hint, items))
    }
}

impl<'de> Deserialize<'de> for Trace {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Trace, D::Error> {
        d.deserialize_any(TraceVisitor)
    }
}

/// The same visitor asked for through each typed entry point.
macro_rules! traced_as {
    ($name:ident, $method:ident $(, $arg:expr)*) => {
        #[derive(Debug)]
        #[allow(dead_code)]
        struct $name(Trace);
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                d.$method($($arg,)* TraceVisitor).map($name)
            }
        }
    };
}
traced_as!(AsSeq, deserialize_seq);
traced_as!(AsStruct, deserialize_struct, "S", &["a", "b"]);
traced_as!(AsTuple, deserialize_tuple, 2);
traced_as!(AsOption, deserialize_option);
traced_as!(AsUnitStruct, deserialize_unit_struct, "U");
traced_as!(AsNewtype, deserialize_newtype_struct, "N");
traced_as!(AsExt, deserialize_newtype_struct, "_ExtStruct");
traced_as!(AsU16, deserialize_u16);
traced_as!(AsF64, deserialize_f64);
traced_as!(AsBool, deserialize_bool);
traced_as!(AsI128, deserialize_i128);

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Kind {
    Theorem,
    Lemma(u32),
    Def { arity: u8, name: String },
    Pair(i16, bool),
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Unit;

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Row {
    i: u64,
    name: String,
    kind: Kind,
    score: Option<f64>,
    tags: Vec<String>,
    #[serde(with = "serde_bytes")]
    blob: Vec<u8>,
    neg: i32,
    small: Option<Option<u8>>,
    attrs: BTreeMap<String, i64>,
    pair: (char, bool),
    unit: Unit,
    #[serde(default)]
    missing_ok: u16,
}

/// Decodes `body` as every target type.
fn all_targets(body: &[u8]) -> Result<(), TestCaseError> {
    same::<Trace>(body)?;
    same::<AsSeq>(body)?;
    same::<AsStruct>(body)?;
    same::<AsTuple>(body)?;
    same::<AsOption>(body)?;
    same::<AsUnitStruct>(body)?;
    same::<AsNewtype>(body)?;
    same::<AsExt>(body)?;
    same::<AsU16>(body)?;
    same::<AsF64>(body)?;
    same::<AsBool>(body)?;
    same::<AsI128>(body)?;
    same::<Row>(body)?;
    same::<Kind>(body)?;
    same::<Vec<Kind>>(body)?;
    same::<Option<Kind>>(body)?;
    same::<String>(body)?;
    same::<serde_bytes::ByteBuf>(body)?;
    same::<Vec<u8>>(body)?;
    same::<(u8, String)>(body)?;
    same::<Vec<Option<i16>>>(body)?;
    same::<BTreeMap<String, Trace>>(body)?;
    same::<u64>(body)?;
    same::<i8>(body)?;
    same::<f32>(body)?;
    same::<char>(body)?;
    same::<Unit>(body)?;
    same::<IgnoredAny>(body)?;
    Ok(())
}

/// A MessagePack value with the marker chosen freely (non-minimal widths included).
#[derive(Debug, Clone)]
enum Gen {
    Nil,
    Bool(bool),
    Uint(u64, u8),
    Int(i64, u8),
    F32(f32),
    F64(f64),
    Str(Vec<u8>, u8),
    Bin(Vec<u8>, u8),
    Arr(Vec<Gen>, u8),
    Map(Vec<(Gen, Gen)>, u8),
    Ext(i8, Vec<u8>, u8),
    Reserved,
}

fn write(g: &Gen, out: &mut Vec<u8>) {
    fn len_marker(out: &mut Vec<u8>, len: usize, w: u8, fix: Option<(u8, usize)>, wide: [u8; 3]) {
        match (w % 4, fix) {
            (0, Some((base, max))) if len <= max => out.push(base | len as u8),
            (0 | 1, _) if len <= 0xff && wide[0] != 0 => out.extend([wide[0], len as u8]),
            (0..=2, _) if len <= 0xffff => {
                out.push(wide[1]);
                out.extend((len as u16).to_be_bytes());
            }
            _ => {
                out.push(wide[2]);
                out.extend((len as u32).to_be_bytes());
            }
        }
    }
    match g {
        Gen::Nil => out.push(0xc0),
        Gen::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Gen::Uint(v, w) => match w % 5 {
            0 if *v < 128 => out.push(*v as u8),
            1 if *v <= 0xff => out.extend([0xcc, *v as u8]),
            2 if *v <= 0xffff => {
                out.push(0xcd);
                out.extend((*v as u16).to_be_bytes());
            }
            3 if *v <= 0xffff_ffff => {
                out.push(0xce);
                out.extend((*v as u32).to_be_bytes());
            }
            _ => {
                out.push(0xcf);
                out.extend(v.to_be_bytes());
            }
        },
        Gen::Int(v, w) => match w % 5 {
            0 if (-32..0).contains(v) => out.push(*v as i8 as u8),
            1 if i8::try_from(*v).is_ok() => out.extend([0xd0, *v as i8 as u8]),
            2 if i16::try_from(*v).is_ok() => {
                out.push(0xd1);
                out.extend((*v as i16).to_be_bytes());
            }
            3 if i32::try_from(*v).is_ok() => {
                out.push(0xd2);
                out.extend((*v as i32).to_be_bytes());
            }
            _ => {
                out.push(0xd3);
                out.extend(v.to_be_bytes());
            }
        },
        Gen::F32(v) => {
            out.push(0xca);
            out.extend(v.to_be_bytes());
        }
        Gen::F64(v) => {
            out.push(0xcb);
            out.extend(v.to_be_bytes());
        }
        Gen::Str(s, w) => {
            len_marker(out, s.len(), *w, Some((0xa0, 31)), [0xd9, 0xda, 0xdb]);
            out.extend(s);
        }
        Gen::Bin(b, w) => {
            len_marker(out, b.len(), w.max(&1).to_owned(), None, [0xc4, 0xc5, 0xc6]);
            out.extend(b);
        }
        Gen::Arr(items, w) => {
            len_marker(out, items.len(), *w, Some((0x90, 15)), [0, 0xdc, 0xdd]);
            for i in items {
                write(i, out);
            }
        }
        Gen::Map(items, w) => {
            len_marker(out, items.len(), *w, Some((0x80, 15)), [0, 0xde, 0xdf]);
            for (k, v) in items {
                write(k, out);
                write(v, out);
            }
        }
        Gen::Ext(tag, data, w) => {
            match (data.len(), w % 2) {
                (1, 0) => out.push(0xd4),
                (2, 0) => out.push(0xd5),
                (4, 0) => out.push(0xd6),
                (8, 0) => out.push(0xd7),
                (16, 0) => out.push(0xd8),
                (n, _) => out.extend([0xc7, n as u8]),
            }
            out.push(*tag as u8);
            out.extend(data);
        }
        Gen::Reserved => out.push(0xc1),
    }
}

fn text() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => "[a-z]{0,20}".prop_map(String::into_bytes),
        2 => ".{0,40}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..40),
        1 => prop_oneof![
            Just(b"i".to_vec()), Just(b"name".to_vec()), Just(b"kind".to_vec()),
            Just(b"Theorem".to_vec()), Just(b"Lemma".to_vec()), Just(b"Def".to_vec()),
            Just(b"arity".to_vec()), Just(b"a".to_vec()), Just(b"b".to_vec()),
        ],
    ]
}

fn gen() -> impl Strategy<Value = Gen> {
    let leaf = prop_oneof![
        Just(Gen::Nil),
        any::<bool>().prop_map(Gen::Bool),
        (any::<u64>(), any::<u8>()).prop_map(|(v, w)| Gen::Uint(v, w)),
        (0u64..300, any::<u8>()).prop_map(|(v, w)| Gen::Uint(v, w)),
        (any::<i64>(), any::<u8>()).prop_map(|(v, w)| Gen::Int(v, w)),
        (-40i64..0, any::<u8>()).prop_map(|(v, w)| Gen::Int(v, w)),
        any::<f32>().prop_map(Gen::F32),
        any::<f64>().prop_map(Gen::F64),
        (text(), any::<u8>()).prop_map(|(s, w)| Gen::Str(s, w)),
        (prop::collection::vec(any::<u8>(), 0..20), any::<u8>()).prop_map(|(b, w)| Gen::Bin(b, w)),
        (
            any::<i8>(),
            prop::collection::vec(any::<u8>(), 0..17),
            any::<u8>()
        )
            .prop_map(|(t, d, w)| Gen::Ext(t, d, w)),
        Just(Gen::Reserved),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            (prop::collection::vec(inner.clone(), 0..6), any::<u8>())
                .prop_map(|(v, w)| Gen::Arr(v, w)),
            (
                prop::collection::vec((inner.clone(), inner), 0..6),
                any::<u8>()
            )
                .prop_map(|(v, w)| Gen::Map(v, w)),
        ]
    })
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Theorem),
        any::<u32>().prop_map(Kind::Lemma),
        (any::<u8>(), ".{0,8}").prop_map(|(arity, name)| Kind::Def { arity, name }),
        (any::<i16>(), any::<bool>()).prop_map(|(a, b)| Kind::Pair(a, b)),
    ]
}

prop_compose! {
    fn row()(
        i in any::<u64>(), name in ".{0,30}", kind in kind(), score in any::<Option<f64>>(),
        tags in prop::collection::vec("[a-z]{0,5}", 0..4),
        blob in prop::collection::vec(any::<u8>(), 0..300), neg in any::<i32>(),
        small in any::<Option<Option<u8>>>(),
        attrs in prop::collection::btree_map("[a-z]{1,4}", any::<i64>(), 0..4),
        pair in any::<(char, bool)>(),
    ) -> Row {
        Row { i, name, kind, score, tags, blob, neg, small, attrs, pair, unit: Unit, missing_ok: 0 }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn generated_values_decode_as_rmp_serde_decodes_them(g in gen(), cut in any::<prop::sample::Index>(), flip in any::<(prop::sample::Index, u8)>()) {
        let mut body = Vec::new();
        write(&g, &mut body);
        all_targets(&body)?;
        // Truncated, with a byte changed, and with a byte after the value.
        all_targets(&body[..cut.index(body.len() + 1)])?;
        let (at, byte) = flip;
        if !body.is_empty() {
            let mut bent = body.clone();
            bent[at.index(body.len())] = byte;
            all_targets(&bent)?;
        }
        body.push(0xc0);
        all_targets(&body)?;
    }

    #[test]
    fn rows_decode_as_rmp_serde_decodes_them(r in row(), cut in any::<prop::sample::Index>(), flip in any::<(prop::sample::Index, u8)>()) {
        for named in [true, false] {
            let mut body = if named {
                rmp_serde::to_vec_named(&r).unwrap()
            } else {
                rmp_serde::to_vec(&r).unwrap()
            };
            // (Some(None) comes back as None: MessagePack has one nil.)
            prop_assert!(Codec::MsgPack.decode::<Row>(&body).is_ok());
            all_targets(&body)?;
            all_targets(&body[..cut.index(body.len())])?;
            let (at, byte) = flip;
            let at = at.index(body.len());
            body[at] = byte;
            all_targets(&body)?;
        }
    }

    #[test]
    fn random_bytes_decode_as_rmp_serde_decodes_them(body in prop::collection::vec(any::<u8>(), 0..64)) {
        all_targets(&body)?;
    }
}

#[test]
fn long_strings_and_nesting_decode_as_rmp_serde_decodes_them() {
    // Strings past the inline check (SIMD), valid and not; nesting past the fast path's depth.
    for len in [17, 31, 32, 100, 4096] {
        let mut s = "x".repeat(len - 2) + "é";
        let body = rmp_serde::to_vec(&s).unwrap();
        all_targets(&body).unwrap();
        s.pop();
        let mut bad = rmp_serde::to_vec(&s).unwrap();
        let last = bad.len() - 1;
        bad[last] = 0xc3; // a lone lead byte
        all_targets(&bad).unwrap();
    }
    // rmp_serde's limit is 1024 levels: a big stack for the debug build's frames.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(|| {
            for depth in [100, 127, 128, 129, 300, 1023, 1024, 1100] {
                let body: Vec<u8> = std::iter::repeat_n(0x91, depth).chain([0x01]).collect();
                same::<Trace>(&body).unwrap();
            }
        })
        .unwrap()
        .join()
        .unwrap();
}
