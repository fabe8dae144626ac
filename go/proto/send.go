package proto

import (
	"encoding/binary"
	"strings"
)

// Cursor names a message written one frame at a time (BeginRequest, BeginResult, BeginEnd, then
// SendNextFrame until it reports done).
type Cursor struct {
	id  uint64
	typ FrameType
}

// ID is the request id of the message.
func (c Cursor) ID() uint64 { return c.id }

func refuse(code ErrorCode, format string, args ...any) error { return errf(code, format, args...) }

// sendLimit is the frame limit of what this side sends.
func (c *Connection) sendLimit() int {
	if c.open {
		return int(c.welcome.MaxFrameSize)
	}
	return HandshakeMaxFrameSize
}

func (c *Connection) canSend(t FrameType) bool {
	if c.role == Parent {
		switch t {
		case TypeWelcome, TypeRequest, TypeCancel, TypeCredit, TypePing, TypePong, TypeDrain, TypeContinuation, TypeError:
			return true
		}
		return false
	}
	switch t {
	case TypeHello, TypeResult, TypeError, TypeRows, TypeEnd, TypeEvent, TypePing, TypePong, TypeContinuation, TypeGoodbye:
		return true
	}
	return false
}

// checkSend is what every send shares (UNEXPECTED_FRAME): a failed or reported connection,
// GOODBYE, a type this side cannot send, the handshake phase.
func (c *Connection) checkSend(t FrameType, id uint64) error {
	fatalReport := t == TypeError && id == 0
	if c.fatal {
		return refuse(CodeUnexpectedFrame, "nothing can be sent after a fatal ERROR")
	}
	if fatalReport {
		return nil
	}
	if c.failure != nil {
		return refuse(CodeUnexpectedFrame, "the connection failed (%s): only SendFatal is allowed", c.failure.Name())
	}
	if c.goodbye {
		return refuse(CodeUnexpectedFrame, "%s after GOODBYE", t)
	}
	if !c.canSend(t) {
		return refuse(CodeUnexpectedFrame, "the %s cannot send %s", c.role, t)
	}
	if c.role == Parent && t == TypeError {
		return refuse(CodeUnexpectedFrame, "the parent sends ERROR with id 0 only (a request is stopped with CANCEL)")
	}
	if !c.open {
		if c.role == Parent && t == TypeWelcome && c.hello != nil {
			return nil
		}
		if c.role == Worker && t == TypeHello && c.hello == nil {
			return nil
		}
		return refuse(CodeUnexpectedFrame, "%s before the handshake", t)
	}
	if t == TypeHello || t == TypeWelcome {
		return refuse(CodeUnexpectedFrame, "a second %s", t)
	}
	return nil
}

// inFlightFor is a request-level send's check: the id is in flight and not mid-message.
func (c *Connection) inFlightFor(t FrameType, id uint64) (*request, error) {
	req := c.reqs[id]
	if req == nil {
		return nil, refuse(CodeUnknownID, "%s for id %d, not in flight", t, id)
	}
	if c.outbound[id] != nil {
		return nil, refuse(CodeContinuation, "%s for id %d while its message is being sent", t, id)
	}
	return req, nil
}

func (c *Connection) checkMessageSize(what string, total int) error {
	if limit := c.welcome.MaxMessageSize; uint64(total) > limit {
		return refuse(CodeMessageTooLarge, "the %s of %d bytes is above max_message_size %d", what, total, limit)
	}
	return nil
}

// writeChecked encodes a handshake frame, checks it as the peer's decoder will (every 11.1
// rule), and writes it.
func (c *Connection) writeChecked(f Frame) error {
	if n, limit := PayloadLen(f), c.sendLimit(); n > limit {
		return refuse(CodeFrameTooLarge, "%s payload of %d bytes above max_frame_size %d", f.Type(), n, limit)
	}
	b, err := AppendFrame(nil, f)
	if err != nil {
		return err
	}
	probe := NewDecoder(uint32(c.sendLimit()))
	_, _ = probe.Write(b)
	if _, _, err := probe.Next(); err != nil {
		return err
	}
	c.out = append(c.out, b...)
	return nil
}

