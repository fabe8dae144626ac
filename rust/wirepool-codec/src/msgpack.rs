//! MessagePack decoding straight from a byte slice, for the values rows are made of.
//!
//! `rmp_serde` checks every string and map key with `std::str::from_utf8` (a function call per
//! string: a fifth of a small row's decode), reads through `io::Read` one marker at a time, and
//! tells the end of a value only through an `io::Error`. This deserializer reads the slice in
//! place, checks short ASCII strings inline and long ones with `simdutf8`, and knows where it
//! stopped.
//!
//! It makes **exactly the visitor calls `rmp_serde` 1.3 makes** (the same `visit_*` method for
//! every marker, the same borrowed strings and byte strings, the same `size_hint`s), for every
//! marker but the extension types. Anything else hands the whole value back to `rmp_serde`:
//! an extension type, an `i128`, a byte string where a sequence is asked for, a string that is
//! not UTF-8, nesting deeper than [`MAX_DEPTH`], bytes left after the value, and every error,
//! including one a `Deserialize` impl caught and went on from. So values and errors stay
//! `rmp_serde`'s; only the time of the successful decodes changes.

use std::fmt;

use serde::de::{self, DeserializeSeed, Visitor};

/// Deeper values go to `rmp_serde` (its own limit is 1024 levels).
const MAX_DEPTH: u16 = 128;

/// Decodes `input` as one whole value; `None` hands it to `rmp_serde` (see the module docs).
#[inline]
pub(crate) fn decode<'de, T: de::Deserialize<'de>>(input: &'de [u8]) -> Option<T> {
    let mut de = Decoder {
        input,
        pos: 0,
        depth: MAX_DEPTH,
        failed: false,
    };
    match T::deserialize(&mut de) {
        Ok(value) if !de.failed && de.pos == input.len() => Some(value),
        _ => None,
    }
}

/// The only error: "let `rmp_serde` decide".
#[derive(Debug)]
pub(crate) struct Fallback;

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("decoded again by rmp_serde")
    }
}

impl std::error::Error for Fallback {}

impl de::Error for Fallback {
    #[cold]
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        Fallback
    }
}

type Result<T> = std::result::Result<T, Fallback>;

struct Decoder<'de> {
    input: &'de [u8],
    pos: usize,
    /// Levels of arrays and maps still allowed.
    depth: u16,
    /// An error went through this decoder (even one a `Deserialize` impl then ignored).
    failed: bool,
}

/// Records an error passing through the decoder, so the value goes to `rmp_serde`.
macro_rules! tracked {
    ($de:expr, $e:expr) => {{
        let result = $e;
        if result.is_err() {
            $de.failed = true;
        }
        result
    }};
}

/// The scalar `deserialize_*` methods: one marker byte, then the number (or bool) it starts.
macro_rules! numbers {
    ($($name:ident)*) => {$(
        #[inline]
        fn $name<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
            tracked!(self, self.byte().and_then(|m| self.number(m, visitor)))
        }
    )*};
}

// Marker bytes (MessagePack spec).
const NIL: u8 = 0xc0;
const FALSE: u8 = 0xc2;
const TRUE: u8 = 0xc3;
const BIN8: u8 = 0xc4;
const BIN16: u8 = 0xc5;
const BIN32: u8 = 0xc6;
const F32: u8 = 0xca;
const F64: u8 = 0xcb;
const U8: u8 = 0xcc;
const U16: u8 = 0xcd;
const U32: u8 = 0xce;
const U64: u8 = 0xcf;
const I8: u8 = 0xd0;
const I16: u8 = 0xd1;
const I32: u8 = 0xd2;
const I64: u8 = 0xd3;
const STR8: u8 = 0xd9;
const STR16: u8 = 0xda;
const STR32: u8 = 0xdb;
const ARRAY16: u8 = 0xdc;
const ARRAY32: u8 = 0xdd;
const MAP16: u8 = 0xde;
const MAP32: u8 = 0xdf;
const FIXARRAY_EMPTY: u8 = 0x90;

