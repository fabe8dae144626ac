package proto

import (
	"encoding/binary"
	"math"
)

// Frame is one decoded or to-be-encoded frame: *Hello, *Welcome, *Request, *Cancel, *Result,
// *ErrorFrame, *Rows, *End, *Credit, *Notification (an EVENT frame), *Ping, *Pong, *Drain,
// *Goodbye or *Continuation. Byte slices of a decoded frame alias the bytes received; the core
// never writes over bytes it has handed out, so they stay valid as long as they are referenced.
type Frame interface {
	// Type is the frame's type byte.
	Type() FrameType
	// RequestID is the header's id (0 for connection-level frames).
	RequestID() uint64
	// HasMore reports the MORE flag.
	HasMore() bool
}

// Event is what a connection core reports (14.2): a Frame type (continued messages reassembled,
// never a *Continuation), *Late or *Reject.
type Event interface{ isEvent() }

// Method is one entry of HELLO's method list.
type Method struct {
	Name   string
	Kind   MethodKind
	Codecs []uint8
}

// Hello is the worker's handshake offer (4.1).
type Hello struct {
	MinVersion     uint16
	MaxVersion     uint16
	Pid            uint32
	MaxConcurrency uint32
	MaxFrameSize   uint32
	SDKName        string
	SDKVersion     string
	Methods        []Method
	// Trailing holds the bytes after the method list: ignored by a v1 reader (an extension
	// block, section 20.1), written as they are when encoding.
	Trailing []byte
}

// Welcome is the parent's handshake answer (4.2).
type Welcome struct {
	Version        uint16
	WorkerID       uint32
	MaxFrameSize   uint32
	InitialCredit  uint32
	HeartbeatMs    uint32
	MaxInFlight    uint32
	MaxMessageSize uint64
	Trailing       []byte // bytes from offset 32: ignored by a v1 reader
}

// Request is a REQUEST frame, or the whole reassembled request as an event.
type Request struct {
	ID        uint64
	More      bool
	Method    uint16
	Codec     uint8
	TimeoutUs uint64
	Body      []byte
}

// Cancel is a CANCEL frame.
type Cancel struct{ ID uint64 }

// Result is a RESULT frame, or the whole reassembled result as an event.
type Result struct {
	ID   uint64
	More bool
	Body []byte
}

// ErrorFrame is an ERROR frame. Code is any u32 (a receiver accepts unknown codes).
type ErrorFrame struct {
	ID      uint64
	Code    ErrorCode
	Message string
	Details string // UTF-8 JSON text or empty; never parsed by the core
}

// Rows is a ROWS frame. PayloadLen is the whole payload's size (count and length prefixes
// included): what a parent driver reports to Consumed.
type Rows struct {
	ID         uint64
	Rows       [][]byte
	PayloadLen int
}

// End is an END frame, or the whole reassembled END as an event.
type End struct {
	ID       uint64
	More     bool
	RowCount uint64
	Summary  []byte
}

// Credit is a CREDIT frame.
type Credit struct {
	ID    uint64
	Bytes uint32
}

// Notification is an EVENT frame (a progress report or notification; id 0 or a request's).
type Notification struct {
	ID    uint64
	Topic string
	Data  string
}

// Ping is a PING frame.
type Ping struct{ Nonce [8]byte }

// Pong is a PONG frame.
type Pong struct{ Nonce [8]byte }

// Drain is a DRAIN frame.
type Drain struct{ GraceMs uint32 }

// Goodbye is a GOODBYE frame.
type Goodbye struct{ Reason uint32 }

// Continuation is a CONTINUATION frame (never reported as an event).
type Continuation struct {
	ID   uint64
	More bool
	Body []byte
}

// Late is a frame for a request that has ended: ignored (the normal race with CANCEL).
type Late struct {
	ID    uint64
	Frame FrameType
}

// Reject is a REQUEST the worker core refuses without running it (11.2 step 10), or a
// half-received request abandoned by CANCEL (CodeCancelled). The driver answers it with
// SendError(ID, Code, ...).
type Reject struct {
	ID   uint64
	Code ErrorCode
}

func (*Hello) Type() FrameType        { return TypeHello }
func (*Welcome) Type() FrameType      { return TypeWelcome }
func (*Request) Type() FrameType      { return TypeRequest }
func (*Cancel) Type() FrameType       { return TypeCancel }
func (*Result) Type() FrameType       { return TypeResult }
func (*ErrorFrame) Type() FrameType   { return TypeError }
func (*Rows) Type() FrameType         { return TypeRows }
func (*End) Type() FrameType          { return TypeEnd }
func (*Credit) Type() FrameType       { return TypeCredit }
func (*Notification) Type() FrameType { return TypeEvent }
func (*Ping) Type() FrameType         { return TypePing }
func (*Pong) Type() FrameType         { return TypePong }
func (*Drain) Type() FrameType        { return TypeDrain }
func (*Goodbye) Type() FrameType      { return TypeGoodbye }
func (*Continuation) Type() FrameType { return TypeContinuation }