// SendHello sends the worker's offer (4.1), its fields checked as a parent checks them.
func (c *Connection) SendHello(h *Hello) error {
	if err := c.checkSend(TypeHello, 0); err != nil {
		return err
	}
	h = cloneHello(h)
	if err := c.writeChecked(h); err != nil {
		return err
	}
	c.hello = h
	return nil
}

func cloneHello(h *Hello) *Hello {
	x := *h
	x.Methods = make([]Method, len(h.Methods))
	for i, m := range h.Methods {
		x.Methods[i] = Method{Name: m.Name, Kind: m.Kind, Codecs: append([]uint8(nil), m.Codecs...)}
	}
	x.Trailing = append([]byte(nil), h.Trailing...)
	return &x
}

// SendWelcome answers HELLO (4.2), checked against it; the connection is then open with its
// limits in both directions. Negotiate computes a WELCOME from the parent's offer.
func (c *Connection) SendWelcome(w *Welcome) error {
	if err := c.checkSend(TypeWelcome, 0); err != nil {
		return err
	}
	h := c.hello
	if w.Version != ProtocolVersion || w.Version < h.MinVersion || w.Version > h.MaxVersion {
		return refuse(CodeVersionMismatch, "version %d: this parent speaks %d, the worker %d-%d", w.Version, ProtocolVersion, h.MinVersion, h.MaxVersion)
	}
	if w.MaxFrameSize > h.MaxFrameSize {
		return refuse(CodeBadHandshake, "max_frame_size %d above the worker's %d", w.MaxFrameSize, h.MaxFrameSize)
	}
	if w.MaxInFlight > h.MaxConcurrency {
		return refuse(CodeBadHandshake, "max_in_flight %d above the worker's max_concurrency %d", w.MaxInFlight, h.MaxConcurrency)
	}
	x := *w
	x.Trailing = append([]byte(nil), w.Trailing...)
	if err := c.writeChecked(&x); err != nil {
		return err
	}
	c.welcome, c.open = &x, true
	c.dec.SetMaxFrameSize(x.MaxFrameSize)
	return nil
}

// Refuse refuses the HELLO (parent): ERROR id 0 with code, e.g. CodeCodecMismatch; then close.
func (c *Connection) Refuse(code ErrorCode, message string) error {
	return c.SendError(0, code, message, "")
}

// SendFatal reports a fatal error (ERROR id 0 with its code, its message for people); nothing
// can be sent after it. It is the only send a failed core accepts.
func (c *Connection) SendFatal(err *ProtocolError) error {
	return c.SendError(0, err.Code, err.Message, "")
}

// SendRequest sends a request (parent) and returns the id the core allocated (1, 2, 3, ...); a
// body larger than one frame is split into CONTINUATION frames, all written now.
func (c *Connection) SendRequest(method uint16, codec uint8, timeoutUs uint64, body []byte) (uint64, error) {
	cur, err := c.BeginRequest(method, codec, timeoutUs, body)
	if err != nil {
		return 0, err
	}
	for {
		done, err := c.SendNextFrame(cur)
		if err != nil || done {
			return cur.id, err
		}
	}
}

// SendRequests sends one REQUEST per body, ids consecutive, and returns the first id (14.4).
// The batch is checked whole first, so a refusal writes nothing.
func (c *Connection) SendRequests(method uint16, codec uint8, timeoutUs uint64, bodies [][]byte) (uint64, error) {
	if err := c.checkRequest(method, uint64(len(bodies))); err != nil {
		return 0, err
	}
	for _, b := range bodies {
		if err := c.checkMessageSize("request body", RequestPrefixBytes+len(b)); err != nil {
			return 0, err
		}
	}
	first := c.highest + 1
	for _, b := range bodies {
		if _, err := c.SendRequest(method, codec, timeoutUs, b); err != nil {
			return first, err
		}
	}
	return first, nil
}

