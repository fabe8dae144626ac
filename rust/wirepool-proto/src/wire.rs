//! Little-endian field reader over a payload slice, with typed errors.

use crate::error::{err, ErrorCode, ProtocolError};

/// Reads fixed fields front to back; running out is `short_code` (BAD_PAYLOAD).
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
    short_code: ErrorCode,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(payload: &'a [u8], short_code: ErrorCode) -> Self {
        Reader {
            rest: payload,
            short_code,
        }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if n > self.rest.len() {
            return Err(err(
                self.short_code,
                0,
                format!(
                    "payload too short: {n} bytes needed, {} left",
                    self.rest.len()
                ),
            ));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtocolError> {
        let bytes = self.bytes(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, ProtocolError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, ProtocolError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn nonce(&mut self) -> Result<[u8; 8], ProtocolError> {
        self.array()
    }

    /// A `str16`: u16 byte length, then UTF-8 (`BAD_UTF8` otherwise).
    pub(crate) fn str16(&mut self) -> Result<&'a str, ProtocolError> {
        let len = self.u16()? as usize;
        let bytes = self.bytes(len)?;
        std::str::from_utf8(bytes)
            .map_err(|e| err(ErrorCode::BadUtf8, 0, format!("text field: {e}")))
    }

    /// A `str16` whose byte length must be in `lo..=hi` (`range_code` otherwise); the length
    /// is checked before the UTF-8.
    pub(crate) fn str16_in(
        &mut self,
        lo: usize,
        hi: usize,
        range_code: ErrorCode,
        what: &str,
    ) -> Result<&'a str, ProtocolError> {
        let len = self.u16()? as usize;
        let bytes = self.bytes(len)?;
        if len < lo || len > hi {
            return Err(err(
                range_code,
                0,
                format!("{what} is {len} bytes, not {lo}-{hi}"),
            ));
        }
        std::str::from_utf8(bytes).map_err(|e| err(ErrorCode::BadUtf8, 0, format!("{what}: {e}")))
    }

    /// Fail with BAD_PAYLOAD if bytes are left where the layout has no trailing field.
    pub(crate) fn finish(&self, what: &str) -> Result<(), ProtocolError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(err(
                ErrorCode::BadPayload,
                0,
                format!("{} bytes left over in {what} payload", self.rest.len()),
            ))
        }
    }
}

/// Check trailing JSON/text fields: UTF-8 only (the protocol does not parse the JSON).
pub(crate) fn utf8(bytes: &[u8], what: &str) -> Result<String, ProtocolError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|e| err(ErrorCode::BadUtf8, 0, format!("{what}: {e}")))
}