impl<'de> Decoder<'de> {
    #[inline]
    fn peek(&self) -> Result<u8> {
        self.input.get(self.pos).copied().ok_or(Fallback)
    }

    #[inline]
    fn byte(&mut self) -> Result<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn take(&mut self, len: usize) -> Result<&'de [u8]> {
        let input: &'de [u8] = self.input;
        let bytes = input.get(self.pos..).and_then(|rest| rest.get(..len));
        let bytes = bytes.ok_or(Fallback)?;
        self.pos += len;
        Ok(bytes)
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let bytes = self.take(N)?;
        bytes.try_into().map_err(|_| Fallback)
    }

    #[inline]
    fn len_u8(&mut self) -> Result<usize> {
        Ok(usize::from(self.byte()?))
    }

    #[inline]
    fn len_u16(&mut self) -> Result<usize> {
        Ok(usize::from(u16::from_be_bytes(self.array()?)))
    }

    #[inline]
    fn len_u32(&mut self) -> Result<usize> {
        Ok(u32::from_be_bytes(self.array()?) as usize)
    }

    /// `rmp_serde`'s `any_num`: nil, booleans, integers and floats, each to the visit method of
    /// its marker's width.
    #[inline]
    fn number<V: Visitor<'de>>(&mut self, marker: u8, visitor: V) -> Result<V::Value> {
        match marker {
            0x00..=0x7f => visitor.visit_u8(marker),
            0xe0..=0xff => visitor.visit_i8(marker as i8),
            NIL => visitor.visit_unit(),
            FALSE => visitor.visit_bool(false),
            TRUE => visitor.visit_bool(true),
            U8 => visitor.visit_u8(self.byte()?),
            U16 => visitor.visit_u16(u16::from_be_bytes(self.array()?)),
            U32 => visitor.visit_u32(u32::from_be_bytes(self.array()?)),
            U64 => visitor.visit_u64(u64::from_be_bytes(self.array()?)),
            I8 => visitor.visit_i8(self.byte()? as i8),
            I16 => visitor.visit_i16(i16::from_be_bytes(self.array()?)),
            I32 => visitor.visit_i32(i32::from_be_bytes(self.array()?)),
            I64 => visitor.visit_i64(i64::from_be_bytes(self.array()?)),
            F32 => visitor.visit_f32(f32::from_be_bytes(self.array()?)),
            F64 => visitor.visit_f64(f64::from_be_bytes(self.array()?)),
            _ => Err(Fallback),
        }
    }

    /// `rmp_serde`'s `any_inner`.
    fn any<V: Visitor<'de>>(&mut self, visitor: V, allow_bytes: bool) -> Result<V::Value> {
        let marker = self.byte()?;
        let str_len = match marker {
            0xa0..=0xbf => usize::from(marker & 0x1f),
            STR8 => self.len_u8()?,
            STR16 => self.len_u16()?,
            STR32 => self.len_u32()?,
            0x80..=0x8f => return self.map(usize::from(marker & 0x0f), visitor),
            MAP16 => {
                let len = self.len_u16()?;
                return self.map(len, visitor);
            }
            MAP32 => {
                let len = self.len_u32()?;
                return self.map(len, visitor);
            }
            0x90..=0x9f => return self.seq(usize::from(marker & 0x0f), visitor),
            ARRAY16 => {
                let len = self.len_u16()?;
                return self.seq(len, visitor);
            }
            ARRAY32 => {
                let len = self.len_u32()?;
                return self.seq(len, visitor);
            }
            BIN8 | BIN16 | BIN32 => {
                let len = match marker {
                    BIN8 => self.len_u8()?,
                    BIN16 => self.len_u16()?,
                    _ => self.len_u32()?,
                };
                let bytes = self.take(len)?;
                // rmp_serde hands a byte string asked for as a sequence over byte by byte.
                return if allow_bytes {
                    visitor.visit_borrowed_bytes(bytes)
                } else {
                    Err(Fallback)
                };
            }
            // Extension types and the reserved marker.
            0xc1 | 0xc7..=0xc9 | 0xd4..=0xd8 => return Err(Fallback),
            _ => return self.number(marker, visitor),
        };
        let bytes = self.take(str_len)?;
        // A string that is not UTF-8 may still be read as bytes by rmp_serde.
        visitor.visit_borrowed_str(utf8(bytes).ok_or(Fallback)?)
    }

    #[inline]
    fn seq<V: Visitor<'de>>(&mut self, len: usize, visitor: V) -> Result<V::Value> {
        self.depth -= 1;
        if self.depth == 0 {
            return Err(Fallback);
        }
        let mut access = Seq {
            de: &mut *self,
            left: len,
        };
        let value = visitor.visit_seq(&mut access)?;
        let left = access.left;
        self.depth += 1;
        if left != 0 {
            return Err(Fallback);
        }
        Ok(value)
    }

    #[inline]
    fn map<V: Visitor<'de>>(&mut self, len: usize, visitor: V) -> Result<V::Value> {
        self.depth -= 1;
        if self.depth == 0 {
            return Err(Fallback);
        }
        let mut access = Map {
            de: &mut *self,
            left: len,
        };
        let value = visitor.visit_map(&mut access)?;
        let left = access.left;
        self.depth += 1;
        if left != 0 {
            return Err(Fallback);
        }
        Ok(value)
    }
}

