package pool

import (
	"context"
	"iter"

	"github.com/wirepool/wirepool/go/proto"
)

// RowStream is a stream's rows, read with Next (or All), then its summary at END.
type RowStream[Row, Summary any] struct {
	ctx     context.Context
	w       *proc
	id      uint64
	pr      *pending
	codec   Codec
	batch   [][]byte
	row     Row
	summary Summary
	err     error
	done    bool
}

// Stream sends a request for a stream method. Credit is granted as rows are taken (the core's
// Consumed and Grant). Errors, at Stream or from Err, are *Error; ctx ending cancels the stream.
func Stream[Req, Row, Summary any](ctx context.Context, p *Pool, method string, req Req, opts ...CallOption) (*RowStream[Row, Summary], error) {
	codec, body, err := resolve(req, opts)
	if err != nil {
		return nil, err
	}
	tus, terr := timeoutOf(ctx)
	if terr != nil {
		return nil, terr
	}
	w, id, pr, serr := p.send(ctx, method, uint8(codec), proto.KindStream, tus, body)
	if serr != nil {
		return nil, serr
	}
	return &RowStream[Row, Summary]{ctx: ctx, w: w, id: id, pr: pr, codec: codec}, nil
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
			if err := decode(s.codec, b, &r); err != nil {
				s.fail(errorf(proto.CodeBadRequest, "decode a row: %v", err))
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
			s.done = true
			if r.err != nil {
				s.err = r.err
				return false
			}
			if len(r.body) > 0 {
				if err := decode(s.codec, r.body, &s.summary); err != nil {
					s.err = errorf(proto.CodeBadRequest, "decode the summary: %v", err)
				}
			}
			return false
		}
		select {
		case <-s.pr.sig:
		case <-s.ctx.Done():
			s.fail(ctxError(s.ctx))
			return false
		}
	}
}

func (s *RowStream[Row, Summary]) fail(err error) {
	s.done = true
	s.err = err
	s.w.abandon(s.id)
}

// Row is the row Next moved to.
func (s *RowStream[Row, Summary]) Row() Row { return s.row }

// Err is the stream's error once Next returned false (nil at a normal END).
func (s *RowStream[Row, Summary]) Err() error { return s.err }

// Summary is END's summary (zero when the stream sent none or has not ended).
func (s *RowStream[Row, Summary]) Summary() Summary { return s.summary }

// Close stops a stream not read to its end (CANCEL).
func (s *RowStream[Row, Summary]) Close() {
	if !s.done {
		s.done = true
		s.err = errorf(proto.CodeCancelled, "the stream was closed")
		s.w.abandon(s.id)
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
