// Package codec is the body encoding of PROTOCOL.md section 7, shared by the worker driver and
// the parent: the codec ids and one Encode / Decode pair over raw, JSON, MessagePack and CBOR.
//
// Raw bodies travel as []byte, Bytes or string. Bytes passes through unencoded whatever the
// codec; []byte does with Raw only (under another codec it is a value, e.g. a JSON base64
// string). JSON numbers decoded into an interface value are json.Number, so integers above
// 2^53 keep every digit; CBOR maps decode as map[string]any.
package codec

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

// The codecs this package encodes and decodes.
const (
	Raw     Codec = proto.CodecRaw
	JSON    Codec = proto.CodecJSON
	Msgpack Codec = proto.CodecMsgpack
	CBOR    Codec = proto.CodecCBOR
)

// String is the codec's name in spec/constants.json ("raw", "json", "msgpack", "cbor").
func (c Codec) String() string {
	switch c {
	case Raw:
		return "raw"
	case JSON:
		return "json"
	case Msgpack:
		return "msgpack"
	case CBOR:
		return "cbor"
	}
	return fmt.Sprintf("codec %d", uint8(c))
}

// Bytes is a body passed through unencoded, whatever the codec. Decoded Bytes alias the body
// they were decoded from.
type Bytes []byte

var cborDec, _ = cbor.DecOptions{DefaultMapType: reflect.TypeOf(map[string]any(nil))}.DecMode()

// Decode decodes body, encoded with c, into v. Into *Bytes or *[]byte the body is aliased as
// it is; into *string or *any under Raw it is the body's text or bytes.
func Decode[T any](c Codec, body []byte, v *T) error {
	switch p := any(v).(type) {
	case *Bytes:
		*p = body
		return nil
	case *[]byte:
		*p = body
		return nil
	}
	switch c {
	case Raw:
		switch p := any(v).(type) {
		case *string:
			*p = string(body)
			return nil
		case *any:
			*p = body
			return nil
		}
		return fmt.Errorf("the raw codec carries bytes, not %T", *v)
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
	return fmt.Errorf("%s is not one this SDK decodes", c)
}

// Encode encodes v with c. Bytes pass through; []byte and string pass through under Raw.
func Encode[T any](c Codec, v T) ([]byte, error) {
	switch p := any(v).(type) {
	case Bytes:
		return p, nil
	case []byte:
		if c == Raw {
			return p, nil
		}
	}
	switch c {
	case Raw:
		if s, ok := any(v).(string); ok {
			return []byte(s), nil
		}
		return nil, fmt.Errorf("the raw codec carries bytes, not %T", v)
	case JSON:
		return json.Marshal(v)
	case Msgpack:
		return msgpack.Marshal(v)
	case CBOR:
		return cbor.Marshal(v)
	}
	return nil, fmt.Errorf("%s is not one this SDK encodes", c)
}

// IsBytes reports whether T passes through unencoded (Bytes or []byte): such a method or call
// defaults to Raw.
func IsBytes[T any]() bool {
	var v T
	switch any(v).(type) {
	case Bytes, []byte:
		return true
	}
	return false
}