/// UTF-8 check of a string's bytes: short ASCII strings (field names, most values) inline,
/// long ones with SIMD.
#[inline]
fn utf8(bytes: &[u8]) -> Option<&str> {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let ascii = match bytes.len() {
        0..=7 => bytes.iter().all(|b| b.is_ascii()),
        8..=16 => {
            // Two overlapping 8-byte words cover the string.
            let head = u64::from_ne_bytes(bytes[..8].try_into().ok()?);
            let tail = u64::from_ne_bytes(bytes[bytes.len() - 8..].try_into().ok()?);
            (head | tail) & HIGH == 0
        }
        _ => return simdutf8::basic::from_utf8(bytes).ok(),
    };
    if ascii {
        // SAFETY: every byte is below 0x80, so the bytes are ASCII, which is valid UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

impl<'de> de::Deserializer<'de> for &mut Decoder<'de> {
    type Error = Fallback;

    #[inline]
    fn is_human_readable(&self) -> bool {
        false
    }

    #[inline]
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        tracked!(self, self.any(visitor, true))
    }

    #[inline]
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        // rmp_serde keeps the marker it read for the inner value: the same as not consuming it.
        let result = match self.peek() {
            Ok(NIL) => {
                self.pos += 1;
                visitor.visit_none()
            }
            Ok(_) => visitor.visit_some(&mut *self),
            Err(e) => Err(e),
        };
        tracked!(self, result)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        // A map of one entry is {variant: data}; any other marker is the variant alone.
        let result = (|| {
            let len = match self.peek()? {
                marker @ 0x80..=0x8f => {
                    self.pos += 1;
                    usize::from(marker & 0x0f)
                }
                MAP16 => {
                    self.pos += 1;
                    self.len_u16()?
                }
                MAP32 => {
                    self.pos += 1;
                    self.len_u32()?
                }
                _ => return visitor.visit_enum(UnitVariant { de: &mut *self }),
            };
            if len != 1 {
                return Err(Fallback);
            }
            visitor.visit_enum(Variant { de: &mut *self })
        })();
        tracked!(self, result)
    }

    #[inline]
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        let result = if name == rmp_serde::MSGPACK_EXT_STRUCT_NAME {
            Err(Fallback)
        } else {
            visitor.visit_newtype_struct(&mut *self)
        };
        tracked!(self, result)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        // rmp_serde writes a unit struct as [] and reads nil or [] as one.
        let result = match self.peek() {
            Ok(NIL | FIXARRAY_EMPTY) => {
                self.pos += 1;
                visitor.visit_unit()
            }
            Ok(_) => self.any(visitor, true),
            Err(e) => Err(e),
        };
        tracked!(self, result)
    }

    fn deserialize_i128<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        self.failed = true;
        Err(Fallback)
    }

    fn deserialize_u128<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        self.failed = true;
        Err(Fallback)
    }

    #[inline]
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        tracked!(self, self.any(visitor, false))
    }

    #[inline]
    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value> {
        tracked!(self, self.any(visitor, false))
    }

    #[inline]
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        tracked!(self, self.any(visitor, false))
    }

    #[inline]
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value> {
        tracked!(self, self.any(visitor, false))
    }

    // These read whatever value is there (rmp_serde's reading of them), as deserialize_any.
    serde::forward_to_deserialize_any! {
        bytes byte_buf unit map identifier str string char ignored_any
    }

    numbers! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_f32
        deserialize_f64
    }
}

