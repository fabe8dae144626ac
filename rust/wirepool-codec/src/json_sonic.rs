//! The JSON encoder of the `json-sonic` feature: sonic-rs's serializer (SIMD string escaping),
//! producing exactly the bytes of the serde_json encoder it replaces, or nothing.
//!
//! Measured on the founding rows (issue 26, `bench/json-alt`): sonic-rs encodes a 4 KiB string
//! row 6.6x faster than serde_json, whose byte-at-a-time escaping scan is 28% of a Rust worker's
//! time streaming such rows. Decoding stays with serde_json (faster on small rows, equal on
//! 4 KiB ones).
//!
//! The same bytes as serde_json, by construction where sonic-rs differs:
//! - floats are written by serde_json's own formatter (ryu; sonic-rs uses another algorithm);
//! - integers outside the 64-bit range, and every error sonic-rs reports, make [`encode`] return
//!   `false`: the caller encodes again with serde_json, so errors (and their messages) are
//!   serde_json's;
//! - a struct whose name starts with `$` (serde_json's `RawValue` and arbitrary-precision
//!   `Number`, sonic-rs's own raw types: private tokens each library treats specially) also
//!   returns `false`, so such a value is serde_json's job as before.
//!
//! sonic-rs writes into a contiguous buffer it reserves ahead (`WriteExt`), which a generic
//! `BufMut` cannot offer: the value is encoded into a per-thread scratch vector, then appended
//! to the caller's buffer in one copy (a few percent of the escaping time saved on a 4 KiB row).

use std::cell::RefCell;
use std::fmt::Display;
use std::io;

use bytes::BufMut;
use serde::ser::{self, Serialize};
use serde_json::ser::Formatter as _;

/// A scratch buffer above this capacity is dropped after use instead of kept for the thread.
const KEEP_SCRATCH: usize = 1 << 20;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Appends the JSON of `value` to `out` and returns `true`, or leaves `out` untouched and returns
/// `false` when sonic-rs cannot give serde_json's bytes for it (see the module docs).
pub(crate) fn encode<T: Serialize + ?Sized, B: BufMut>(value: &T, out: &mut B) -> bool {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => {
            scratch.clear();
            let done = encode_via(value, &mut scratch, out);
            if scratch.capacity() > KEEP_SCRATCH {
                *scratch = Vec::new();
            }
            done
        }
        // A `Serialize` impl that encodes JSON itself (re-entered on this thread).
        Err(_) => encode_via(value, &mut Vec::new(), out),
    })
}

fn encode_via<T: Serialize + ?Sized, B: BufMut>(
    value: &T,
    scratch: &mut Vec<u8>,
    out: &mut B,
) -> bool {
    let mut ser = sonic_rs::Serializer::with_formatter(&mut *scratch, SameAsSerdeJson);
    if value.serialize(Guard(&mut ser)).is_err() {
        return false;
    }
    out.put_slice(scratch);
    true
}

/// sonic-rs's compact format with serde_json's floats, refusing integers outside 64 bits.
#[derive(Clone, Copy)]
struct SameAsSerdeJson;

impl sonic_rs::format::Formatter for SameAsSerdeJson {
    #[inline]
    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, v: f32) -> io::Result<()> {
        serde_json::ser::CompactFormatter.write_f32(w, v)
    }
    #[inline]
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, v: f64) -> io::Result<()> {
        serde_json::ser::CompactFormatter.write_f64(w, v)
    }
    fn write_i128<W: ?Sized + io::Write>(&mut self, w: &mut W, v: i128) -> io::Result<()> {
        match i64::try_from(v) {
            Ok(v) => self.write_i64(w, v),
            Err(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, "i128")),
        }
    }
    fn write_u128<W: ?Sized + io::Write>(&mut self, w: &mut W, v: u128) -> io::Result<()> {
        match u64::try_from(v) {
            Ok(v) => self.write_u64(w, v),
            Err(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, "u128")),
        }
    }
}

/// A forwarding serializer that fails on a struct named with a private token (`$...`); every
/// other call is forwarded as is, compound serializers wrapping their elements.
struct Guard<S>(S);

/// A value serialised through [`Guard`] (an element of a compound).
struct Wrap<'a, T: ?Sized>(&'a T);

impl<T: Serialize + ?Sized> Serialize for Wrap<'_, T> {
    #[inline]
    fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(Guard(serializer))
    }
}

macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            #[inline]
            fn $method(self, $($arg: $ty),*) -> Result<S::Ok, S::Error> {
                self.0.$method($($arg),*)
            }
        )*
    };
}

