package proto

import (
	"slices"
)

// Role is the side a Connection plays.
type Role uint8

// The two roles.
const (
	Parent Role = iota + 1
	Worker
)

func (r Role) String() string {
	if r == Parent {
		return "parent"
	}
	return "worker"
}

// request is a request in flight (12.2, 12.3).
type request struct {
	kind     MethodKind
	credit   int64 // stream credit (section 6)
	rows     uint64
	consumed int64 // parent: bytes read since the last grant
	window   int64 // parent: the adaptive window (section 6), InitialCredit at first
	clock    int64 // parent: the driver's clock at the last grant, microseconds (-1: no read yet)
}

// inMsg is a continued message being received (section 5).
type inMsg struct {
	first  Frame    // *Request, *Result or *End, its chunk first in chunks
	chunks [][]byte // the body's parts as they arrived (aliasing the receive buffer), joined at the end
	size   uint64   // payload bytes so far, prefix included
}

// body joins the chunks: one copy, made once the message is complete, so a message refused as
// it grows (MESSAGE_TOO_LARGE) never costs more than the bytes received.
func (p *inMsg) body() []byte {
	if len(p.chunks) == 1 {
		return p.chunks[0]
	}
	n := 0
	for _, c := range p.chunks {
		n += len(c)
	}
	b := make([]byte, 0, n)
	for _, c := range p.chunks {
		b = append(b, c...)
	}
	return b
}

// outMsg is a continued message being sent.
type outMsg struct {
	typ    FrameType
	body   []byte // the rest to send
	manual bool   // frames given by hand through Send
	size   int    // manual: payload bytes sent so far
}

// Connection is the sans-IO core of one connection (section 14), for either role: bytes in,
// events out, sends checked and encoded into an output the driver takes with TakeOutput. It
// owns no socket, clock, goroutine or handler, and is not safe for concurrent use: one
// goroutine (the driver's I/O loop) owns it. A RowsBuilder may be filled elsewhere and finished
// on that goroutine.
type Connection struct {
	role     Role
	dec      *Decoder
	hello    *Hello
	welcome  *Welcome
	open     bool
	highest  uint64
	reqs     map[uint64]*request
	rejected map[uint64]struct{} // worker: rejected ids not yet answered
	inbound  map[uint64]*inMsg
	inSum    uint64
	outbound map[uint64]*outMsg
	draining bool
	goodbye  bool // GOODBYE sent (worker) or received (parent)
	fatal    bool // a fatal ERROR (id 0) was sent
	failure  *ProtocolError
	out      []byte
	urgent   []byte // PING and PONG: ahead of out at the next frame boundary (8.5)
	// Parent: the smallest PING round trip the driver observed, microseconds (0: none), and
	// section 6's caps on the adaptive windows.
	minRTTUs      int64
	maxStreamWin  int64
	maxConnWindow int64
}

// NewConnection returns a core for role; before the handshake its receive limit is 65,536.
func NewConnection(role Role) *Connection {
	if role != Parent && role != Worker {
		panic("wirepool/proto: NewConnection with an unknown role")
	}
	return &Connection{
		role:     role,
		dec:      NewDecoder(HandshakeMaxFrameSize),
		reqs:     make(map[uint64]*request),
		rejected: make(map[uint64]struct{}),
		inbound:  make(map[uint64]*inMsg),
		outbound: make(map[uint64]*outMsg),

		maxStreamWin:  MaxStreamWindow,
		maxConnWindow: MaxConnectionWindow,
	}
}

// ---------------------------------------------------------------------------------------------
// Receiving (14.2)

// Receive appends received bytes (a copy).
func (c *Connection) Receive(b []byte) { _, _ = c.dec.Write(b) }

// ReadBuffer is the zero-copy receive: space to read the socket into (at least min bytes, and
// the rest of the current frame once its header is checked); then call Received.
func (c *Connection) ReadBuffer(min int) []byte { return c.dec.ReadBuffer(min) }