struct Seq<'a, 'de> {
    de: &'a mut Decoder<'de>,
    left: usize,
}

impl<'de> de::SeqAccess<'de> for Seq<'_, 'de> {
    type Error = Fallback;

    #[inline]
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        tracked!(self.de, seed.deserialize(&mut *self.de).map(Some))
    }

    #[inline]
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

struct Map<'a, 'de> {
    de: &'a mut Decoder<'de>,
    left: usize,
}

impl<'de> de::MapAccess<'de> for Map<'_, 'de> {
    type Error = Fallback;

    #[inline]
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        tracked!(self.de, seed.deserialize(&mut *self.de).map(Some))
    }

    #[inline]
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        tracked!(self.de, seed.deserialize(&mut *self.de))
    }

    #[inline]
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// `{variant: data}`.
struct Variant<'a, 'de> {
    de: &'a mut Decoder<'de>,
}

impl<'de> de::EnumAccess<'de> for Variant<'_, 'de> {
    type Error = Fallback;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        let variant = tracked!(self.de, seed.deserialize(&mut *self.de))?;
        Ok((variant, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_, 'de> {
    type Error = Fallback;

    fn unit_variant(self) -> Result<()> {
        match self.de.byte() {
            Ok(NIL) => Ok(()),
            _ => {
                self.de.failed = true;
                Err(Fallback)
            }
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value> {
        tracked!(self.de, seed.deserialize(&mut *self.de))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value> {
        de::Deserializer::deserialize_tuple(&mut *self.de, len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        de::Deserializer::deserialize_tuple(&mut *self.de, fields.len(), visitor)
    }
}

/// A variant written alone (as its name or index): a unit variant.
struct UnitVariant<'a, 'de> {
    de: &'a mut Decoder<'de>,
}

impl<'de> de::EnumAccess<'de> for UnitVariant<'_, 'de> {
    type Error = Fallback;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        let variant = tracked!(self.de, seed.deserialize(&mut *self.de))?;
        Ok((variant, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitVariant<'_, 'de> {
    type Error = Fallback;

    fn unit_variant(self) -> Result<()> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _seed: T) -> Result<T::Value> {
        self.de.failed = true;
        Err(Fallback)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value> {
        self.de.failed = true;
        Err(Fallback)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value> {
        self.de.failed = true;
        Err(Fallback)
    }
}

#[cfg(test)]
mod tests {
    use super::utf8;

    #[test]
    fn utf8_check_agrees_with_std_at_every_length() {
        for len in 0..40 {
            let ascii: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(utf8(&ascii).is_some());
            for at in 0..len {
                let mut high = ascii.clone();
                high[at] = 0xff;
                assert_eq!(utf8(&high).is_some(), std::str::from_utf8(&high).is_ok());
                if at + 2 <= len {
                    let mut two = ascii.clone();
                    two[at..at + 2].copy_from_slice("é".as_bytes());
                    assert_eq!(utf8(&two), std::str::from_utf8(&two).ok());
                }
            }
        }
    }
}
