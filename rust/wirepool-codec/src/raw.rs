//! The opaque codecs: a value is its own bytes.
//!
//! A tiny serde data format that accepts only the byte-like parts of serde's data model (bytes,
//! strings, a sequence of `u8`, unit, newtypes around those), so a handler can use `Bytes`,
//! `serde_bytes::ByteBuf`, `Vec<u8>` or `String` with the raw codec and gets a clear error for a
//! struct instead of a silent, language-specific encoding.

use std::fmt;

use bytes::BufMut;
use serde::de::{self, Visitor};
use serde::ser::{self, Impossible, Serialize};

#[derive(Debug)]
pub(crate) struct RawError(String);

impl fmt::Display for RawError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for RawError {}
impl ser::Error for RawError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        RawError(msg.to_string())
    }
}
impl de::Error for RawError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        RawError(msg.to_string())
    }
}

fn not_bytes(what: &str) -> RawError {
    RawError(format!(
        "the raw codec carries bytes only, not {what}; use Bytes, serde_bytes::ByteBuf, Vec<u8> or String"
    ))
}

pub(crate) fn encode<T: Serialize + ?Sized, B: BufMut>(
    value: &T,
    out: &mut B,
) -> Result<(), RawError> {
    value.serialize(RawSerializer { out })
}

pub(crate) fn decode<T: de::DeserializeOwned>(body: &[u8]) -> Result<T, RawError> {
    T::deserialize(RawDeserializer { body })
}

struct RawSerializer<'a, B> {
    out: &'a mut B,
}

macro_rules! reject {
    ($($method:ident($($arg:ty),*) -> $ret:ty : $what:expr;)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<$ret, RawError> { Err(not_bytes($what)) })*
    };
}

impl<'a, B: BufMut> ser::Serializer for RawSerializer<'a, B> {
    type Ok = ();
    type Error = RawError;
    type SerializeSeq = RawSeq<'a, B>;
    type SerializeTuple = Impossible<(), RawError>;
    type SerializeTupleStruct = Impossible<(), RawError>;
    type SerializeTupleVariant = Impossible<(), RawError>;
    type SerializeMap = Impossible<(), RawError>;
    type SerializeStruct = Impossible<(), RawError>;
    type SerializeStructVariant = Impossible<(), RawError>;

    fn serialize_bytes(self, v: &[u8]) -> Result<(), RawError> {
        self.out.put_slice(v);
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), RawError> {
        self.out.put_slice(v.as_bytes());
        Ok(())
    }
    fn serialize_unit(self) -> Result<(), RawError> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), RawError> {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), RawError> {
        value.serialize(self)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<RawSeq<'a, B>, RawError> {
        Ok(RawSeq { out: self.out })
    }

    reject! {
        serialize_bool(bool) -> () : "a bool";
        serialize_i8(i8) -> () : "an integer";
        serialize_i16(i16) -> () : "an integer";
        serialize_i32(i32) -> () : "an integer";
        serialize_i64(i64) -> () : "an integer";
        serialize_u8(u8) -> () : "an integer";
        serialize_u16(u16) -> () : "an integer";
        serialize_u32(u32) -> () : "an integer";
        serialize_u64(u64) -> () : "an integer";
        serialize_f32(f32) -> () : "a float";
        serialize_f64(f64) -> () : "a float";
        serialize_char(char) -> () : "a char";
        serialize_none() -> () : "an Option";
        serialize_unit_variant(&'static str, u32, &'static str) -> () : "an enum";
        serialize_tuple(usize) -> Impossible<(), RawError> : "a tuple";
        serialize_tuple_struct(&'static str, usize) -> Impossible<(), RawError> : "a tuple struct";
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Impossible<(), RawError> : "an enum";
        serialize_map(Option<usize>) -> Impossible<(), RawError> : "a map";
        serialize_struct(&'static str, usize) -> Impossible<(), RawError> : "a struct";
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Impossible<(), RawError> : "an enum";
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), RawError> {
        Err(not_bytes("an Option"))
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), RawError> {
        Err(not_bytes("an enum"))
    }
}

/// `Vec<u8>` and `[u8; N]`-like sequences serialise element by element; accept only `u8`s.
struct RawSeq<'a, B> {
    out: &'a mut B,
}

