package worker

import (
	"context"
	"sync"

	"github.com/wirepool/wirepool/go/codec"
	"github.com/wirepool/wirepool/go/proto"
)

// Rows is a stream's row sink, handed to a Stream handler.
type Rows[T any] struct {
	ctx   context.Context
	s     *stream
	codec Codec
}

// Send encodes row with the request's codec and hands it to the SDK, which batches rows into
// ROWS frames and sends each within the flush bound (section 6). It blocks while the stream
// holds a full batch that its credit does not let out (the parent's consumer is behind), and
// returns an error once the request is cancelled, past its deadline or ended (the handler
// should then return), or for a row that cannot fit in a ROWS frame (ROW_TOO_LARGE: the stream
// ends with it whatever the handler returns).
func (r *Rows[T]) Send(row T) error {
	b, err := codec.Encode(r.codec, row)
	if err != nil {
		return Errorf(CodeHandlerError, "a row could not be encoded as %s: %v", r.codec, err)
	}
	if _, raw := any(row).(Bytes); raw {
		b = append([]byte(nil), b...)
	} else if _, raw := any(row).([]byte); raw {
		b = append([]byte(nil), b...)
	}
	return r.s.send(r.ctx, b)
}

// stream is a stream's rows between its handler and the I/O goroutine.
type stream struct {
	d     *driver
	c     *call
	limit int // the rows a frame may hold: max_frame_size - 8
	mu    sync.Mutex
	rows  [][]byte
	bytes int // payload bytes of rows (4 + len each)
	fail  error
	// noted: the I/O goroutine was told this stream holds rows (reset when it empties);
	// full: it was told the batch is full.
	noted, full bool
	closed      bool
	space       chan struct{} // a token when the I/O goroutine took rows
	done        chan struct{} // closed when the request ends
	builder     *proto.RowsBuilder
}

type rowsNote struct {
	s    *stream
	full bool
}

func newStream(d *driver, c *call) *stream {
	return &stream{
		d:     d,
		c:     c,
		limit: int(d.core.MaxFrameSize()),
		space: make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
}

// held is how many bytes a stream may hold before Send blocks: two batches, so the handler
// fills one while the other goes out.
func (s *stream) held() int { return 2 * s.d.batch }

func (s *stream) send(ctx context.Context, row []byte) error {
	if 8+len(row) > s.limit {
		err := Errorf(CodeRowTooLarge, "a row of %d bytes cannot fit a ROWS frame (max_frame_size %d)", len(row), s.limit)
		s.mu.Lock()
		if s.fail == nil {
			s.fail = err
		}
		s.mu.Unlock()
		return err
	}
	for {
		if ctx.Err() != nil {
			return ctxError(ctx)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return Errorf(CodeCancelled, "the stream has ended")
		}
		if s.bytes < s.held() || len(s.rows) == 0 {
			s.rows = append(s.rows, row)
			s.bytes += 4 + len(row)
			var note *rowsNote
			if !s.full && s.bytes >= s.d.batch {
				s.full, s.noted = true, true
				note = &rowsNote{s: s, full: true}
			} else if !s.noted {
				s.noted = true
				note = &rowsNote{s: s}
			}
			s.mu.Unlock()
			if note != nil {
				select {
				case s.d.rowsNote <- *note:
				case <-s.done:
				case <-s.d.quit:
				}
			}
			return nil
		}
		s.mu.Unlock()
		select {
		case <-s.space:
		case <-ctx.Done():
		case <-s.done:
		}
	}
}

// drain sends ROWS frames from the rows held while the stream's credit allows (I/O goroutine);
// it reports whether the stream holds nothing more.
func (s *stream) drain(core *proto.Connection, batch int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	took := false
	for len(s.rows) > 0 && core.CanSendRows(s.c.id) {
		if s.builder == nil {
			b, err := core.Rows(s.c.id)
			if err != nil {
				break
			}
			s.builder = b
		}
		n, err := s.builder.Extend(s.rows, batch)
		if err != nil || n == 0 {
			s.builder.Reset()
			break
		}
		if err := s.builder.Finish(); err != nil {
			s.builder.Reset()
			break
		}
		for _, r := range s.rows[:n] {
			s.bytes -= 4 + len(r)
		}
		clear(s.rows[:n])
		s.rows = s.rows[n:]
		took = true
	}
	if s.bytes < batch {
		s.full = false
	}
	if len(s.rows) == 0 {
		s.rows = nil
		s.noted = false
	}
	if took {
		select {
		case s.space <- struct{}{}:
		default:
		}
	}
	return len(s.rows) == 0
}

func (s *stream) empty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rows) == 0
}

func (s *stream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fail
}

func (s *stream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.rows = nil
		close(s.done)
	}
}
