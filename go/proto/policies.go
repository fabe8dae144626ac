package proto

import (
	"fmt"
	"unicode/utf8"
)

// Offer is what a parent offers a worker at the handshake (14.5): its configured limits and
// whether the connection is remote. The fields are wide signed integers so that a caller's
// out-of-range value (negative, above u32) reaches Negotiate and is refused there, by name.
type Offer struct {
	MaxFrameSize   int64
	InitialCredit  int64
	HeartbeatMs    int64
	MaxInFlight    int64
	MaxMessageSize int64
	WorkerID       uint32
	Remote         bool
}

// Negotiate is the parent's policy for WELCOME (14.5). Each offer field is checked first, in
// order, against its range (22.2): out of range is INVALID_ARGUMENT with Field naming it. Then
// VERSION_MISMATCH when hello's versions exclude 1. clamped says max_in_flight was reduced to
// the worker's max_concurrency (the driver logs it once per pool, 4.2).
func Negotiate(hello *Hello, offer Offer) (w *Welcome, clamped bool, err error) {
	checks := []struct {
		field  string
		v      int64
		lo, hi int64
	}{
		{"max_frame_size", offer.MaxFrameSize, MinMaxFrameSize, MaxMaxFrameSize},
		{"initial_credit", offer.InitialCredit, 1, MaxCredit},
		{"heartbeat_ms", offer.HeartbeatMs, 0, MaxTimeoutMs},
		{"max_in_flight", offer.MaxInFlight, 1, MaxCount},
		{"max_message_size", offer.MaxMessageSize, offer.MaxFrameSize, MaxSize},
	}
	for _, c := range checks {
		if c.v < c.lo || c.v > c.hi {
			return nil, false, &ProtocolError{Code: CodeInvalidArgument, Field: c.field,
				Message: fmt.Sprintf("%s %d out of range %d-%d", c.field, c.v, c.lo, c.hi)}
		}
	}
	if hello.MinVersion > ProtocolVersion || hello.MaxVersion < ProtocolVersion {
		return nil, false, errf(CodeVersionMismatch, "the worker speaks versions %d-%d, this parent %d",
			hello.MinVersion, hello.MaxVersion, ProtocolVersion)
	}
	heartbeat := offer.HeartbeatMs
	if heartbeat == 0 && offer.Remote {
		heartbeat = DefaultHeartbeatMs
	}
	inFlight := min(offer.MaxInFlight, int64(hello.MaxConcurrency))
	return &Welcome{
		Version:        ProtocolVersion,
		WorkerID:       offer.WorkerID,
		MaxFrameSize:   uint32(min(offer.MaxFrameSize, int64(hello.MaxFrameSize))),
		InitialCredit:  uint32(offer.InitialCredit),
		HeartbeatMs:    uint32(heartbeat),
		MaxInFlight:    uint32(inFlight),
		MaxMessageSize: uint64(offer.MaxMessageSize),
	}, inFlight < offer.MaxInFlight, nil
}

// RowsBatchBytes is the payload size at which a worker sends a ROWS batch (14.5):
// min(max(4096, min(preferred, initialCredit/4)), maxFrameSize-8).
func RowsBatchBytes(preferred, initialCredit, maxFrameSize int64) int64 {
	return min(max(4096, min(preferred, initialCredit/4)), maxFrameSize-8)
}

// Grant is the credit a parent grants now on a stream whose consumer has read consumed bytes
// since the last grant, its credit being credit (may be negative): nothing below half the
// window, else min(consumed, 2^31-1 - credit) (14.5). 0 means no grant.
func Grant(initialCredit, credit, consumed int64) int64 {
	if 2*consumed < initialCredit {
		return 0
	}
	return max(0, min(consumed, MaxCredit-credit))
}

// StreamWindow is a stream's adaptive window at a grant (PROTOCOL.md 6 and 14.5), the credit the
// parent keeps outstanding. drainedUs is how long its last half window took to drain, rttUs the
// connection's smallest PING round trip (0: none yet, the window stays), connectionRoom what the
// connection's cap leaves above the sum of its streams' windows. Drained within 2 round trips
// (the window limits the stream): doubled, within max(initialCredit, maxStreamWindow),
// window+connectionRoom and 2^31-1; in more than 8: halved, never below initialCredit;
// otherwise unchanged.
func StreamWindow(window, initialCredit, drainedUs, rttUs, maxStreamWindow, connectionRoom int64) int64 {
	if rttUs == 0 {
		return window
	}
	if drainedUs <= GrowWithinRtts*rttUs {
		top := min(2*window, max(initialCredit, maxStreamWindow), window+connectionRoom, MaxCredit)
		return max(window, top)
	}
	if drainedUs > ShrinkAfterRtts*rttUs {
		return max(window/2, initialCredit)
	}
	return window
}

// FitError is what SendError sends (an ERROR cannot be continued, 14.5): the message cut to
// 65,535 bytes; then, if 6 + message + details exceed maxFrameSize, details longer than half of
// maxFrameSize-6 become the note {"truncated": true, "details_bytes": N}, and the message is
// cut to the room left. Every cut is at a UTF-8 character boundary.
func FitError(message, details string, maxFrameSize int) (string, string) {
	m := cutUTF8(message, ErrorMessageMaxBytes)
	room := maxFrameSize - 6
	if len(m)+len(details) > room {
		if len(details) > room/2 {
			details = fmt.Sprintf(`{"truncated": true, "details_bytes": %d}`, len(details))
		}
		m = cutUTF8(m, room-len(details))
	}
	return m, details
}

// cutUTF8 returns the longest prefix of s of at most limit bytes that does not end inside a
// character.
func cutUTF8(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := max(limit, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
