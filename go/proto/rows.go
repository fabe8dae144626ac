package proto

import "encoding/binary"

// RowsBuilder fills one ROWS frame of a stream (worker, 14.3): Append rows, then Finish, which
// checks the stream again, charges its credit, counts the rows and writes the frame. A builder
// touches the core only in Finish, so it may be filled on another goroutine and finished on the
// one that owns the core. After Finish (or Reset) it is empty and may be filled again.
type RowsBuilder struct {
	conn  *Connection
	id    uint64
	limit int    // the frame's payload limit, fixed when the builder was made
	buf   []byte // header, count, rows
	count uint32
}

// Rows returns a builder for ROWS frames of stream id. It checks the stream now (UNKNOWN_ID,
// KIND_MISMATCH, FLOW_CONTROL, as a ROWS send would), and Finish checks it again, since CANCEL
// or a deadline may end the stream while the builder fills.
func (c *Connection) Rows(id uint64) (*RowsBuilder, error) {
	if err := c.checkRows(id); err != nil {
		return nil, err
	}
	b := &RowsBuilder{conn: c, id: id, limit: c.sendLimit()}
	b.Reset()
	return b, nil
}

func (c *Connection) checkRows(id uint64) error {
	req, err := c.requestOf(TypeRows, id, KindStream)
	if err != nil {
		return err
	}
	if req.credit <= 0 {
		return refuse(CodeFlowControl, "ROWS for stream %d while its credit is %d", id, req.credit)
	}
	return nil
}

// ID is the stream's request id.
func (b *RowsBuilder) ID() uint64 { return b.id }

// Count is the number of rows appended.
func (b *RowsBuilder) Count() int { return int(b.count) }

// PayloadLen is the frame's payload size so far (count and length prefixes included).
func (b *RowsBuilder) PayloadLen() int { return len(b.buf) - HeaderSize }

// Reset withdraws every row appended.
func (b *RowsBuilder) Reset() {
	b.buf = append(b.buf[:0], make([]byte, HeaderSize+4)...)
	b.count = 0
}

// Append adds a row (a copy). It returns false, appending nothing, when the row does not fit in
// this frame (finish it and append to the next), and ROW_TOO_LARGE when it cannot fit in any
// ROWS frame of this connection (the stream ends with that code, section 13).
func (b *RowsBuilder) Append(row []byte) (bool, error) {
	if 8+len(row) > b.limit {
		return false, refuse(CodeRowTooLarge, "a row of %d bytes cannot fit a ROWS frame (max_frame_size %d)", len(row), b.limit)
	}
	if b.PayloadLen()+4+len(row) > b.limit {
		return false, nil
	}
	b.buf = binary.LittleEndian.AppendUint32(b.buf, uint32(len(row)))
	b.buf = append(b.buf, row...)
	b.count++
	return true, nil
}

// Extend appends rows from the front of rows until the frame would pass target payload bytes
// (or the frame's limit); it returns how many it took (14.4).
func (b *RowsBuilder) Extend(rows [][]byte, target int) (int, error) {
	target = min(target, b.limit)
	for i, r := range rows {
		if b.count > 0 && b.PayloadLen()+4+len(r) > target {
			return i, nil
		}
		ok, err := b.Append(r)
		if err != nil || !ok {
			return i, err
		}
	}
	return len(rows), nil
}

// Finish writes the frame: every check of a ROWS send (the stream in flight, its kind, credit
// positive, at least one row), then it charges the stream's credit with the payload length and
// counts the rows. A refusal leaves the builder as it was and writes nothing.
func (b *RowsBuilder) Finish() error {
	c := b.conn
	if err := c.checkRows(b.id); err != nil {
		return err
	}
	if b.count == 0 {
		return refuse(CodeRowBounds, "a ROWS frame needs at least one row")
	}
	n := b.PayloadLen()
	if n > c.sendLimit() {
		return refuse(CodeFrameTooLarge, "ROWS payload of %d bytes above max_frame_size %d", n, c.sendLimit())
	}
	binary.LittleEndian.PutUint32(b.buf[0:], uint32(n))
	b.buf[4], b.buf[5], b.buf[6], b.buf[7] = byte(TypeRows), 0, 0, 0
	binary.LittleEndian.PutUint64(b.buf[8:], b.id)
	binary.LittleEndian.PutUint32(b.buf[16:], b.count)
	c.out = append(c.out, b.buf...)
	req := c.reqs[b.id]
	req.credit -= int64(n)
	req.rows += uint64(b.count)
	b.Reset()
	return nil
}