// Received records that n bytes were read into the ReadBuffer.
func (c *Connection) Received(n int) { c.dec.Received(n) }

// IncompleteFrameLen is the bytes of a frame that has started but not finished (8.5).
func (c *Connection) IncompleteFrameLen() int { return c.dec.IncompleteLen() }

// NextEvent returns the next event, or (nil, nil) when more bytes are needed. A protocol
// violation is a *ProtocolError and fails the core: every later call returns it again, and only
// a fatal report (SendFatal) may be sent.
func (c *Connection) NextEvent() (Event, error) {
	if c.failure != nil {
		return nil, c.failure
	}
	for {
		f, size, err := c.dec.Next()
		if err != nil {
			return nil, c.fail(err)
		}
		if f == nil {
			return nil, nil
		}
		ev, err := c.onFrame(f, uint64(size))
		if err != nil {
			return nil, c.fail(err)
		}
		if ev != nil {
			return ev, nil
		}
	}
}

// NextEvents appends every event available now to out (14.4). On a violation the events before
// it are appended and the error is returned.
func (c *Connection) NextEvents(out []Event) ([]Event, error) {
	for {
		ev, err := c.NextEvent()
		if err != nil || ev == nil {
			return out, err
		}
		out = append(out, ev)
	}
}

// EndOfInput says the peer closed: TRUNCATED inside a frame, otherwise nil. The driver then ends
// what is in flight (InFlightIDs).
func (c *Connection) EndOfInput() error {
	if c.failure != nil {
		return c.failure
	}
	if err := c.dec.End(); err != nil {
		return c.fail(err)
	}
	return nil
}

func (c *Connection) fail(err error) error {
	if pe, ok := err.(*ProtocolError); ok {
		c.failure = pe
	} else {
		c.failure = errf(CodeProtocol, "%v", err)
	}
	return c.failure
}

