//! The JSON encoder of the `json-sonic` feature: serde_json's serializer, except that a long
//! string value is escaped by sonic-rs (SIMD) and written as serde_json's raw fragment.
//!
//! Measured on the founding rows (issue 26, `bench/json-alt`): sonic-rs escapes a 4 KiB string
//! 6-7x faster than serde_json, whose byte-at-a-time scan is 28% of a Rust worker's time
//! streaming such rows; on short strings it gains nothing and costs more instructions. So only
//! string values of [`LONG`] bytes or more take it, and everything else (structure, keys, numbers,
//! errors, `RawValue`) is serde_json's own: the bytes are serde_json's by construction except
//! for the escaping of those strings, which `tests/json_sonic.rs` checks against serde_json on
//! every character class. Decoding stays serde_json's.
//!
//! [`Fast`] wraps `&mut serde_json::Serializer`, forwarding every call, compound serializers
//! wrapping their elements; a long `serialize_str` is escaped into a per-thread scratch vector
//! and handed to serde_json as a raw value (its `raw_value` token, which writes the fragment as
//! is). Map keys and the fields of a struct named with a private token (`$...`: serde_json's
//! `RawValue` and `Number`) pass through untouched.

use std::cell::RefCell;
use std::fmt::Display;

use serde::ser::{self, Serialize, SerializeStruct as _};
use sonic_rs::format::Formatter as _;

/// String values at least this long are escaped by sonic-rs.
pub(crate) const LONG: usize = 64;

/// serde_json's raw-value token (`serde_json::value::RawValue` serialises as a struct of this
/// name with one field of this name: serde_json writes the field's string as is).
const RAW_TOKEN: &str = "$serde_json::private::RawValue";

/// A scratch buffer above this capacity is dropped after use instead of kept for the thread.
const KEEP_SCRATCH: usize = 1 << 20;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The wrapper of serde_json's serializer `S` (see the module docs); `raw`: pass strings through.
pub(crate) struct Fast<S> {
    s: S,
    raw: bool,
}

impl<S> Fast<S> {
    pub(crate) fn new(s: S) -> Self {
        Self { s, raw: false }
    }
}

/// A value serialised through [`Fast`] (an element of a compound).
struct Wrap<'a, T: ?Sized> {
    v: &'a T,
    raw: bool,
}

impl<T: Serialize + ?Sized> Serialize for Wrap<'_, T> {
    #[inline]
    fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.v.serialize(Fast {
            s: serializer,
            raw: self.raw,
        })
    }
}

/// `value` as a JSON string (quotes included), escaped by sonic-rs, handed to `f`.
fn escaped<R>(value: &str, f: impl FnOnce(&str) -> R) -> R {
    let run = |scratch: &mut Vec<u8>| {
        scratch.clear();
        // Writing into a Vec cannot fail.
        let _ = sonic_rs::format::CompactFormatter.write_string_fast(scratch, value, true);
        // Escaping keeps a str's UTF-8 intact (it only replaces ASCII bytes with ASCII escapes);
        // checked anyway, and on the word-at-a-time ASCII path that costs little.
        f(std::str::from_utf8(scratch).unwrap_or("null"))
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => {
            let out = run(&mut scratch);
            if scratch.capacity() > KEEP_SCRATCH {
                *scratch = Vec::new();
            }
            out
        }
        // Re-entered on this thread (cannot happen while serde_json writes the fragment).
        Err(_) => run(&mut Vec::new()),
    })
}

macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            #[inline]
            fn $method(self, $($arg: $ty),*) -> Result<S::Ok, S::Error> {
                self.s.$method($($arg),*)
            }
        )*
    };
}