func (c *Connection) checkRequest(method uint16, n uint64) error {
	if err := c.checkSend(TypeRequest, 1); err != nil {
		return err
	}
	if c.draining {
		return refuse(CodeDraining, "no REQUEST can be sent after DRAIN")
	}
	if int(method) >= len(c.hello.Methods) {
		return refuse(CodeUnknownMethod, "method index %d not in the worker's HELLO (%d methods)", method, len(c.hello.Methods))
	}
	if uint64(len(c.reqs))+n > uint64(c.welcome.MaxInFlight) {
		return refuse(CodeOverloaded, "%d requests already in flight (max_in_flight %d)", len(c.reqs), c.welcome.MaxInFlight)
	}
	return nil
}

// BeginRequest starts a request whose frames the driver writes one at a time with
// SendNextFrame; the first frame is written now and the request is in flight from here.
func (c *Connection) BeginRequest(method uint16, codec uint8, timeoutUs uint64, body []byte) (Cursor, error) {
	if err := c.checkSend(TypeRequest, 1); err != nil {
		return Cursor{}, err
	}
	if c.draining {
		return Cursor{}, refuse(CodeDraining, "no REQUEST can be sent after DRAIN")
	}
	if int(method) >= len(c.hello.Methods) {
		return Cursor{}, refuse(CodeUnknownMethod, "method index %d not in the worker's HELLO (%d methods)", method, len(c.hello.Methods))
	}
	if err := c.checkMessageSize("request body", RequestPrefixBytes+len(body)); err != nil {
		return Cursor{}, err
	}
	if len(c.reqs) >= int(c.welcome.MaxInFlight) {
		return Cursor{}, refuse(CodeOverloaded, "%d requests already in flight (max_in_flight %d)", len(c.reqs), c.welcome.MaxInFlight)
	}
	id := c.highest + 1
	c.highest = id
	c.reqs[id] = c.newRequest(c.hello.Methods[method].Kind)
	chunk := min(len(body), c.sendLimit()-RequestPrefixBytes)
	more := chunk < len(body)
	c.out = appendHeader(c.out, TypeRequest, more, id, RequestPrefixBytes+chunk)
	c.out = binary.LittleEndian.AppendUint16(c.out, method)
	c.out = append(c.out, codec, 0)
	c.out = binary.LittleEndian.AppendUint64(c.out, timeoutUs)
	c.out = append(c.out, body[:chunk]...)
	if more {
		c.outbound[id] = &outMsg{typ: TypeRequest, body: body[chunk:]}
	}
	return Cursor{id: id, typ: TypeRequest}, nil
}

// SendNextFrame writes the next CONTINUATION of a message begun with BeginRequest, BeginResult
// or BeginEnd; done is true once the message is complete (also when it was complete after its
// first frame). A message abandoned meanwhile (CANCEL, ERROR) is done too.
func (c *Connection) SendNextFrame(cur Cursor) (done bool, err error) {
	o := c.outbound[cur.id]
	if o == nil {
		return true, nil
	}
	if o.typ != cur.typ || o.manual {
		return false, refuse(CodeContinuation, "no %s of id %d is being sent", cur.typ, cur.id)
	}
	if err := c.checkSend(TypeContinuation, cur.id); err != nil {
		return false, err
	}
	n := min(len(o.body), c.sendLimit())
	more := n < len(o.body)
	c.out = appendHeader(c.out, TypeContinuation, more, cur.id, n)
	c.out = append(c.out, o.body[:n]...)
	o.body = o.body[n:]
	if more {
		return false, nil
	}
	c.finishOutbound(cur.id, o)
	return true, nil
}

func (c *Connection) finishOutbound(id uint64, o *outMsg) {
	delete(c.outbound, id)
	if o.typ != TypeRequest {
		delete(c.reqs, id) // a worker's terminal, sent whole
	}
}

// SendCancel asks the worker to stop request id (parent); it stays in flight until its terminal
// arrives. A request still being sent is abandoned (section 5).
func (c *Connection) SendCancel(id uint64) error {
	if err := c.checkSend(TypeCancel, id); err != nil {
		return err
	}
	if c.reqs[id] == nil {
		return refuse(CodeUnknownID, "CANCEL for id %d, not in flight", id)
	}
	delete(c.outbound, id)
	c.out = appendHeader(c.out, TypeCancel, false, id, 0)
	return nil
}

