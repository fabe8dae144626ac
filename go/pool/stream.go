package pool

import (
	"context"
	"iter"

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
}

// Stream sends a request for a stream method. Credit is granted as rows are taken (the core's
// Consumed and Grant). Errors, at Stream or from Err, are *Error; ctx ending cancels the stream
// (at its deadline, the worker's DEADLINE_EXCEEDED is waited for up to the deadline grace).
func Stream[Req, Row, Summary any](ctx context.Context, t Target, method string, req Req, opts ...CallOption) (*RowStream[Row, Summary], error) {
	c, body, o, err := resolve(req, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel, err := o.withTimeout(ctx)
	if err != nil {
		return nil, err
	}
	tus, terr := timeoutOf(ctx)
	if terr != nil {
		cancel()
		return nil, terr
	}
	w, id, pr, serr := t.send(ctx, call{method, uint8(c), proto.KindStream, tus, body})
	if serr != nil {
		cancel()
		return nil, serr
	}
	wctx, stop := waiting(ctx, t.options().DeadlineGrace)
	return &RowStream[Row, Summary]{ctx: wctx, stop: func() { stop(); cancel() }, w: w, id: id, pr: pr, codec: c}, nil
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
				s.batch = r.rows
				continue
			}
			s.finish()
			if r.err != nil {
				s.err = r.err
				return false
			}
			if len(r.body) > 0 {
				s.hasSummary = true
				if err := codec.Decode(s.codec, r.body, &s.summary); err != nil {
					s.err = errorf(proto.CodeDecodeFailed, "decode the summary: %v", err)
				}
			}
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

func (s *RowStream[Row, Summary]) fail(err error) {
	s.finish()
	s.err = err
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
