package proto

// Liveness is the parent's liveness judge of PROTOCOL.md 8.5, sans-IO: the driver feeds it its
// clock (milliseconds) and what its reader saw, and sends the PINGs it asks for. Liveness means
// progress, not bytes: a worker is hung when the oldest PING it has not answered is older than
// HeartbeatMisses x heartbeat (the PONG clock), or when one frame has been arriving for longer
// than that (the frame clock). A tick that comes later than a heartbeat after the one before
// it means the parent itself ran late: nobody is judged for a heartbeat, so a starved reader
// can catch up first. The model is rust/wirepool/src/liveness.rs.
type Liveness struct {
	heartbeatMs  uint64
	lateGapMs    uint64
	unanswered   []pingSent // oldest first, at most maxUnansweredPings
	lastNonce    uint64
	nextPingMs   uint64
	frame        *frameWatch
	lastTickMs   uint64
	judgeAfterMs uint64
}

// maxUnansweredPings bounds the PINGs in flight: a worker this far behind is judged by the
// first of them anyway.
const maxUnansweredPings = 8

type pingSent struct{ nonce, atMs uint64 }

type frameWatch struct{ sinceMs, bytesIn uint64 }

// Seen is what the driver's reader has seen, read together under its lock.
type Seen struct {
	Answered        uint64 // the highest nonce a PONG answered (it answers every earlier PING)
	IncompleteFrame int    // bytes of the incomplete frame the core holds (IncompleteFrameLen)
	BytesIn         uint64 // bytes read from the worker so far
}

// Verdict is what one tick asks of the driver.
type Verdict struct {
	Ping    uint64 // send a PING with this nonce (PingNonce), when > 0
	Hung    bool   // kill the worker: no progress within HeartbeatMisses heartbeats
	Stalled bool   // with Hung: the frame clock ran out (else the PONG clock)
	Ms      uint64 // with Hung: how long the clock ran
}

// NewLiveness is the judge for heartbeatMs > 0, ticked every tickMs, starting at nowMs.
func NewLiveness(heartbeatMs, tickMs, nowMs uint64) *Liveness {
	return &Liveness{heartbeatMs: heartbeatMs, lateGapMs: max(heartbeatMs, 2*tickMs, 1),
		nextPingMs: nowMs + heartbeatMs, lastTickMs: nowMs}
}

// PingNonce is nonce as a PING or PONG's 8 bytes (little-endian); PongNonce reads it back.
func PingNonce(nonce uint64) (b [8]byte) {
	for i := range b {
		b[i] = byte(nonce >> (8 * i))
	}
	return b
}

// PongNonce is the counter a PONG's nonce carries (0 if it is not one of ours).
func PongNonce(b [8]byte) uint64 {
	var n uint64
	for i := range b {
		n |= uint64(b[i]) << (8 * i)
	}
	return n
}

// Tick is one housekeeping tick at nowMs.
func (l *Liveness) Tick(nowMs uint64, seen Seen) Verdict {
	if nowMs-min(nowMs, l.lastTickMs) > l.lateGapMs {
		l.judgeAfterMs = nowMs + l.heartbeatMs
	}
	l.lastTickMs = nowMs
	for len(l.unanswered) > 0 && l.unanswered[0].nonce <= seen.Answered {
		l.unanswered = l.unanswered[1:]
	}
	switch {
	case seen.IncompleteFrame == 0:
		l.frame = nil
	case l.frame != nil && uint64(seen.IncompleteFrame) > seen.BytesIn-min(seen.BytesIn, l.frame.bytesIn):
		// the same frame is still arriving
	default:
		l.frame = &frameWatch{sinceMs: nowMs, bytesIn: seen.BytesIn}
	}
	limit := uint64(HeartbeatMisses) * l.heartbeatMs
	var v Verdict
	if nowMs >= l.judgeAfterMs {
		if len(l.unanswered) > 0 && nowMs-min(nowMs, l.unanswered[0].atMs) > limit {
			v = Verdict{Hung: true, Ms: nowMs - l.unanswered[0].atMs}
		} else if l.frame != nil && nowMs-min(nowMs, l.frame.sinceMs) > limit {
			v = Verdict{Hung: true, Stalled: true, Ms: nowMs - l.frame.sinceMs}
		}
	}
	if !v.Hung && nowMs >= l.nextPingMs {
		l.nextPingMs = nowMs + l.heartbeatMs
		if len(l.unanswered) < maxUnansweredPings {
			l.lastNonce++
			l.unanswered = append(l.unanswered, pingSent{l.lastNonce, nowMs})
			v.Ping = l.lastNonce
		}
	}
	return v
}
