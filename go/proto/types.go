package proto

import "strconv"

// FrameType is the type byte of a frame header (section 2).
type FrameType uint8

// Direction is who may send a frame type.
type Direction uint8

// The directions of constants.json frame_types.
const (
	WorkerToParent Direction = iota + 1
	ParentToWorker
	BothDirections
)

// IDRule says which ids a frame type may carry.
type IDRule uint8

// The id rules of constants.json frame_types.
const (
	IDZero    IDRule = iota + 1 // connection-level: id 0 only
	IDRequest                   // request-level: never 0
	IDAny                       // ERROR and EVENT: either
)

// FrameRule is one row of the frame-type table (constants.json frame_types).
type FrameRule struct {
	Type            FrameType
	Name            string
	Direction       Direction
	ID              IDRule
	MoreAllowed     bool
	ContinuedPrefix int // the fixed prefix a first frame with MORE carries; -1 when it cannot continue
	PayloadSize     int // the exact payload size of a fixed-size type; -1 otherwise
}

var rulesByType [256]*FrameRule

func init() {
	for i := range frameRules {
		rulesByType[frameRules[i].Type] = &frameRules[i]
	}
}

// Rule returns the rule of a version 1 frame type, or nil for an unknown type (the shm types
// included: this core does not implement the extension, so they are UNKNOWN_FRAME_TYPE).
func (t FrameType) Rule() *FrameRule { return rulesByType[t] }

// FrameRules returns the rules of every version 1 frame type, in code order.
func FrameRules() []FrameRule { return append([]FrameRule(nil), frameRules...) }

// ShmFrameRules returns the shm extension's frame types (section 20.3), for reference only.
func ShmFrameRules() []FrameRule { return append([]FrameRule(nil), shmFrameRules...) }

// String returns the type's name (HELLO, REQUEST, ...) or its number in hex.
func (t FrameType) String() string {
	if r := rulesByType[t]; r != nil {
		return r.Name
	}
	return "0x" + strconv.FormatUint(uint64(t), 16)
}

// MethodKind is a HELLO method's kind: KindUnary or KindStream.
type MethodKind uint8

func (k MethodKind) String() string {
	switch k {
	case KindUnary:
		return "unary"
	case KindStream:
		return "stream"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Fate is what an error code does to the connection (section 3).
type Fate uint8

// The fates of constants.json.
const (
	FateConnectionClosed Fate = iota + 1
	FateRequestEnds
	FateLocalOnly
)

func (f Fate) String() string {
	switch f {
	case FateConnectionClosed:
		return "connection_closed"
	case FateRequestEnds:
		return "request_ends"
	case FateLocalOnly:
		return "local_only"
	}
	return "fate(" + strconv.Itoa(int(f)) + ")"
}

// ErrorCode is a stable numeric error code of section 3. Any u32 may arrive on the wire.
type ErrorCode uint32

// ErrorInfo is one known error code.
type ErrorInfo struct {
	Code  ErrorCode
	Name  string
	Class string
	Fate  Fate
	Shm   bool // a code of the shm extension (20.6)
}

// ErrorClass is a range of codes (constants.json error_classes).
type ErrorClass struct {
	Class string
	From  uint32
	To    uint32
	Sent  bool
	Fate  Fate
}

var infoByCode = func() map[ErrorCode]*ErrorInfo {
	m := make(map[ErrorCode]*ErrorInfo, len(errorInfos))
	for i := range errorInfos {
		m[errorInfos[i].Code] = &errorInfos[i]
	}
	return m
}()

// ErrorInfos returns every known error code, in code order.
func ErrorInfos() []ErrorInfo { return append([]ErrorInfo(nil), errorInfos...) }

// ErrorClasses returns the classes by range, in order.
func ErrorClasses() []ErrorClass { return append([]ErrorClass(nil), errorClasses...) }

// Info returns the code's row, or nil for a code without a name.
func (c ErrorCode) Info() *ErrorInfo { return infoByCode[c] }

// Class returns the code's class by range: unassigned, protocol, request, local, application.
func (c ErrorCode) Class() ErrorClass {
	for _, k := range errorClasses {
		if uint32(c) >= k.From && uint32(c) <= k.To {
			return k
		}
	}
	return errorClasses[len(errorClasses)-1]
}

// Fate returns the code's fate column (section 3). A receiver decides a received ERROR's fate
// by its id, never by this.
func (c ErrorCode) Fate() Fate {
	if i := c.Info(); i != nil {
		return i.Fate
	}
	return c.Class().Fate
}

// String returns the code's name, or its class in upper case for a code without one
// (UNKNOWN for the unassigned ranges, as the caller sees them, section 3).
func (c ErrorCode) String() string {
	if i := c.Info(); i != nil {
		return i.Name
	}
	switch c.Class().Class {
	case "unassigned":
		return "UNKNOWN"
	case "protocol":
		return "PROTOCOL"
	case "request":
		return "REQUEST"
	case "local":
		return "LOCAL"
	}
	return "APPLICATION"
}
