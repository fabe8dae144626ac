package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

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
)

// CallOption configures one call or stream.
type CallOption func(*callOpts)

type callOpts struct {
	codec    Codec
	codecSet bool
}

// WithCodec chooses the codec (default JSON; []byte requests default to Raw).
func WithCodec(c Codec) CallOption { return func(o *callOpts) { o.codec, o.codecSet = c, true } }

func encode(c Codec, v any) ([]byte, error) {
	switch b := v.(type) {
	case []byte:
		return b, nil
	}
	switch c {
	case Raw:
		if s, ok := v.(string); ok {
			return []byte(s), nil
		}
		return nil, fmt.Errorf("the raw codec carries []byte or string, not %T", v)
	case JSON:
		return json.Marshal(v)
	case Msgpack:
		return msgpack.Marshal(v)
	}
	return nil, fmt.Errorf("codec %d is not supported by this parent", c)
}

func decode[T any](c Codec, body []byte, v *T) error {
	switch p := any(v).(type) {
	case *[]byte:
		*p = bytes.Clone(body)
		return nil
	case *string:
		if c == Raw {
			*p = string(body)
			return nil
		}
	}
	switch c {
	case JSON:
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		return d.Decode(v)
	case Msgpack:
		return msgpack.Unmarshal(body, v)
	}
	return fmt.Errorf("cannot decode codec %d into %T", c, *v)
}

func resolve[Req any](req Req, opts []CallOption) (Codec, []byte, error) {
	o := callOpts{codec: JSON}
	if _, ok := any(req).([]byte); ok {
		o.codec = Raw
	}
	for _, f := range opts {
		f(&o)
	}
	body, err := encode(o.codec, req)
	if err != nil {
		return 0, nil, errorf(proto.CodeInvalidArgument, "encode the request: %v", err)
	}
	return o.codec, body, nil
}

// timeoutOf is the request's timeout_us from ctx's deadline (0: none); an expired deadline is
// DEADLINE_EXCEEDED before anything is sent.
func timeoutOf(ctx context.Context) (uint64, *Error) {
	if err := ctx.Err(); err != nil {
		return 0, ctxError(ctx)
	}
	d, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	left := time.Until(d)
	if left <= 0 {
		return 0, errorf(proto.CodeDeadlineExceeded, "the deadline passed before the call was sent")
	}
	us := uint64(left / time.Microsecond)
	if us == 0 {
		us = 1
	}
	return us, nil
}

// Call sends one request for a unary method and returns its decoded result. Errors are
// *Error: the worker's (HANDLER_ERROR, BAD_REQUEST, ...), WORKER_EXITED when it died,
// DEADLINE_EXCEEDED at ctx's deadline, CANCELLED when ctx is cancelled (the worker gets CANCEL,
// and is killed if it has not ended the request within the cancel grace).
func Call[Req, Resp any](ctx context.Context, p *Pool, method string, req Req, opts ...CallOption) (Resp, error) {
	var zero Resp
	codec, body, err := resolve(req, opts)
	if err != nil {
		return zero, err
	}
	tus, terr := timeoutOf(ctx)
	if terr != nil {
		return zero, terr
	}
	w, id, pr, serr := p.send(ctx, method, uint8(codec), proto.KindUnary, tus, body)
	if serr != nil {
		return zero, serr
	}
	for {
		select {
		case <-pr.sig:
		case <-ctx.Done():
			w.mu.Lock()
			r, ok := pr.pop()
			w.mu.Unlock()
			if ok {
				return finish[Resp](codec, r)
			}
			w.abandon(id)
			return zero, ctxError(ctx)
		}
		w.mu.Lock()
		r, ok := pr.pop()
		w.mu.Unlock()
		if ok {
			return finish[Resp](codec, r)
		}
	}
}

func finish[Resp any](codec Codec, r reply) (Resp, error) {
	var out Resp
	if r.err != nil {
		return out, r.err
	}
	if err := decode(codec, r.body, &out); err != nil {
		return out, errorf(proto.CodeBadRequest, "decode the result: %v", err)
	}
	return out, nil
}
