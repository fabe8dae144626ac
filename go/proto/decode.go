package proto

import (
	"encoding/binary"
	"unicode/utf8"
)

// A receive buffer starts at minReadBuffer bytes and doubles as it is replaced, up to
// maxReadBuffer (or the unread bytes plus what is asked for, when more).
const (
	minReadBuffer = 4 << 10
	maxReadBuffer = 256 << 10
)

// Decoder is the stateless frame decoder (sections 2, 10, 11.1): bytes in, frames out. It
// checks everything decidable from one frame, in the order of 11.1, and checks a header's
// length against MaxFrameSize as soon as its 16 bytes are in, before it waits for or reserves
// room for the payload. It never writes over bytes it has handed out in a frame, so a frame's
// slices stay valid after later calls. The zero Decoder is not usable: use NewDecoder.
type Decoder struct {
	max   uint32
	buf   []byte // buf[off:] is unread; buf[:off] may be referenced by frames handed out
	off   int
	ended bool
	err   error
	next  *header // the checked header of the frame at buf[off:], while its payload arrives
}

// NewDecoder returns a decoder whose receive limit is maxFrameSize.
func NewDecoder(maxFrameSize uint32) *Decoder { return &Decoder{max: maxFrameSize} }

// SetMaxFrameSize changes the receive limit (the connection does it at the handshake).
func (d *Decoder) SetMaxFrameSize(n uint32) { d.max = n }

// MaxFrameSize is the current receive limit.
func (d *Decoder) MaxFrameSize() uint32 { return d.max }

// Write appends received bytes (a copy). It never fails.
func (d *Decoder) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	d.reserve(d.need(len(p)))
	d.buf = append(d.buf, p...)
	return len(p), nil
}

// need is the room to reserve for n more bytes: at least the rest of the frame being received
// once its header's length is within the limit, so a large frame fed in small pieces (TLS
// records, a driver's fixed read chunks) is given its room once, not copied at every piece.
func (d *Decoder) need(n int) int {
	need := max(n, 1)
	if unread := len(d.buf) - d.off; unread >= HeaderSize {
		length := int(binary.LittleEndian.Uint32(d.buf[d.off:]))
		if uint32(length) <= d.max && HeaderSize+length > unread {
			need = max(need, HeaderSize+length-unread)
		}
	}
	return need
}

// reserve makes room for n more bytes after the unread ones without touching bytes already
// handed out: a full buffer is replaced, never compacted in place.
func (d *Decoder) reserve(n int) {
	if cap(d.buf)-len(d.buf) >= n {
		return
	}
	unread := len(d.buf) - d.off
	size := max(min(2*cap(d.buf), maxReadBuffer), minReadBuffer, unread+n)
	nb := make([]byte, unread, size)
	copy(nb, d.buf[d.off:])
	d.buf, d.off = nb, 0
}

// ReadBuffer returns space to read the socket into, at least min bytes, and at least the rest of
// the frame being received once its header has passed the checks (a large frame arrives in one
// read). Report what was read with Received.
func (d *Decoder) ReadBuffer(min int) []byte {
	d.reserve(d.need(min))
	return d.buf[len(d.buf):cap(d.buf)]
}

// Received records that n bytes were read into the slice ReadBuffer returned.
func (d *Decoder) Received(n int) {
	if n < 0 || len(d.buf)+n > cap(d.buf) {
		panic("wirepool/proto: Received beyond the ReadBuffer")
	}
	d.buf = d.buf[:len(d.buf)+n]
}

// IncompleteLen is the number of bytes of a frame that has started but not finished (0 between
// frames): the driver's frame clock (8.5) reads it.
func (d *Decoder) IncompleteLen() int { return len(d.buf) - d.off }

// End says the stream has ended: TRUNCATED when it ended inside a frame, nil otherwise.
func (d *Decoder) End() error {
	d.ended = true
	if d.err != nil {
		return d.err
	}
	if d.off < len(d.buf) {
		if _, err := d.header(); err != nil {
			d.err = err
			return err
		}
		d.err = errf(CodeTruncated, "the stream ended inside a frame (%d bytes of it received)", len(d.buf)-d.off)
		return d.err
	}
	return nil
}

type header struct {
	length int
	rule   *FrameRule
	more   bool
	id     uint64
}