func (*Hello) RequestID() uint64          { return 0 }
func (*Welcome) RequestID() uint64        { return 0 }
func (f *Request) RequestID() uint64      { return f.ID }
func (f *Cancel) RequestID() uint64       { return f.ID }
func (f *Result) RequestID() uint64       { return f.ID }
func (f *ErrorFrame) RequestID() uint64   { return f.ID }
func (f *Rows) RequestID() uint64         { return f.ID }
func (f *End) RequestID() uint64          { return f.ID }
func (f *Credit) RequestID() uint64       { return f.ID }
func (f *Notification) RequestID() uint64 { return f.ID }
func (*Ping) RequestID() uint64           { return 0 }
func (*Pong) RequestID() uint64           { return 0 }
func (*Drain) RequestID() uint64          { return 0 }
func (*Goodbye) RequestID() uint64        { return 0 }
func (f *Continuation) RequestID() uint64 { return f.ID }

func (*Hello) HasMore() bool          { return false }
func (*Welcome) HasMore() bool        { return false }
func (f *Request) HasMore() bool      { return f.More }
func (*Cancel) HasMore() bool         { return false }
func (f *Result) HasMore() bool       { return f.More }
func (*ErrorFrame) HasMore() bool     { return false }
func (*Rows) HasMore() bool           { return false }
func (f *End) HasMore() bool          { return f.More }
func (*Credit) HasMore() bool         { return false }
func (*Notification) HasMore() bool   { return false }
func (*Ping) HasMore() bool           { return false }
func (*Pong) HasMore() bool           { return false }
func (*Drain) HasMore() bool          { return false }
func (*Goodbye) HasMore() bool        { return false }
func (f *Continuation) HasMore() bool { return f.More }

func (*Hello) isEvent()        {}
func (*Welcome) isEvent()      {}
func (*Request) isEvent()      {}
func (*Cancel) isEvent()       {}
func (*Result) isEvent()       {}
func (*ErrorFrame) isEvent()   {}
func (*Rows) isEvent()         {}
func (*End) isEvent()          {}
func (*Credit) isEvent()       {}
func (*Notification) isEvent() {}
func (*Ping) isEvent()         {}
func (*Pong) isEvent()         {}
func (*Drain) isEvent()        {}
func (*Goodbye) isEvent()      {}
func (*Late) isEvent()         {}
func (*Reject) isEvent()       {}

// PayloadLen returns the size of the frame's payload when encoded.
func PayloadLen(f Frame) int {
	switch f := f.(type) {
	case *Hello:
		n := HelloFixedBytes + 2 + len(f.SDKName) + 2 + len(f.SDKVersion) + 2
		for _, m := range f.Methods {
			n += 2 + len(m.Codecs) + 2 + len(m.Name)
		}
		return n + len(f.Trailing)
	case *Welcome:
		return WelcomeBytes + len(f.Trailing)
	case *Request:
		return RequestPrefixBytes + len(f.Body)
	case *Cancel:
		return 0
	case *Result:
		return len(f.Body)
	case *ErrorFrame:
		return 6 + len(f.Message) + len(f.Details)
	case *Rows:
		n := 4
		for _, r := range f.Rows {
			n += 4 + len(r)
		}
		return n
	case *End:
		return 8 + len(f.Summary)
	case *Credit, *Drain, *Goodbye:
		return 4
	case *Notification:
		return 2 + len(f.Topic) + len(f.Data)
	case *Ping, *Pong:
		return NonceBytes
	case *Continuation:
		return len(f.Body)
	}
	return 0
}

func appendHeader(dst []byte, t FrameType, more bool, id uint64, length int) []byte {
	var flags byte
	if more {
		flags = FlagMore
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(length))
	dst = append(dst, byte(t), flags, 0, 0)
	return binary.LittleEndian.AppendUint64(dst, id)
}

