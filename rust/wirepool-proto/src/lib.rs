//! The sans-IO core of the wirepool wire protocol, version 1 (`spec/PROTOCOL.md`).
//!
//! No sockets, no async runtime, no clock: bytes in (any chunking), frames and events out,
//! frames encoded into buffers you provide. Three layers, mirroring `spec/vectors/`:
//!
//! - [`FrameDecoder`] splits a byte stream into checked [`Frame`]s: every rule decidable from
//!   one frame (header, payload layout, UTF-8, row bounds, handshake ranges). Lengths are
//!   checked against the limit before anything is allocated; payloads are [`bytes::Bytes`]
//!   slices of the receive buffer, never copied.
//! - Encoders: [`Frame::encode`] for any frame, [`encode_message`] to split a large message
//!   into CONTINUATION frames, [`RowsBuilder`] to build ROWS frames row by row in place, and
//!   [`RowsFrame`] to fill one away from the core (a handler thread) and send it later.
//! - [`Connection`]: the state machine of either [`Role`]: handshake, direction, request ids,
//!   in-flight tracking, continuation reassembly, stream credit, drain. Its [`Event`]s are
//!   the EVENT objects of `spec/vectors/README.md`.
//!
//! Every failure is a [`ProtocolError`] with a stable [`ErrorCode`]; 1xx codes are fatal.
//!
//! ```
//! use wirepool_proto::{Connection, Event, Hello, Welcome};
//!
//! let mut worker = Connection::new_worker();
//! let mut wire = Vec::new();
//! worker.send_hello(&Hello::new("my-sdk", "0.1.0"), &mut wire).unwrap();
//!
//! let mut parent = Connection::new_parent();
//! parent.receive(&wire);
//! let Some(Event::Hello(hello)) = parent.next_event().unwrap() else { unreachable!() };
//! assert_eq!(hello.sdk_name, "my-sdk");
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod connection;
mod decode;
mod encode;
mod error;
mod frame;
mod handshake;
mod ids;
pub mod shm;
mod wire;

pub use connection::{grant_due, Connection, Event, MessageCursor, Role};
pub use decode::{decode_frame, FrameDecoder};
pub use encode::{
    encode_message, AppendError, FrameBuf, MessageHead, RowsBuilder, RowsFrame, RowsWritten,
};
pub use error::{ErrorClass, ErrorCode, ProtocolError};
pub use frame::{
    Direction, Frame, FrameBody, FrameType, Header, IdRule, RowIter, RowsPayload,
    DEFAULT_HEARTBEAT_MS, DEFAULT_INITIAL_CREDIT, DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_MESSAGE_SIZE,
    FLAG_MORE, HANDSHAKE_MAX_FRAME_SIZE, HEADER_LEN, MAX_CREDIT, MAX_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
};
pub use handshake::{
    check_methods, choose_version, Hello, HelloExtensions, MethodInfo, MethodKind,
    MethodRequirement, Welcome, WelcomeExtensions, HELLO_MAGIC, MAX_CODECS_PER_METHOD, MAX_METHODS,
};
pub use ids::{IdBuildHasher, IdHasher, IdMap};