// Consumed tells the core the consumer has read (or dropped) n bytes of stream id's ROWS
// payload (each Rows event's PayloadLen). The core applies Grant and writes a CREDIT when one is
// due; it returns the bytes granted (0: none yet, the stream has ended, its request is still
// being sent, or the connection failed or said GOODBYE). Never an error.
func (c *Connection) Consumed(id uint64, n int) uint32 {
	req := c.reqs[id]
	if c.role != Parent || req == nil || req.kind != KindStream || c.outbound[id] != nil || n <= 0 {
		return 0
	}
	if c.fatal || c.goodbye || c.failure != nil {
		return 0
	}
	req.consumed += int64(n)
	g := Grant(req.window, req.credit, req.consumed)
	if g <= 0 {
		return 0
	}
	req.credit += g
	req.consumed -= g
	c.out = appendHeader(c.out, TypeCredit, false, id, 4)
	c.out = binary.LittleEndian.AppendUint32(c.out, uint32(g))
	return uint32(g)
}

// ObserveRtt tells the core the driver measured a PING's round trip (its send to its PONG,
// microseconds; 0 counts as 1). ConsumedAt adapts windows to the smallest seen: a PONG that
// waited behind queued rows measures the queue, not the link.
func (c *Connection) ObserveRtt(rttUs int64) {
	rtt := max(1, rttUs)
	if c.minRTTUs == 0 || rtt < c.minRTTUs {
		c.minRTTUs = rtt
	}
}

// SetWindowCaps sets section 6's caps on the adaptive windows (defaults MaxStreamWindow and
// MaxConnectionWindow); a window above a lowered cap stays until it shrinks.
func (c *Connection) SetWindowCaps(maxStreamWindow, maxConnectionWindow int64) {
	c.maxStreamWin, c.maxConnWindow = maxStreamWindow, maxConnectionWindow
}

// ConsumedAt is Consumed with the driver's monotonic clock nowUs: at each grant it adapts the
// stream's window (StreamWindow, section 6) from the time since the stream's previous grant (the
// first call starts its clock) and the round trip of ObserveRtt, and grants the consumed bytes
// plus the new window minus the old (a capped rest waits). Without a round trip observed the
// window stays InitialCredit.
func (c *Connection) ConsumedAt(id uint64, n int, nowUs int64) uint32 {
	req := c.reqs[id]
	if c.role != Parent || req == nil || req.kind != KindStream || c.outbound[id] != nil || n < 0 {
		return 0
	}
	if c.fatal || c.goodbye || c.failure != nil {
		return 0
	}
	req.consumed += int64(n)
	if req.clock < 0 {
		req.clock = nowUs // the first read starts the stream's clock
	}
	old := req.window
	if Grant(old, req.credit, req.consumed) <= 0 {
		return 0
	}
	var total int64
	for _, r := range c.reqs {
		if r.kind == KindStream {
			total += r.window
		}
	}
	fresh := StreamWindow(old, int64(c.welcome.InitialCredit), nowUs-req.clock, c.minRTTUs,
		c.maxStreamWin, max(0, c.maxConnWindow-total))
	// Rows the consumer has not read yet (window - credit - consumed): a consumer behind on what
	// arrived drains a backlog, which says nothing of the window; it never grows then.
	if old-req.credit-req.consumed >= old/4 {
		fresh = min(fresh, old)
	}
	want := req.consumed + fresh - old // >= 0: a halving takes at most the half consumed
	g := max(0, min(want, MaxCredit-req.credit))
	req.clock, req.window, req.consumed = nowUs, fresh, want-g
	if g <= 0 {
		return 0
	}
	req.credit += g
	c.out = appendHeader(c.out, TypeCredit, false, id, 4)
	c.out = binary.LittleEndian.AppendUint32(c.out, uint32(g))
	return uint32(g)
}

// requestOf runs the checks every send for request id shares (14.3): the send itself, the
// request in flight, and its kind (KIND_MISMATCH for the other one).
func (c *Connection) requestOf(t FrameType, id uint64, kind MethodKind) (*request, error) {
	if err := c.checkSend(t, id); err != nil {
		return nil, err
	}
	req, err := c.inFlightFor(t, id)
	if err != nil {
		return nil, err
	}
	if req.kind != kind {
		if kind == KindStream {
			return nil, refuse(CodeKindMismatch, "%s for unary request %d", t, id)
		}
		return nil, refuse(CodeKindMismatch, "%s for stream %d", t, id)
	}
	return req, nil
}