func (c *Connection) onFrame(f Frame, size uint64) (Event, error) {
	t, id := f.Type(), f.RequestID()
	// 1. ERROR with id 0: a refusal or a fatal report, in any state.
	if t == TypeError && id == 0 {
		return f.(*ErrorFrame), nil
	}
	// 2-3. Handshake phase and direction.
	if c.role == Parent {
		if c.hello == nil {
			h, ok := f.(*Hello)
			if !ok {
				return nil, errf(CodeUnexpectedFrame, "%s before HELLO", t)
			}
			if h.MinVersion > ProtocolVersion || h.MaxVersion < ProtocolVersion {
				return nil, errf(CodeVersionMismatch, "the worker speaks versions %d-%d, this parent %d", h.MinVersion, h.MaxVersion, ProtocolVersion)
			}
			c.hello = h
			return h, nil
		}
		switch {
		case !c.open:
			return nil, errf(CodeUnexpectedFrame, "%s before WELCOME was sent", t)
		case c.goodbye:
			return nil, errf(CodeUnexpectedFrame, "%s after GOODBYE", t)
		case !parentReceives(t):
			return nil, errf(CodeUnexpectedFrame, "%s sent to the parent", t)
		}
	} else {
		if c.welcome == nil {
			w, ok := f.(*Welcome)
			if c.hello == nil || !ok {
				return nil, errf(CodeUnexpectedFrame, "%s before WELCOME", t)
			}
			h := c.hello
			if w.Version < h.MinVersion || w.Version > h.MaxVersion {
				return nil, errf(CodeVersionMismatch, "WELCOME version %d outside this worker's %d-%d", w.Version, h.MinVersion, h.MaxVersion)
			}
			if w.MaxFrameSize > h.MaxFrameSize {
				return nil, errf(CodeBadHandshake, "WELCOME max_frame_size %d above the HELLO's %d", w.MaxFrameSize, h.MaxFrameSize)
			}
			if w.MaxInFlight > h.MaxConcurrency {
				return nil, errf(CodeBadHandshake, "WELCOME max_in_flight %d above the HELLO's max_concurrency %d", w.MaxInFlight, h.MaxConcurrency)
			}
			c.welcome, c.open = w, true
			c.dec.SetMaxFrameSize(w.MaxFrameSize)
			return w, nil
		}
		if !workerReceives(t) {
			if t == TypeError {
				return nil, errf(CodeUnexpectedFrame, "ERROR from the parent with request id %d (a request is stopped with CANCEL)", id)
			}
			return nil, errf(CodeUnexpectedFrame, "%s sent to the worker", t)
		}
	}
	// 4. Connection-level frames.
	if id == 0 {
		switch f.(type) {
		case *Drain:
			c.draining = true
		case *Goodbye:
			c.goodbye = true
		}
		return f.(Event), nil
	}
	// 5. Id.
	if r, ok := f.(*Request); ok {
		if id <= c.highest {
			return nil, errf(CodeDuplicateID, "REQUEST id %d not above %d", id, c.highest)
		}
		c.highest = id
		if r.More {
			return nil, c.startInbound(r, r.Body, size)
		}
		return c.accept(r), nil
	}
	if id > c.highest {
		return nil, errf(CodeUnknownID, "%s for id %d, above every request (%d)", t, id, c.highest)
	}
	// 6. Continuation.
	if p := c.inbound[id]; p != nil {
		switch f := f.(type) {
		case *Continuation:
			return c.continueInbound(p, f, size)
		case *Cancel:
			if c.role == Worker {
				c.dropInbound(id, p)
				return c.reject(id, CodeCancelled), nil
			}
		case *ErrorFrame:
			if c.role == Parent {
				c.dropInbound(id, p)
				delete(c.reqs, id)
				return f, nil
			}
		}
		return nil, errf(CodeContinuation, "%s for id %d while its message is in progress", t, id)
	}
	if t == TypeContinuation {
		return nil, errf(CodeContinuation, "CONTINUATION for id %d with no message in progress", id)
	}
	// 7. Late.
	req := c.reqs[id]
	if req == nil {
		return &Late{ID: id, Frame: t}, nil
	}
	// 8-9. Kind and counters.
	if c.role == Worker {
		if cr, ok := f.(*Credit); ok {
			if req.kind != KindStream {
				return nil, errf(CodeKindMismatch, "CREDIT for unary request %d", id)
			}
			if req.credit+int64(cr.Bytes) > MaxCredit {
				return nil, errf(CodeCreditOverflow, "credit %d + %d above %d", req.credit, cr.Bytes, MaxCredit)
			}
			req.credit += int64(cr.Bytes)
		}
		return f.(Event), nil // CANCEL or CREDIT
	}
	switch f := f.(type) {
	case *Rows:
		if req.kind != KindStream {
			return nil, errf(CodeKindMismatch, "ROWS for unary request %d", id)
		}
		if req.credit <= 0 {
			return nil, errf(CodeFlowControl, "ROWS for request %d while its credit is %d", id, req.credit)
		}
		req.credit -= int64(size)
		req.rows += uint64(len(f.Rows))
		return f, nil
	case *End:
		if req.kind != KindStream {
			return nil, errf(CodeKindMismatch, "END for unary request %d", id)
		}
		if f.RowCount != req.rows {
			return nil, errf(CodeRowCountMismatch, "END says %d rows, %d arrived", f.RowCount, req.rows)
		}
		if f.More {
			return nil, c.startInbound(f, f.Summary, size)
		}
		delete(c.reqs, id)
		return f, nil
	case *Result:
		if req.kind != KindUnary {
			return nil, errf(CodeKindMismatch, "RESULT for stream %d", id)
		}
		if f.More {
			return nil, c.startInbound(f, f.Body, size)
		}
		delete(c.reqs, id)
		return f, nil
	case *ErrorFrame:
		delete(c.reqs, id)
		return f, nil
	}
	return f.(Event), nil // EVENT with a request id
}