// header checks the header at the front of the unread bytes (11.1 step 1); ok=false when fewer
// than 16 bytes are in.
func (d *Decoder) header() (*header, error) {
	b := d.buf[d.off:]
	if len(b) < HeaderSize {
		return nil, nil
	}
	le := binary.LittleEndian
	length := le.Uint32(b)
	if length > d.max {
		return nil, errf(CodeFrameTooLarge, "a payload of %d bytes, above max_frame_size %d", length, d.max)
	}
	t := FrameType(b[4])
	rule := t.Rule()
	if rule == nil {
		return nil, errf(CodeUnknownFrameType, "frame type 0x%02x", b[4])
	}
	flags := b[5]
	if flags&FlagsReservedMask != 0 {
		return nil, errf(CodeBadFlags, "reserved flag bits 0x%02x on %s", flags&FlagsReservedMask, rule.Name)
	}
	more := flags&FlagMore != 0
	if more && !rule.MoreAllowed {
		return nil, errf(CodeBadFlags, "MORE on %s, which cannot continue", rule.Name)
	}
	if le.Uint16(b[6:]) != 0 {
		return nil, errf(CodeReservedNonzero, "header reserved field 0x%04x", le.Uint16(b[6:]))
	}
	id := le.Uint64(b[8:])
	switch {
	case rule.ID == IDZero && id != 0:
		return nil, errf(CodeBadID, "%s with id %d: a connection-level frame carries 0", rule.Name, id)
	case rule.ID == IDRequest && id == 0:
		return nil, errf(CodeBadID, "%s with id 0: a request-level frame carries its request's id", rule.Name)
	}
	return &header{length: int(length), rule: rule, more: more, id: id}, nil
}

// Next returns the next frame and its payload length, or (nil, 0, nil) when more bytes are
// needed. After an error every call returns it again.
func (d *Decoder) Next() (Frame, int, error) {
	if d.err != nil {
		return nil, 0, d.err
	}
	h := d.next
	if h == nil {
		var err error
		if h, err = d.header(); err != nil {
			d.err = err
			return nil, 0, err
		}
		d.next = h
	}
	if h == nil || len(d.buf)-d.off < HeaderSize+h.length {
		if d.ended && d.off < len(d.buf) {
			d.err = errf(CodeTruncated, "the stream ended inside a frame")
			return nil, 0, d.err
		}
		return nil, 0, nil
	}
	start := d.off + HeaderSize
	end := start + h.length
	payload := d.buf[start:end:end]
	d.off = end
	d.next = nil
	f, err := decodePayload(h, payload)
	if err != nil {
		d.err = err
		return nil, 0, err
	}
	return f, h.length, nil
}

// reader takes fields off a payload; short is the code of a field that does not fit.
type reader struct {
	p     []byte
	pos   int
	short ErrorCode
	what  string
}

func (r *reader) take(n int) ([]byte, error) {
	if n > len(r.p)-r.pos {
		return nil, errf(r.short, "%s: a field of %d bytes runs past the payload's end", r.what, n)
	}
	b := r.p[r.pos : r.pos+n : r.pos+n]
	r.pos += n
	return b, nil
}