impl<S: ser::Serializer> ser::Serializer for Fast<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Fast<S::SerializeSeq>;
    type SerializeTuple = Fast<S::SerializeTuple>;
    type SerializeTupleStruct = Fast<S::SerializeTupleStruct>;
    type SerializeTupleVariant = Fast<S::SerializeTupleVariant>;
    type SerializeMap = Fast<S::SerializeMap>;
    type SerializeStruct = Fast<S::SerializeStruct>;
    type SerializeStructVariant = Fast<S::SerializeStructVariant>;

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
        serialize_bytes(v: &[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(name: &'static str);
        serialize_unit_variant(name: &'static str, index: u32, variant: &'static str);
    }

    #[inline]
    fn serialize_str(self, v: &str) -> Result<S::Ok, S::Error> {
        if self.raw || v.len() < LONG {
            return self.s.serialize_str(v);
        }
        escaped(v, |json| {
            let mut raw = self.s.serialize_struct(RAW_TOKEN, 1)?;
            raw.serialize_field(RAW_TOKEN, json)?;
            raw.end()
        })
    }

    #[inline]
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.s.serialize_some(&Wrap {
            v: value,
            raw: self.raw,
        })
    }

    #[inline]
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.s.serialize_newtype_struct(
            name,
            &Wrap {
                v: value,
                raw: self.raw,
            },
        )
    }

    #[inline]
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.s.serialize_newtype_variant(
            name,
            index,
            variant,
            &Wrap {
                v: value,
                raw: self.raw,
            },
        )
    }

    #[inline]
    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        self.s.serialize_seq(len).map(|s| Fast { s, raw: self.raw })
    }

    #[inline]
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.s
            .serialize_tuple(len)
            .map(|s| Fast { s, raw: self.raw })
    }

    #[inline]
    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.s
            .serialize_tuple_struct(name, len)
            .map(|s| Fast { s, raw: self.raw })
    }

    #[inline]
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        self.s
            .serialize_tuple_variant(name, index, variant, len)
            .map(|s| Fast { s, raw: self.raw })
    }

    #[inline]
    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.s.serialize_map(len).map(|s| Fast { s, raw: self.raw })
    }

    #[inline]
    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        // serde_json's RawValue and Number: their fields are text serde_json writes as is.
        let raw = self.raw || name.starts_with('$');
        self.s.serialize_struct(name, len).map(|s| Fast { s, raw })
    }

    #[inline]
    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        self.s
            .serialize_struct_variant(name, index, variant, len)
            .map(|s| Fast { s, raw: self.raw })
    }

    #[inline]
    fn collect_str<T: Display + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.s.collect_str(value)
    }

    #[inline]
    fn is_human_readable(&self) -> bool {
        self.s.is_human_readable()
    }
}

macro_rules! compound {
    ($trait:ident, $method:ident) => {
        impl<S: ser::$trait> ser::$trait for Fast<S> {
            type Ok = S::Ok;
            type Error = S::Error;
            #[inline]
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), S::Error> {
                self.s.$method(&Wrap {
                    v: value,
                    raw: self.raw,
                })
            }
            #[inline]
            fn end(self) -> Result<S::Ok, S::Error> {
                self.s.end()
            }
        }
    };
}

compound!(SerializeSeq, serialize_element);
compound!(SerializeTuple, serialize_element);
compound!(SerializeTupleStruct, serialize_field);
compound!(SerializeTupleVariant, serialize_field);

impl<S: ser::SerializeMap> ser::SerializeMap for Fast<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    #[inline]
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), S::Error> {
        self.s.serialize_key(&Wrap { v: key, raw: true })
    }
    #[inline]
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), S::Error> {
        self.s.serialize_value(&Wrap {
            v: value,
            raw: self.raw,
        })
    }
    #[inline]
    fn serialize_entry<K: Serialize + ?Sized, V: Serialize + ?Sized>(
        &mut self,
        key: &K,
        value: &V,
    ) -> Result<(), S::Error> {
        self.s.serialize_entry(
            &Wrap { v: key, raw: true },
            &Wrap {
                v: value,
                raw: self.raw,
            },
        )
    }
    #[inline]
    fn end(self) -> Result<S::Ok, S::Error> {
        self.s.end()
    }
}

macro_rules! fields {
    ($trait:ident) => {
        impl<S: ser::$trait> ser::$trait for Fast<S> {
            type Ok = S::Ok;
            type Error = S::Error;
            #[inline]
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), S::Error> {
                self.s.serialize_field(
                    key,
                    &Wrap {
                        v: value,
                        raw: self.raw,
                    },
                )
            }
            #[inline]
            fn skip_field(&mut self, key: &'static str) -> Result<(), S::Error> {
                self.s.skip_field(key)
            }
            #[inline]
            fn end(self) -> Result<S::Ok, S::Error> {
                self.s.end()
            }
        }
    };
}

fields!(SerializeStruct);
fields!(SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::{Fast, LONG};

    fn fast(value: &impl serde::Serialize) -> Vec<u8> {
        let mut out = Vec::new();
        value
            .serialize(Fast::new(&mut serde_json::Serializer::new(&mut out)))
            .unwrap();
        out
    }

    /// Long strings go through sonic-rs (its escaping of a long string matches serde_json's);
    /// keys, short strings and RawValue's text pass through.
    #[test]
    fn long_strings_are_escaped_by_sonic_and_the_rest_is_serde_json() {
        let long = format!("\"{}\n", "x".repeat(LONG));
        let key = "k".repeat(LONG + 1);
        let value: std::collections::BTreeMap<&str, (&str, &str)> =
            [(key.as_str(), (long.as_str(), "short\t"))]
                .into_iter()
                .collect();
        assert_eq!(fast(&value), serde_json::to_vec(&value).unwrap());
        let text = format!("[\"{}\"]", "y".repeat(LONG * 2));
        let raw = serde_json::value::RawValue::from_string(text.clone()).unwrap();
        assert_eq!(fast(&raw), text.as_bytes());
    }
}