func parentReceives(t FrameType) bool {
	switch t {
	case TypeResult, TypeError, TypeRows, TypeEnd, TypeEvent, TypePing, TypePong, TypeGoodbye, TypeContinuation:
		return true
	}
	return false
}

func workerReceives(t FrameType) bool {
	switch t {
	case TypeRequest, TypeCancel, TypeCredit, TypePing, TypePong, TypeDrain, TypeContinuation:
		return true
	}
	return false // ERROR reaches the worker with id 0 only, handled first
}

func (c *Connection) startInbound(first Frame, chunk []byte, size uint64) error {
	p := &inMsg{first: first, size: size, chunks: [][]byte{chunk}}
	c.inbound[first.RequestID()] = p
	c.inSum += size
	return c.checkInSum()
}

// checkInSum bounds the memory held for the peer per connection (section 5).
func (c *Connection) checkInSum() error {
	if limit := c.welcome.MaxMessageSize; c.inSum > limit {
		return errf(CodeMessageTooLarge, "messages in progress hold %d bytes, above max_message_size %d", c.inSum, limit)
	}
	return nil
}

func (c *Connection) dropInbound(id uint64, p *inMsg) {
	delete(c.inbound, id)
	c.inSum -= p.size
}

func (c *Connection) continueInbound(p *inMsg, f *Continuation, size uint64) (Event, error) {
	limit := c.welcome.MaxMessageSize
	p.size += size
	c.inSum += size
	if p.size > limit {
		return nil, errf(CodeMessageTooLarge, "a continued message of %d bytes, above max_message_size %d", p.size, limit)
	}
	if err := c.checkInSum(); err != nil {
		return nil, err
	}
	p.chunks = append(p.chunks, f.Body) // checked before it grows
	if f.More {
		return nil, nil
	}
	id := f.ID
	c.dropInbound(id, p)
	switch first := p.first.(type) {
	case *Request:
		r := *first
		r.More, r.Body = false, p.body()
		return c.accept(&r), nil
	case *Result:
		delete(c.reqs, id)
		return &Result{ID: id, Body: p.body()}, nil
	case *End:
		delete(c.reqs, id)
		return &End{ID: id, RowCount: first.RowCount, Summary: p.body()}, nil
	}
	panic("unreachable")
}

// accept runs the worker's checks of 11.2 step 10 on a complete REQUEST.
func (c *Connection) accept(r *Request) Event {
	methods := c.hello.Methods
	switch {
	case c.draining:
		return c.reject(r.ID, CodeDraining)
	case int(r.Method) >= len(methods):
		return c.reject(r.ID, CodeUnknownMethod)
	case !slices.Contains(methods[r.Method].Codecs, r.Codec):
		return c.reject(r.ID, CodeCodecUnsupported)
	case len(c.reqs) >= int(c.welcome.MaxInFlight):
		return c.reject(r.ID, CodeOverloaded)
	}
	c.reqs[r.ID] = c.newRequest(methods[r.Method].Kind)
	return r
}

func (c *Connection) newRequest(kind MethodKind) *request {
	req := &request{kind: kind, clock: -1}
	if kind == KindStream {
		req.credit = int64(c.welcome.InitialCredit)
		req.window = req.credit
	}
	return req
}

func (c *Connection) reject(id uint64, code ErrorCode) Event {
	c.rejected[id] = struct{}{}
	return &Reject{ID: id, Code: code}
}

// ---------------------------------------------------------------------------------------------
// Queries (14.3)

// Role is the side this core plays.
func (c *Connection) Role() Role { return c.role }

// IsOpen reports whether the handshake is done (and the connection has not failed).
func (c *Connection) IsOpen() bool { return c.open && c.failure == nil && !c.fatal }

// Hello is the HELLO received (parent) or sent (worker), or nil.
func (c *Connection) Hello() *Hello { return c.hello }