func (r *reader) u8() (uint8, error) {
	b, err := r.take(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (r *reader) u16() (uint16, error) {
	b, err := r.take(2)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b), nil
}

func (r *reader) u32() (uint32, error) {
	b, err := r.take(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

// str16 reads a str16: does it fit, is its length in lo..hi (else rangeErr), is it UTF-8.
func (r *reader) str16(field string, lo, hi int, rangeErr ErrorCode) (string, error) {
	n, err := r.u16()
	if err != nil {
		return "", err
	}
	b, err := r.take(int(n))
	if err != nil {
		return "", err
	}
	if int(n) < lo || int(n) > hi {
		return "", errf(rangeErr, "%s %s of %d bytes (%d-%d)", r.what, field, n, lo, hi)
	}
	return text(r.what+" "+field, b)
}

func text(what string, b []byte) (string, error) {
	if !utf8.Valid(b) {
		return "", errf(CodeBadUTF8, "%s is not valid UTF-8", what)
	}
	return string(b), nil
}

func decodePayload(h *header, p []byte) (Frame, error) {
	rule := h.rule
	if rule.PayloadSize >= 0 && len(p) != rule.PayloadSize {
		return nil, errf(CodeBadPayload, "%s payload of %d bytes (exactly %d)", rule.Name, len(p), rule.PayloadSize)
	}
	le := binary.LittleEndian
	switch rule.Type {
	case TypeHello:
		return decodeHello(p)
	case TypeWelcome:
		return decodeWelcome(p)
	case TypeRequest:
		if len(p) < RequestPrefixBytes {
			return nil, errf(CodeBadPayload, "REQUEST payload of %d bytes (at least %d)", len(p), RequestPrefixBytes)
		}
		if p[3] != 0 {
			return nil, errf(CodeReservedNonzero, "REQUEST reserved byte 0x%02x", p[3])
		}
		return &Request{ID: h.id, More: h.more, Method: le.Uint16(p), Codec: p[2], TimeoutUs: le.Uint64(p[4:]), Body: p[RequestPrefixBytes:]}, nil
	case TypeCancel:
		return &Cancel{ID: h.id}, nil
	case TypeResult:
		return &Result{ID: h.id, More: h.more, Body: p}, nil
	case TypeContinuation:
		return &Continuation{ID: h.id, More: h.more, Body: p}, nil
	case TypeError:
		if len(p) < 6 {
			return nil, errf(CodeBadPayload, "ERROR payload of %d bytes (at least 6)", len(p))
		}
		r := &reader{p: p, pos: 4, short: CodeBadPayload, what: "ERROR"}
		msg, err := r.str16("message", 0, ErrorMessageMaxBytes, CodeBadPayload)
		if err != nil {
			return nil, err
		}
		details, err := text("ERROR details", p[r.pos:])
		if err != nil {
			return nil, err
		}
		return &ErrorFrame{ID: h.id, Code: ErrorCode(le.Uint32(p)), Message: msg, Details: details}, nil
	case TypeRows:
		return decodeRows(h.id, p)
	case TypeEnd:
		if len(p) < 8 {
			return nil, errf(CodeBadPayload, "END payload of %d bytes (at least 8)", len(p))
		}
		return &End{ID: h.id, More: h.more, RowCount: le.Uint64(p), Summary: p[8:]}, nil
	case TypeCredit:
		n := le.Uint32(p)
		if n == 0 {
			return nil, errf(CodeBadPayload, "CREDIT of 0 bytes")
		}
		return &Credit{ID: h.id, Bytes: n}, nil
	case TypeEvent:
		r := &reader{p: p, short: CodeBadPayload, what: "EVENT"}
		topic, err := r.str16("topic", EventTopicBytesMin, EventTopicBytesMax, CodeBadPayload)
		if err != nil {
			return nil, err
		}
		data, err := text("EVENT data", p[r.pos:])
		if err != nil {
			return nil, err
		}
		return &Notification{ID: h.id, Topic: topic, Data: data}, nil
	case TypePing:
		f := &Ping{}
		copy(f.Nonce[:], p)
		return f, nil
	case TypePong:
		f := &Pong{}
		copy(f.Nonce[:], p)
		return f, nil
	case TypeDrain:
		return &Drain{GraceMs: le.Uint32(p)}, nil
	case TypeGoodbye:
		return &Goodbye{Reason: le.Uint32(p)}, nil
	}
	return nil, errf(CodeUnknownFrameType, "frame type 0x%02x", uint8(rule.Type))
}

func decodeRows(id uint64, p []byte) (Frame, error) {
	if len(p) < 4 {
		return nil, errf(CodeBadPayload, "ROWS payload of %d bytes (at least 4)", len(p))
	}
	count := binary.LittleEndian.Uint32(p)
	// Bound the count before reserving anything per row.
	if count == 0 || uint64(count) > uint64(len(p)-4)/4 {
		return nil, errf(CodeRowBounds, "ROWS count %d in a payload of %d bytes", count, len(p))
	}
	rows := make([][]byte, count)
	r := &reader{p: p, pos: 4, short: CodeRowBounds, what: "ROWS"}
	for i := range rows {
		n, err := r.u32()
		if err != nil {
			return nil, err
		}
		if rows[i], err = r.take(int(n)); err != nil {
			return nil, err
		}
	}
	if r.pos != len(p) {
		return nil, errf(CodeRowBounds, "%d bytes left over after %d rows", len(p)-r.pos, count)
	}
	return &Rows{ID: id, Rows: rows, PayloadLen: len(p)}, nil
}

func decodeHello(p []byte) (Frame, error) {
	if len(p) < len(Magic) || string(p[:len(Magic)]) != Magic {
		return nil, errf(CodeBadMagic, "HELLO does not start with %q", Magic)
	}
	if len(p) < HelloFixedBytes {
		return nil, errf(CodeBadPayload, "HELLO payload of %d bytes (at least %d)", len(p), HelloFixedBytes)
	}
	le := binary.LittleEndian
	h := &Hello{MinVersion: le.Uint16(p[8:]), MaxVersion: le.Uint16(p[10:]), Pid: le.Uint32(p[12:]),
		MaxConcurrency: le.Uint32(p[16:]), MaxFrameSize: le.Uint32(p[20:])}
	switch {
	case h.MinVersion < 1 || h.MinVersion > h.MaxVersion:
		return nil, errf(CodeBadHandshake, "HELLO versions %d-%d", h.MinVersion, h.MaxVersion)
	case h.MaxConcurrency < 1:
		return nil, errf(CodeBadHandshake, "HELLO max_concurrency 0")
	case h.MaxFrameSize < MinMaxFrameSize || h.MaxFrameSize > MaxMaxFrameSize:
		return nil, errf(CodeBadHandshake, "HELLO max_frame_size %d (%d-%d)", h.MaxFrameSize, MinMaxFrameSize, MaxMaxFrameSize)
	}
	r := &reader{p: p, pos: HelloFixedBytes, short: CodeBadPayload, what: "HELLO"}
	var err error
	if h.SDKName, err = r.str16("sdk_name", SDKNameBytesMin, SDKNameBytesMax, CodeBadHandshake); err != nil {
		return nil, err
	}
	if h.SDKVersion, err = r.str16("sdk_version", SDKVersionBytesMin, SDKVersionBytesMax, CodeBadHandshake); err != nil {
		return nil, err
	}
	count, err := r.u16()
	if err != nil {
		return nil, err
	}
	if count > MaxMethods {
		return nil, errf(CodeBadHandshake, "HELLO method_count %d (at most %d)", count, MaxMethods)
	}
	h.Methods = make([]Method, 0, min(int(count), (len(p)-r.pos)/5))
	names := make(map[string]struct{}, cap(h.Methods))
	for range count {
		kind, err := r.u8()
		if err != nil {
			return nil, err
		}
		if MethodKind(kind) != KindUnary && MethodKind(kind) != KindStream {
			return nil, errf(CodeBadHandshake, "HELLO method kind %d", kind)
		}
		n, err := r.u8()
		if err != nil {
			return nil, err
		}
		if n < 1 || n > MaxCodecsPerMethod {
			return nil, errf(CodeBadHandshake, "HELLO method codec_count %d (1-%d)", n, MaxCodecsPerMethod)
		}
		codecs, err := r.take(int(n))
		if err != nil {
			return nil, err
		}
		var seen [256]bool
		for _, c := range codecs {
			if seen[c] {
				return nil, errf(CodeBadHandshake, "HELLO method lists codec %d twice", c)
			}
			seen[c] = true
		}
		name, err := r.str16("method name", MethodNameBytesMin, MethodNameBytesMax, CodeBadHandshake)
		if err != nil {
			return nil, err
		}
		if _, dup := names[name]; dup {
			return nil, errf(CodeBadHandshake, "HELLO lists method %q twice", name)
		}
		names[name] = struct{}{}
		h.Methods = append(h.Methods, Method{Name: name, Kind: MethodKind(kind), Codecs: codecs})
	}
	if r.pos < len(p) {
		h.Trailing = p[r.pos:]
	}
	return h, nil
}

func decodeWelcome(p []byte) (Frame, error) {
	if len(p) < WelcomeBytes {
		return nil, errf(CodeBadPayload, "WELCOME payload of %d bytes (at least %d)", len(p), WelcomeBytes)
	}
	le := binary.LittleEndian
	if r := le.Uint16(p[2:]); r != 0 {
		return nil, errf(CodeReservedNonzero, "WELCOME reserved field 0x%04x", r)
	}
	w := &Welcome{Version: le.Uint16(p), WorkerID: le.Uint32(p[4:]), MaxFrameSize: le.Uint32(p[8:]),
		InitialCredit: le.Uint32(p[12:]), HeartbeatMs: le.Uint32(p[16:]), MaxInFlight: le.Uint32(p[20:]),
		MaxMessageSize: le.Uint64(p[24:])}
	switch {
	case w.MaxFrameSize < MinMaxFrameSize || w.MaxFrameSize > MaxMaxFrameSize:
		return nil, errf(CodeBadHandshake, "WELCOME max_frame_size %d (%d-%d)", w.MaxFrameSize, MinMaxFrameSize, MaxMaxFrameSize)
	case w.InitialCredit < 1 || w.InitialCredit > MaxCredit:
		return nil, errf(CodeBadHandshake, "WELCOME initial_credit %d (1-%d)", w.InitialCredit, MaxCredit)
	case w.MaxInFlight < 1:
		return nil, errf(CodeBadHandshake, "WELCOME max_in_flight 0")
	case w.MaxMessageSize < uint64(w.MaxFrameSize):
		return nil, errf(CodeBadHandshake, "WELCOME max_message_size %d below max_frame_size %d", w.MaxMessageSize, w.MaxFrameSize)
	}
	if len(p) > WelcomeBytes {
		w.Trailing = p[WelcomeBytes:]
	}
	return w, nil
}
