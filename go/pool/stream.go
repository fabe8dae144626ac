package pool

import (
	"context"
	"errors"
	"iter"
	"time"

	"github.com/wirepool/wirepool/go/codec"
	"github.com/wirepool/wirepool/go/proto"
)

// RowStream is a stream's rows, read with Next (or All), then its summary at END.
type RowStream[Row, Summary any] struct {
	ctx        context.Context // the caller's wait: ctx, its deadline plus the deadline grace
	stop       func()
	w          *proc
	id         uint64
	pr         *pending
	codec      Codec
	batch      [][]byte
	row        Row
	summary    Summary
	hasSummary bool
	err        error
	done       bool

	// Retries (RetryPolicy): the request to send again, what it goes through, the caller's
	// ctx (its deadline bounds every try), the tries allowed and made, whether a row reached
	// the caller (then it is never sent again).
	t         Target
	m         call
	callCtx   context.Context
	pool      *Pool
	limit     int
	tries     int
	delivered bool
	sentAt    time.Time // the last try's, for the method duration
	cancelled error     // the caller cancelled while a retry waited for a worker
}

// Stream sends a request for a stream method. Credit is granted as rows are taken (the core's
// Consumed and Grant). Errors, at Stream or from Err, are *Error; ctx ending cancels the stream
// (at its deadline, the worker's DEADLINE_EXCEEDED is waited for up to the deadline grace).
// A method of Options.Retry (or a stream with Idempotent(true)) whose worker died before any
// of its rows reached the caller is sent again, within Next (RetryPolicy).
func Stream[Req, Row, Summary any](ctx context.Context, t Target, method string, req Req, opts ...CallOption) (_ *RowStream[Row, Summary], err error) {
	defer func() {
		if p := poolOf(t); p != nil && err != nil {
			p.m.ended(method, time.Time{}, err) // refused: no latency, one error
		}
	}()
	c, body, o, err := resolve(req, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel, err := o.withTimeout(ctx)
	if err != nil {
		return nil, err
	}
	limit, p, err := retryLimit(t, method, o)
	if err != nil {
		cancel()
		return nil, err
	}
	tus, terr := timeoutOf(ctx)
	if terr != nil {
		cancel()
		return nil, terr
	}
	m := call{method, uint8(c), proto.KindStream, tus, body}
	queued := time.Now()
	w, id, pr, serr := t.send(ctx, m)
	if serr != nil {
		cancel()
		return nil, serr
	}
	sentAt := time.Now()
	w.p.m.sent(w, proto.KindStream, sentAt.Sub(queued))
	wctx, stop := waiting(ctx, t.options().DeadlineGrace)
	return &RowStream[Row, Summary]{ctx: wctx, stop: func() { stop(); cancel() }, w: w, id: id, pr: pr, codec: c,
		t: t, m: m, callCtx: ctx, pool: p, limit: limit, tries: 1, sentAt: sentAt}, nil
}

// retry sends the stream's request again after its worker died, when RetryPolicy allows it:
// tries left, no row delivered, time left on the caller's deadline, a worker within it.
func (s *RowStream[Row, Summary]) retry(r reply) bool {
	if s.delivered || s.tries >= s.limit || !retryable(r) || s.callCtx.Err() != nil {
		return false
	}
	tus, terr := timeoutOf(s.callCtx)
	if terr != nil {
		return false
	}
	m := s.m
	m.timeoutUs = tus
	if testHookRetrying != nil {
		testHookRetrying()
	}
	queued := time.Now()
	w, id, pr, err := s.t.send(s.callCtx, m)
	if err != nil {
		if errors.Is(s.callCtx.Err(), context.Canceled) {
			s.cancelled = err // the caller cancelled while the retry waited: CANCELLED, as a cancelled stream
		}
		return false
	}
	s.sentAt = time.Now()
	w.p.m.sent(w, proto.KindStream, s.sentAt.Sub(queued))
	s.tries++
	s.w, s.id, s.pr = w, id, pr
	s.pool.retries.Add(1)
	return true
}

// Next advances to the next row; false at END or on an error (see Err).
func (s *RowStream[Row, Summary]) Next() bool {
	for {
		if s.done {
			return false
		}
		if s.ctx.Err() != nil {
			s.fail(ctxError(s.ctx))
			return false
		}
		if len(s.batch) > 0 {
			b := s.batch[0]
			s.batch = s.batch[1:]
			var r Row
			if err := codec.Decode(s.codec, b, &r); err != nil {
				s.fail(errorf(proto.CodeDecodeFailed, "decode a row: %v", err))
				return false
			}
			s.row = r
			return true
		}
		s.w.mu.Lock()
		r, ok := s.pr.pop()
		if ok && !r.end {
			s.w.core.Consumed(s.id, r.size)
			s.w.flush()
		}
		s.w.mu.Unlock()
		if ok {
			if !r.end {
				s.delivered = true
				s.batch = r.rows
				continue
			}
			if s.retry(r) {
				continue
			}
			s.finish()
			if r.err != nil {
				s.err = r.err
				if s.limit > 1 {
					s.err = withAttempts(r.err, s.tries)
				}
				if s.cancelled != nil {
					s.err = s.cancelled
				}
				s.record()
				return false
			}
			if len(r.body) > 0 {
				s.hasSummary = true
				if err := codec.Decode(s.codec, r.body, &s.summary); err != nil {
					s.err = errorf(proto.CodeDecodeFailed, "decode the summary: %v", err)
				}
			}
			s.record()
			return false
		}
		select {
		case <-s.pr.sig:
		case <-s.ctx.Done():
		}
	}
}

func (s *RowStream[Row, Summary]) finish() {
	s.done = true
	s.stop()
}

// record counts the stream's outcome, once s.err is final.
func (s *RowStream[Row, Summary]) record() {
	if p := poolOf(s.t); p != nil {
		p.m.ended(s.m.method, s.sentAt, s.err)
	}
}

func (s *RowStream[Row, Summary]) fail(err error) {
	s.finish()
	s.err = err
	s.record()
	s.w.abandon(s.id)
}

// Row is the row Next moved to.
func (s *RowStream[Row, Summary]) Row() Row { return s.row }

// Err is the stream's error once Next returned false (nil at a normal END).
func (s *RowStream[Row, Summary]) Err() error { return s.err }

// Summary is END's summary (zero when the stream sent none or has not ended).
func (s *RowStream[Row, Summary]) Summary() Summary { return s.summary }

// HasSummary reports whether END carried a summary.
func (s *RowStream[Row, Summary]) HasSummary() bool { return s.hasSummary }

// Close stops a stream not read to its end (CANCEL); Err is then CANCELLED.
func (s *RowStream[Row, Summary]) Close() {
	if !s.done {
		s.fail(errorf(proto.CodeCancelled, "the stream was closed"))
	}
}

// All yields every row, then (zero, err) once if the stream failed; breaking out closes it.
func (s *RowStream[Row, Summary]) All() iter.Seq2[Row, error] {
	return func(yield func(Row, error) bool) {
		defer s.Close()
		for s.Next() {
			if !yield(s.row, nil) {
				return
			}
		}
		if s.err != nil {
			var zero Row
			yield(zero, s.err)
		}
	}
}
