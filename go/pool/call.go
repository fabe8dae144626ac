package pool

import (
	"context"
	"errors"
	"time"

	"github.com/wirepool/wirepool/go/codec"
	"github.com/wirepool/wirepool/go/proto"
)

// Codec is a codec id of PROTOCOL.md section 7 (the codec package's, shared with the worker).
type Codec = codec.Codec

// Bytes is a body passed through unencoded whatever the codec (a request already encoded, or
// a result to decode later); []byte and string pass through under Raw.
type Bytes = codec.Bytes

// The codecs this package encodes and decodes.
const (
	Raw     = codec.Raw
	JSON    = codec.JSON
	Msgpack = codec.Msgpack
	CBOR    = codec.CBOR
)

// Target is where a call goes: a *Pool (its least-loaded worker) or a *Lease (its one worker).
type Target interface {
	send(ctx context.Context, m call) (*proc, uint64, *pending, error)
	options() *settings
}

func (p *Pool) options() *settings { return &p.opts }

// poolOf is the pool a call through t counts in (nil for a nil target).
func poolOf(t Target) *Pool {
	switch t := t.(type) {
	case *Pool:
		return t
	case *Lease:
		if t != nil {
			return t.p
		}
	}
	return nil
}

// CallOption configures one call or stream.
type CallOption func(*callOpts)

type callOpts struct {
	codec         Codec
	timeout       time.Duration
	hasTimeout    bool
	idempotent    bool
	hasIdempotent bool
}

// WithCodec chooses the codec (default JSON; []byte and Bytes requests default to Raw).
func WithCodec(c Codec) CallOption { return func(o *callOpts) { o.codec = c } }

// WithTimeout bounds the call or stream by d from now, besides ctx's deadline (the earlier
// wins): 0 has expired (DEADLINE_EXCEEDED, nothing sent), a negative d or one above
// max_timeout_ms is INVALID_ARGUMENT (22.3).
func WithTimeout(d time.Duration) CallOption {
	return func(o *callOpts) { o.timeout, o.hasTimeout = d, true }
}

// withTimeout applies WithTimeout to ctx; cancel releases it.
func (o *callOpts) withTimeout(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if !o.hasTimeout {
		return ctx, func() {}, nil
	}
	if o.timeout < 0 || o.timeout > time.Duration(proto.MaxTimeoutMs)*time.Millisecond {
		return nil, nil, withDetails(errorf(proto.CodeInvalidArgument, "timeout %v out of range 0-%d ms", o.timeout, proto.MaxTimeoutMs),
			map[string]any{"field": "timeout"})
	}
	if o.timeout == 0 {
		return nil, nil, errorf(proto.CodeDeadlineExceeded, "a timeout of 0 has expired")
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	return ctx, cancel, nil
}

func resolve[Req any](req Req, opts []CallOption) (Codec, []byte, *callOpts, error) {
	o := &callOpts{codec: JSON}
	switch any(req).(type) {
	case []byte, Bytes:
		o.codec = Raw
	}
	for _, f := range opts {
		if f != nil {
			f(o)
		}
	}
	switch o.codec {
	case Raw, JSON, Msgpack, CBOR:
	default:
		return 0, nil, nil, withDetails(errorf(proto.CodeInvalidArgument, "codec %s is not one this parent encodes", o.codec), map[string]any{"field": "codec"})
	}
	body, err := codec.Encode(o.codec, req)
	if err != nil {
		// 22.4: a value the codec cannot encode is BAD_REQUEST, before anything is sent.
		return 0, nil, nil, errorf(proto.CodeBadRequest, "the request cannot be encoded as %s: %v", o.codec, err)
	}
	return o.codec, body, o, nil
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
	if left > time.Duration(proto.MaxTimeoutMs)*time.Millisecond {
		// 22.3: a budget above max_timeout_ms (~24.8 days) is a caller's mistake, not "forever".
		return 0, withDetails(errorf(proto.CodeInvalidArgument, "timeout %v above the largest, %d ms", left, proto.MaxTimeoutMs), map[string]any{"field": "timeout"})
	}
	us := uint64(left / time.Microsecond)
	if us == 0 {
		us = 1
	}
	return us, nil
}

// waiting is how long a caller waits for a request's terminal: until ctx is cancelled, or
// until its deadline plus the deadline grace (the worker answers DEADLINE_EXCEEDED at its own
// timer, 8.3; the parent's timer is the backstop). stop releases it.
func waiting(ctx context.Context, grace time.Duration) (wctx context.Context, stop func()) {
	base, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	wctx = base
	var cancelDeadline context.CancelFunc = func() {}
	if d, ok := ctx.Deadline(); ok {
		wctx, cancelDeadline = context.WithDeadline(base, d.Add(grace))
	}
	unhook := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel(context.Cause(ctx))
		}
	})
	return wctx, func() {
		unhook()
		cancelDeadline()
		cancel(nil)
	}
}