// SendCredit is an explicit grant of n bytes to stream id (parent); prefer Consumed.
func (c *Connection) SendCredit(id uint64, n uint32) error {
	req, err := c.requestOf(TypeCredit, id, KindStream)
	if err != nil {
		return err
	}
	if n == 0 {
		return refuse(CodeBadPayload, "CREDIT of 0 bytes")
	}
	if req.credit+int64(n) > MaxCredit {
		return refuse(CodeCreditOverflow, "credit %d + %d above %d", req.credit, n, MaxCredit)
	}
	req.credit += int64(n)
	c.out = appendHeader(c.out, TypeCredit, false, id, 4)
	c.out = binary.LittleEndian.AppendUint32(c.out, n)
	return nil
}

// SendDrain asks the worker to drain within graceMs (parent); no REQUEST can be sent after it.
func (c *Connection) SendDrain(graceMs uint32) error {
	if err := c.checkSend(TypeDrain, 0); err != nil {
		return err
	}
	c.draining = true
	c.out = appendHeader(c.out, TypeDrain, false, 0, 4)
	c.out = binary.LittleEndian.AppendUint32(c.out, graceMs)
	return nil
}

// SendResult ends unary request id with its result (worker), split into frames when large. A
// body above max_message_size is MESSAGE_TOO_LARGE: the worker then sends HANDLER_ERROR (8.1).
func (c *Connection) SendResult(id uint64, body []byte) error {
	cur, err := c.BeginResult(id, body)
	if err != nil {
		return err
	}
	for {
		done, err := c.SendNextFrame(cur)
		if err != nil || done {
			return err
		}
	}
}

// SendResults sends one RESULT per id and body (14.4); it stops at the first refusal.
func (c *Connection) SendResults(ids []uint64, bodies [][]byte) error {
	for i, id := range ids {
		if err := c.SendResult(id, bodies[i]); err != nil {
			return err
		}
	}
	return nil
}

// BeginResult starts a result written one frame at a time (see SendNextFrame).
func (c *Connection) BeginResult(id uint64, body []byte) (Cursor, error) {
	if _, err := c.requestOf(TypeResult, id, KindUnary); err != nil {
		return Cursor{}, err
	}
	if err := c.checkMessageSize("result", len(body)); err != nil {
		return Cursor{}, err
	}
	chunk := min(len(body), c.sendLimit())
	more := chunk < len(body)
	c.out = appendHeader(c.out, TypeResult, more, id, chunk)
	c.out = append(c.out, body[:chunk]...)
	if more {
		c.outbound[id] = &outMsg{typ: TypeResult, body: body[chunk:]}
	} else {
		delete(c.reqs, id)
	}
	return Cursor{id: id, typ: TypeResult}, nil
}

// SendEnd ends stream id (worker); the core fills row_count with the rows it counted.
func (c *Connection) SendEnd(id uint64, summary []byte) error {
	cur, err := c.BeginEnd(id, summary)
	if err != nil {
		return err
	}
	for {
		done, err := c.SendNextFrame(cur)
		if err != nil || done {
			return err
		}
	}
}

// BeginEnd starts an END whose summary is written one frame at a time.
func (c *Connection) BeginEnd(id uint64, summary []byte) (Cursor, error) {
	req, err := c.requestOf(TypeEnd, id, KindStream)
	if err != nil {
		return Cursor{}, err
	}
	if err := c.checkMessageSize("summary", 8+len(summary)); err != nil {
		return Cursor{}, err
	}
	chunk := min(len(summary), c.sendLimit()-8)
	more := chunk < len(summary)
	c.out = appendHeader(c.out, TypeEnd, more, id, 8+chunk)
	c.out = binary.LittleEndian.AppendUint64(c.out, req.rows)
	c.out = append(c.out, summary[:chunk]...)
	if more {
		c.outbound[id] = &outMsg{typ: TypeEnd, body: summary[chunk:]}
	} else {
		delete(c.reqs, id)
	}
	return Cursor{id: id, typ: TypeEnd}, nil
}

