//! A forwarding `serde::Serializer` that refuses integers outside the 64-bit range.
//!
//! rmp_serde writes a `u128`/`i128` as a 16-byte binary string, so a value of 2^64 would travel
//! silently as bytes, which no other SDK reads back as a number (PROTOCOL.md 22.4: such a value
//! is refused, never sent, as the JSON codec's `NoBigInts` formatter does). [`NoBigInts`] wraps
//! any serializer: `serialize_i128`/`serialize_u128` forward a value that fits 64 bits as
//! `i64`/`u64` and fail otherwise; every other call is forwarded as is, compound serializers
//! wrapping their elements, so the value is walked once (no second pass).

use std::fmt::Display;

use serde::ser::{self, Serialize};

/// The wrapper of a serializer `S` (see the module docs).
pub(crate) struct NoBigInts<S>(pub(crate) S);

/// A value serialised through [`NoBigInts`] (an element of a compound).
struct Wrap<'a, T: ?Sized>(&'a T);

impl<T: Serialize + ?Sized> Serialize for Wrap<'_, T> {
    #[inline]
    fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(NoBigInts(serializer))
    }
}

fn too_big<E: ser::Error>(v: impl Display) -> E {
    E::custom(format_args!(
        "the integer {v} is outside the 64-bit range MessagePack carries between SDKs"
    ))
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

impl<S: ser::Serializer> ser::Serializer for NoBigInts<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = NoBigInts<S::SerializeSeq>;
    type SerializeTuple = NoBigInts<S::SerializeTuple>;
    type SerializeTupleStruct = NoBigInts<S::SerializeTupleStruct>;
    type SerializeTupleVariant = NoBigInts<S::SerializeTupleVariant>;
    type SerializeMap = NoBigInts<S::SerializeMap>;
    type SerializeStruct = NoBigInts<S::SerializeStruct>;
    type SerializeStructVariant = NoBigInts<S::SerializeStructVariant>;

    forward! {
        serialize_bool(v: bool);
        serialize_i8(v: i8);
        serialize_i16(v: i16);
        serialize_i32(v: i32);
        serialize_i64(v: i64);
        serialize_u8(v: u8);
        serialize_u16(v: u16);
        serialize_u32(v: u32);
        serialize_u64(v: u64);
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
    fn serialize_i128(self, v: i128) -> Result<S::Ok, S::Error> {
        match i64::try_from(v) {
            Ok(v) => self.0.serialize_i64(v),
            Err(_) => Err(too_big(v)),
        }
    }

    #[inline]
    fn serialize_u128(self, v: u128) -> Result<S::Ok, S::Error> {
        match u64::try_from(v) {
            Ok(v) => self.0.serialize_u64(v),
            Err(_) => Err(too_big(v)),
        }
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
        self.0.serialize_seq(len).map(NoBigInts)
    }

    #[inline]
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.0.serialize_tuple(len).map(NoBigInts)
    }

    #[inline]
    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.0.serialize_tuple_struct(name, len).map(NoBigInts)
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
            .map(NoBigInts)
    }

    #[inline]
    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.0.serialize_map(len).map(NoBigInts)
    }

    #[inline]
    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        self.0.serialize_struct(name, len).map(NoBigInts)
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
            .map(NoBigInts)
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
        impl<S: ser::$trait> ser::$trait for NoBigInts<S> {
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

impl<S: ser::SerializeMap> ser::SerializeMap for NoBigInts<S> {
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
        impl<S: ser::$trait> ser::$trait for NoBigInts<S> {
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
