package worker

import "github.com/wirepool/wirepool/go/codec"

// Codec is a codec id of PROTOCOL.md section 7 (the codec package's, shared with the parent).
type Codec = codec.Codec

// The codecs this SDK encodes and decodes.
const (
	Raw     = codec.Raw
	JSON    = codec.JSON
	Msgpack = codec.Msgpack
	CBOR    = codec.CBOR
)

// Bytes is a body passed through unencoded, whatever the request's codec: a handler taking
// Bytes gets the request's bytes as they arrived (they alias the receive buffer: copy them to
// keep them past the call), and one returning Bytes sends them as the result as they are.
type Bytes = codec.Bytes