// Call sends one request for a unary method and returns its decoded result. Errors are
// *Error: the worker's (HANDLER_ERROR, BAD_REQUEST, ...), WORKER_EXITED when it died,
// WORKER_HUNG when the liveness clocks ran out, DEADLINE_EXCEEDED at ctx's deadline (the
// worker's answer, or the parent's own past the deadline grace), CANCELLED when ctx is
// cancelled (the worker gets CANCEL, and is killed if it has not ended the request within the
// cancel grace), LEASE_LOST on a lease whose worker is gone. A method of Options.Retry (or a
// call with Idempotent(true)) whose worker died is sent again (RetryPolicy).
func Call[Req, Resp any](ctx context.Context, t Target, method string, req Req, opts ...CallOption) (_ Resp, err error) {
	var zero Resp
	var sentAt time.Time // the last try's
	defer func() {
		if p := poolOf(t); p != nil {
			p.m.ended(method, sentAt, err)
		}
	}()
	c, body, o, err := resolve(req, opts)
	if err != nil {
		return zero, err
	}
	ctx, cancel, err := o.withTimeout(ctx)
	if err != nil {
		return zero, err
	}
	defer cancel()
	limit, p, err := retryLimit(t, method, o)
	if err != nil {
		return zero, err
	}
	var last *Error // the death of the try before this one
	for tries := 1; ; tries++ {
		tus, terr := timeoutOf(ctx)
		var w *proc
		var id uint64
		var pr *pending
		var serr error
		if terr == nil {
			if last != nil && testHookRetrying != nil {
				testHookRetrying()
			}
			queued := time.Now()
			w, id, pr, serr = t.send(ctx, call{method, uint8(c), proto.KindUnary, tus, body})
			if serr == nil {
				sentAt = time.Now()
				w.p.m.sent(w, proto.KindUnary, sentAt.Sub(queued))
			}
		}
		switch {
		case (terr != nil || serr != nil) && last != nil && !errors.Is(ctx.Err(), context.Canceled):
			// No time or no worker for the next try: the caller gets the last try's outcome
			// (cancelled by the caller meanwhile, it gets CANCELLED, as a cancelled call does).
			return zero, withAttempts(last, tries-1)
		case terr != nil:
			return zero, terr
		case serr != nil:
			return zero, serr
		}
		r := await(ctx, t, w, id, pr)
		if tries < limit && retryable(r) && ctx.Err() == nil {
			last = r.err
			p.retries.Add(1)
			continue
		}
		if r.err != nil && limit > 1 {
			r.err = withAttempts(r.err, tries)
		}
		return finish[Resp](c, r)
	}
}

// await waits for request id's reply: its terminal, or ctx's end (the request is abandoned:
// CANCEL, and a kill past the cancel grace).
func await(ctx context.Context, t Target, w *proc, id uint64, pr *pending) reply {
	wctx, stop := waiting(ctx, t.options().DeadlineGrace)
	defer stop()
	for {
		select {
		case <-pr.sig:
		case <-wctx.Done():
			w.mu.Lock()
			r, ok := pr.pop()
			w.mu.Unlock()
			if ok {
				return r
			}
			w.abandon(id)
			return reply{err: ctxError(wctx), end: true}
		}
		w.mu.Lock()
		r, ok := pr.pop()
		w.mu.Unlock()
		if ok {
			return r
		}
	}
}

func finish[Resp any](c Codec, r reply) (Resp, error) {
	var out Resp
	if r.err != nil {
		return out, r.err
	}
	if err := codec.Decode(c, r.body, &out); err != nil {
		return out, errorf(proto.CodeDecodeFailed, "decode the result: %v", err)
	}
	return out, nil
}