// SendError ends request id with ERROR (worker: its terminal, or the answer to a Reject,
// exactly once); id 0 is a fatal report from either side, after which nothing can be sent. The
// message and details are fitted with FitError: an ERROR cannot be continued.
func (c *Connection) SendError(id uint64, code ErrorCode, message, details string) error {
	return c.sendError(id, code, message, details, true)
}

func (c *Connection) sendError(id uint64, code ErrorCode, message, details string, fit bool) error {
	if err := c.checkSend(TypeError, id); err != nil {
		return err
	}
	if id != 0 {
		if _, rejected := c.rejected[id]; !rejected && c.reqs[id] == nil {
			return refuse(CodeUnknownID, "ERROR for id %d, not in flight", id)
		}
	}
	limit := c.sendLimit()
	if fit {
		message = strings.ToValidUTF8(message, "\uFFFD")
		details = strings.ToValidUTF8(details, "\uFFFD")
		message, details = FitError(message, details, limit)
	} else if !validUTF8(message) || !validUTF8(details) {
		return refuse(CodeBadUTF8, "ERROR message or details is not valid UTF-8")
	} else if n := 6 + len(message) + len(details); n > limit {
		return refuse(CodeFrameTooLarge, "ERROR payload of %d bytes above max_frame_size %d", n, limit)
	}
	f := &ErrorFrame{ID: id, Code: code, Message: message, Details: details}
	b, err := AppendFrame(c.out, f)
	if err != nil {
		return err
	}
	c.out = b
	if id == 0 {
		c.fatal = true
		return nil
	}
	delete(c.rejected, id)
	delete(c.outbound, id) // ERROR abandons a result or summary still being sent (section 5)
	delete(c.reqs, id)
	return nil
}

// SendEvent sends a progress event or notification (worker; id 0 for the connection). Coalesce
// them, about one per 10 ms.
func (c *Connection) SendEvent(id uint64, topic, data string) error {
	if err := c.checkSend(TypeEvent, id); err != nil {
		return err
	}
	if id != 0 {
		if _, err := c.inFlightFor(TypeEvent, id); err != nil {
			return err
		}
	}
	if len(topic) < EventTopicBytesMin || len(topic) > EventTopicBytesMax {
		return refuse(CodeBadPayload, "EVENT topic of %d bytes (%d-%d)", len(topic), EventTopicBytesMin, EventTopicBytesMax)
	}
	if !validUTF8(topic) || !validUTF8(data) {
		return refuse(CodeBadUTF8, "EVENT topic or data is not valid UTF-8")
	}
	if n, limit := 2+len(topic)+len(data), c.sendLimit(); n > limit {
		return refuse(CodeFrameTooLarge, "EVENT payload of %d bytes above max_frame_size %d", n, limit)
	}
	c.out, _ = AppendFrame(c.out, &Notification{ID: id, Topic: topic, Data: data})
	return nil
}

// SendGoodbye sends GOODBYE, the worker's last frame (reason: GoodbyeDrained, GoodbyeLeaving,
// GoodbyeFatal).
func (c *Connection) SendGoodbye(reason uint32) error {
	if err := c.checkSend(TypeGoodbye, 0); err != nil {
		return err
	}
	c.goodbye = true
	c.out = appendHeader(c.out, TypeGoodbye, false, 0, 4)
	c.out = binary.LittleEndian.AppendUint32(c.out, reason)
	return nil
}

// SendPing sends a PING; it jumps the output queue (8.5).
func (c *Connection) SendPing(nonce [8]byte) error { return c.sendNonce(TypePing, nonce) }

// SendPong answers a PING with its nonce; it jumps the output queue (8.5).
func (c *Connection) SendPong(nonce [8]byte) error { return c.sendNonce(TypePong, nonce) }

func (c *Connection) sendNonce(t FrameType, nonce [8]byte) error {
	if err := c.checkSend(t, 0); err != nil {
		return err
	}
	c.urgent = appendHeader(c.urgent, t, false, 0, NonceBytes)
	c.urgent = append(c.urgent, nonce[:]...)
	return nil
}
