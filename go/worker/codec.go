package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/fxamacker/cbor/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/wirepool/wirepool/go/proto"
)

// Codec is a codec id of PROTOCOL.md section 7.
type Codec uint8

// The codecs this SDK encodes and decodes.
const (
	Raw     Codec = proto.CodecRaw
	JSON    Codec = proto.CodecJSON
	Msgpack Codec = proto.CodecMsgpack
	CBOR    Codec = proto.CodecCBOR
)

// Bytes is a body passed through unencoded, whatever the request's codec: a handler taking
// Bytes gets the request's bytes as they arrived (they alias the receive buffer: copy them to
// keep them past the call), and one returning Bytes sends them as the result as they are.
type Bytes []byte

var cborDec, _ = cbor.DecOptions{DefaultMapType: reflect.TypeOf(map[string]any(nil))}.DecMode()

func decode[T any](codec Codec, body []byte, v *T) error {
	switch p := any(v).(type) {
	case *Bytes:
		*p = body
		return nil
	case *[]byte:
		*p = body
		return nil
	}
	switch codec {
	case Raw:
		if p, ok := any(v).(*string); ok {
			*p = string(body)
			return nil
		}
		return fmt.Errorf("the raw codec carries bytes: the handler takes %T", *v)
	case JSON:
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		if err := d.Decode(v); err != nil {
			return err
		}
		if d.More() {
			return fmt.Errorf("trailing data after the JSON value")
		}
		return nil
	case Msgpack:
		return msgpack.Unmarshal(body, v)
	case CBOR:
		return cborDec.Unmarshal(body, v)
	}
	return fmt.Errorf("codec %d is not one this SDK decodes", codec)
}

func encode[T any](codec Codec, v T) ([]byte, error) {
	switch p := any(v).(type) {
	case Bytes:
		return p, nil
	case []byte:
		if codec == Raw {
			return p, nil
		}
	}
	switch codec {
	case Raw:
		if s, ok := any(v).(string); ok {
			return []byte(s), nil
		}
		return nil, fmt.Errorf("the raw codec carries bytes: the handler returned %T", v)
	case JSON:
		return json.Marshal(v)
	case Msgpack:
		return msgpack.Marshal(v)
	case CBOR:
		return cbor.Marshal(v)
	}
	return nil, fmt.Errorf("codec %d is not one this SDK encodes", codec)
}

// isBytes reports whether T passes through unencoded (Bytes or []byte).
func isBytes[T any]() bool {
	var v T
	switch any(v).(type) {
	case Bytes, []byte:
		return true
	}
	return false
}