// Welcome is the WELCOME sent (parent) or received (worker), or nil.
func (c *Connection) Welcome() *Welcome { return c.welcome }

// MaxFrameSize is the current frame limit: 65,536 before the handshake, then WELCOME's.
func (c *Connection) MaxFrameSize() uint32 {
	if c.open {
		return c.welcome.MaxFrameSize
	}
	return HandshakeMaxFrameSize
}

// InFlight is the number of requests in flight (11.2, "Counting").
func (c *Connection) InFlight() int { return len(c.reqs) }

// InFlightIDs are the ids in flight, in increasing order.
func (c *Connection) InFlightIDs() []uint64 {
	ids := make([]uint64, 0, len(c.reqs))
	for id := range c.reqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// IsInFlight reports whether request id is in flight.
func (c *Connection) IsInFlight(id uint64) bool { return c.reqs[id] != nil }

// CanSendRequest reports whether SendRequest would pass the connection's checks (open, parent,
// not draining, below max_in_flight).
func (c *Connection) CanSendRequest() bool {
	return c.role == Parent && c.IsOpen() && !c.goodbye && !c.draining && len(c.reqs) < int(c.welcome.MaxInFlight)
}

// Credit is stream id's credit (ok false when it is not a stream in flight).
func (c *Connection) Credit(id uint64) (credit int64, ok bool) {
	req := c.reqs[id]
	if req == nil || req.kind != KindStream {
		return 0, false
	}
	return req.credit, true
}

// Window is stream id's window, the credit kept outstanding for it: InitialCredit unless
// ConsumedAt adapted it (section 6); ok false when it is not a stream in flight.
func (c *Connection) Window(id uint64) (window int64, ok bool) {
	req := c.reqs[id]
	if req == nil || req.kind != KindStream {
		return 0, false
	}
	return req.window, true
}

// CanSendRows reports whether a ROWS frame for id may be sent now (worker, credit positive).
func (c *Connection) CanSendRows(id uint64) bool {
	req := c.reqs[id]
	return c.role == Worker && c.IsOpen() && !c.goodbye && req != nil && req.kind == KindStream && req.credit > 0 && c.outbound[id] == nil
}

// IsDraining reports whether DRAIN was sent (parent) or received (worker).
func (c *Connection) IsDraining() bool { return c.draining }

// IsGoodbye reports whether GOODBYE was received (parent) or sent (worker).
func (c *Connection) IsGoodbye() bool { return c.goodbye }

// Failure is the protocol violation that failed the core, or nil.
func (c *Connection) Failure() *ProtocolError { return c.failure }

// ---------------------------------------------------------------------------------------------
// Output

// OutputLen is the number of bytes written and not yet taken.
func (c *Connection) OutputLen() int { return len(c.urgent) + len(c.out) }

// TakeOutput returns the bytes to write, whole frames only, and hands them over (the core
// keeps no reference to what it returns). PINGs and PONGs come first, ahead of every frame not
// yet taken (8.5); then whole frames while fewer than max bytes are taken (the frame that
// reaches max is taken whole); max < 0 takes everything. So a driver that takes at most what its
// transport should hold keeps every frame boundary, and a PING written later still goes ahead.
func (c *Connection) TakeOutput(max int) []byte {
	cut := len(c.out)
	if max >= 0 {
		cut = 0
		for cut < len(c.out) && len(c.urgent)+cut < max {
			cut += HeaderSize + int(uint32(c.out[cut])|uint32(c.out[cut+1])<<8|uint32(c.out[cut+2])<<16|uint32(c.out[cut+3])<<24)
		}
	}
	if len(c.urgent) == 0 && cut == len(c.out) {
		b := c.out
		c.out = nil
		return b
	}
	b := append(c.urgent, c.out[:cut]...)
	c.urgent = nil
	c.out = c.out[cut:]
	return b
}