func appendStr16(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// AppendFrame appends the encoding of f (header and payload) to dst. It checks only what the
// layout cannot hold (a string longer than its u16 length, a payload above 2^32 - 1 bytes, more
// than 2^32 - 1 rows, 65,535 methods or 255 codecs): BAD_PAYLOAD. The protocol's rules are the
// connection's (Connection.Send); the decoder checks them on the way in.
func AppendFrame(dst []byte, f Frame) ([]byte, error) {
	n := PayloadLen(f)
	if n > math.MaxUint32 {
		return dst, errf(CodeBadPayload, "%s payload of %d bytes does not fit a u32 length", f.Type(), n)
	}
	if err := checkLayout(f); err != nil {
		return dst, err
	}
	dst = appendHeader(dst, f.Type(), f.HasMore(), f.RequestID(), n)
	le := binary.LittleEndian
	switch f := f.(type) {
	case *Hello:
		dst = append(dst, Magic...)
		dst = le.AppendUint16(dst, f.MinVersion)
		dst = le.AppendUint16(dst, f.MaxVersion)
		dst = le.AppendUint32(dst, f.Pid)
		dst = le.AppendUint32(dst, f.MaxConcurrency)
		dst = le.AppendUint32(dst, f.MaxFrameSize)
		dst = appendStr16(dst, f.SDKName)
		dst = appendStr16(dst, f.SDKVersion)
		dst = le.AppendUint16(dst, uint16(len(f.Methods)))
		for _, m := range f.Methods {
			dst = append(dst, byte(m.Kind), byte(len(m.Codecs)))
			dst = append(dst, m.Codecs...)
			dst = appendStr16(dst, m.Name)
		}
		dst = append(dst, f.Trailing...)
	case *Welcome:
		dst = le.AppendUint16(dst, f.Version)
		dst = le.AppendUint16(dst, 0)
		dst = le.AppendUint32(dst, f.WorkerID)
		dst = le.AppendUint32(dst, f.MaxFrameSize)
		dst = le.AppendUint32(dst, f.InitialCredit)
		dst = le.AppendUint32(dst, f.HeartbeatMs)
		dst = le.AppendUint32(dst, f.MaxInFlight)
		dst = le.AppendUint64(dst, f.MaxMessageSize)
		dst = append(dst, f.Trailing...)
	case *Request:
		dst = le.AppendUint16(dst, f.Method)
		dst = append(dst, f.Codec, 0)
		dst = le.AppendUint64(dst, f.TimeoutUs)
		dst = append(dst, f.Body...)
	case *Cancel:
	case *Result:
		dst = append(dst, f.Body...)
	case *ErrorFrame:
		dst = le.AppendUint32(dst, uint32(f.Code))
		dst = appendStr16(dst, f.Message)
		dst = append(dst, f.Details...)
	case *Rows:
		dst = le.AppendUint32(dst, uint32(len(f.Rows)))
		for _, r := range f.Rows {
			dst = le.AppendUint32(dst, uint32(len(r)))
			dst = append(dst, r...)
		}
	case *End:
		dst = le.AppendUint64(dst, f.RowCount)
		dst = append(dst, f.Summary...)
	case *Credit:
		dst = le.AppendUint32(dst, f.Bytes)
	case *Notification:
		dst = appendStr16(dst, f.Topic)
		dst = append(dst, f.Data...)
	case *Ping:
		dst = append(dst, f.Nonce[:]...)
	case *Pong:
		dst = append(dst, f.Nonce[:]...)
	case *Drain:
		dst = le.AppendUint32(dst, f.GraceMs)
	case *Goodbye:
		dst = le.AppendUint32(dst, f.Reason)
	case *Continuation:
		dst = append(dst, f.Body...)
	}
	return dst, nil
}

func checkLayout(f Frame) error {
	long := func(what string, s string) error {
		if len(s) > math.MaxUint16 {
			return errf(CodeBadPayload, "%s of %d bytes does not fit its u16 length", what, len(s))
		}
		return nil
	}
	switch f := f.(type) {
	case *Hello:
		if err := long("sdk_name", f.SDKName); err != nil {
			return err
		}
		if err := long("sdk_version", f.SDKVersion); err != nil {
			return err
		}
		if len(f.Methods) > math.MaxUint16 {
			return errf(CodeBadPayload, "%d methods do not fit method_count", len(f.Methods))
		}
		for _, m := range f.Methods {
			if len(m.Codecs) > math.MaxUint8 {
				return errf(CodeBadPayload, "%d codecs do not fit codec_count", len(m.Codecs))
			}
			if err := long("method name", m.Name); err != nil {
				return err
			}
		}
	case *ErrorFrame:
		return long("ERROR message", f.Message)
	case *Notification:
		return long("EVENT topic", f.Topic)
	case *Rows:
		if uint64(len(f.Rows)) > math.MaxUint32 {
			return errf(CodeBadPayload, "%d rows do not fit count", len(f.Rows))
		}
	}
	return nil
}