impl<S: ser::Serializer> ser::Serializer for Guard<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Guard<S::SerializeSeq>;
    type SerializeTuple = Guard<S::SerializeTuple>;
    type SerializeTupleStruct = Guard<S::SerializeTupleStruct>;
    type SerializeTupleVariant = Guard<S::SerializeTupleVariant>;
    type SerializeMap = Guard<S::SerializeMap>;
    type SerializeStruct = Guard<S::SerializeStruct>;
    type SerializeStructVariant = Guard<S::SerializeStructVariant>;

    forward! {
        serialize_bool(v: bool);
        serialize_i8(v: i8);
        serialize_i16(v: i16);
        serialize_i32(v: i32);
        serialize_i64(v: i64);
        serialize_i128(v: i128);
        serialize_u8(v: u8);
        serialize_u16(v: u16);
        serialize_u32(v: u32);
        serialize_u64(v: u64);
        serialize_u128(v: u128);
        serialize_f32(v: f32);
        serialize_f64(v: f64);
        serialize_char(v: char);
        serialize_str(v: &str);
        serialize_bytes(v: &[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(name: &'static str);
        serialize_unit_variant(name: &'static str, index: u32, variant: &'static str);
    }

    #[inline]
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.0.serialize_some(&Wrap(value))
    }

    #[inline]
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0.serialize_newtype_struct(name, &Wrap(value))
    }

    #[inline]
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0
            .serialize_newtype_variant(name, index, variant, &Wrap(value))
    }

    #[inline]
    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        self.0.serialize_seq(len).map(Guard)
    }

    #[inline]
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.0.serialize_tuple(len).map(Guard)
    }

    #[inline]
    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.0.serialize_tuple_struct(name, len).map(Guard)
    }

    #[inline]
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        self.0
            .serialize_tuple_variant(name, index, variant, len)
            .map(Guard)
    }

    #[inline]
    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.0.serialize_map(len).map(Guard)
    }

    #[inline]
    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        if name.starts_with('$') {
            return Err(ser::Error::custom("a private token: serde_json's job"));
        }
        self.0.serialize_struct(name, len).map(Guard)
    }

    #[inline]
    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        self.0
            .serialize_struct_variant(name, index, variant, len)
            .map(Guard)
    }

    #[inline]
    fn collect_str<T: Display + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.0.collect_str(value)
    }

    #[inline]
    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! compound {
    ($trait:ident, $method:ident) => {
        impl<S: ser::$trait> ser::$trait for Guard<S> {
            type Ok = S::Ok;
            type Error = S::Error;
            #[inline]
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), S::Error> {
                self.0.$method(&Wrap(value))
            }
            #[inline]
            fn end(self) -> Result<S::Ok, S::Error> {
                self.0.end()
            }
        }
    };
}

compound!(SerializeSeq, serialize_element);
compound!(SerializeTuple, serialize_element);
compound!(SerializeTupleStruct, serialize_field);
compound!(SerializeTupleVariant, serialize_field);

impl<S: ser::SerializeMap> ser::SerializeMap for Guard<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    #[inline]
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), S::Error> {
        self.0.serialize_key(&Wrap(key))
    }
    #[inline]
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), S::Error> {
        self.0.serialize_value(&Wrap(value))
    }
    #[inline]
    fn serialize_entry<K: Serialize + ?Sized, V: Serialize + ?Sized>(
        &mut self,
        key: &K,
        value: &V,
    ) -> Result<(), S::Error> {
        self.0.serialize_entry(&Wrap(key), &Wrap(value))
    }
    #[inline]
    fn end(self) -> Result<S::Ok, S::Error> {
        self.0.end()
    }
}

macro_rules! fields {
    ($trait:ident) => {
        impl<S: ser::$trait> ser::$trait for Guard<S> {
            type Ok = S::Ok;
            type Error = S::Error;
            #[inline]
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), S::Error> {
                self.0.serialize_field(key, &Wrap(value))
            }
            #[inline]
            fn skip_field(&mut self, key: &'static str) -> Result<(), S::Error> {
                self.0.skip_field(key)
            }
            #[inline]
            fn end(self) -> Result<S::Ok, S::Error> {
                self.0.end()
            }
        }
    };
}

fields!(SerializeStruct);
fields!(SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::encode;

    /// The fast path is taken for ordinary rows and left for the values serde_json must write.
    #[test]
    fn sonic_encodes_rows_and_leaves_private_tokens_and_big_integers() {
        let mut out = Vec::new();
        assert!(encode(&("decl_1", 1u64, [1.5f64]), &mut out));
        assert_eq!(out, br#"["decl_1",1,[1.5]]"#);
        let raw = serde_json::value::RawValue::from_string("[1]".into()).unwrap();
        assert!(!encode(&[&raw], &mut out));
        assert!(!encode(&(1u128 << 64), &mut out));
        assert!(!encode(&[Some(i128::MIN)], &mut out));
        assert_eq!(
            out, br#"["decl_1",1,[1.5]]"#,
            "nothing appended on a refusal"
        );
    }
}