impl<B: BufMut> ser::SerializeSeq for RawSeq<'_, B> {
    type Ok = ();
    type Error = RawError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), RawError> {
        value.serialize(ByteElement {
            out: &mut *self.out,
        })
    }
    fn end(self) -> Result<(), RawError> {
        Ok(())
    }
}

struct ByteElement<'a, B> {
    out: &'a mut B,
}

impl<B: BufMut> ser::Serializer for ByteElement<'_, B> {
    type Ok = ();
    type Error = RawError;
    type SerializeSeq = Impossible<(), RawError>;
    type SerializeTuple = Impossible<(), RawError>;
    type SerializeTupleStruct = Impossible<(), RawError>;
    type SerializeTupleVariant = Impossible<(), RawError>;
    type SerializeMap = Impossible<(), RawError>;
    type SerializeStruct = Impossible<(), RawError>;
    type SerializeStructVariant = Impossible<(), RawError>;

    fn serialize_u8(self, v: u8) -> Result<(), RawError> {
        self.out.put_u8(v);
        Ok(())
    }

    reject! {
        serialize_bool(bool) -> () : "a sequence of bools";
        serialize_i8(i8) -> () : "a sequence of i8";
        serialize_i16(i16) -> () : "a sequence of integers";
        serialize_i32(i32) -> () : "a sequence of integers";
        serialize_i64(i64) -> () : "a sequence of integers";
        serialize_u16(u16) -> () : "a sequence of integers";
        serialize_u32(u32) -> () : "a sequence of integers";
        serialize_u64(u64) -> () : "a sequence of integers";
        serialize_f32(f32) -> () : "a sequence of floats";
        serialize_f64(f64) -> () : "a sequence of floats";
        serialize_char(char) -> () : "a sequence of chars";
        serialize_str(&str) -> () : "a sequence of strings";
        serialize_bytes(&[u8]) -> () : "a sequence of byte strings";
        serialize_none() -> () : "a sequence of Options";
        serialize_unit() -> () : "a sequence of units";
        serialize_unit_struct(&'static str) -> () : "a sequence of units";
        serialize_unit_variant(&'static str, u32, &'static str) -> () : "a sequence of enums";
        serialize_seq(Option<usize>) -> Impossible<(), RawError> : "nested sequences";
        serialize_tuple(usize) -> Impossible<(), RawError> : "a sequence of tuples";
        serialize_tuple_struct(&'static str, usize) -> Impossible<(), RawError> : "a sequence of tuples";
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Impossible<(), RawError> : "a sequence of enums";
        serialize_map(Option<usize>) -> Impossible<(), RawError> : "a sequence of maps";
        serialize_struct(&'static str, usize) -> Impossible<(), RawError> : "a sequence of structs";
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Impossible<(), RawError> : "a sequence of enums";
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), RawError> {
        Err(not_bytes("a sequence of Options"))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), RawError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), RawError> {
        Err(not_bytes("a sequence of enums"))
    }
}

struct RawDeserializer<'de> {
    body: &'de [u8],
}

impl<'de> de::Deserializer<'de> for RawDeserializer<'de> {
    type Error = RawError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RawError> {
        visitor.visit_borrowed_bytes(self.body)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RawError> {
        visitor.visit_borrowed_bytes(self.body)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RawError> {
        visitor.visit_byte_buf(self.body.to_vec())
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RawError> {
        match std::str::from_utf8(self.body) {
            Ok(s) => visitor.visit_borrowed_str(s),
            Err(e) => Err(RawError(format!("raw body is not UTF-8 text: {e}"))),
        }
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RawError> {
        self.deserialize_str(visitor)
    }
    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RawError> {
        if self.body.is_empty() {
            visitor.visit_unit()
        } else {
            Err(RawError(format!(
                "expected an empty body, got {} bytes",
                self.body.len()
            )))
        }
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, RawError> {
        self.deserialize_unit(visitor)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, RawError> {
        visitor.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RawError> {
        visitor.visit_seq(de::value::SeqDeserializer::new(self.body.iter().copied()))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char option tuple tuple_struct
        map struct enum identifier ignored_any
    }
}
