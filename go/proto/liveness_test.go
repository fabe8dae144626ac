package proto

import "testing"

const hb, tick = 100, 10

// run ticks every 10 ms over [from, to], answering each PING at once when answer, with the
// reader's view frame(now); it returns the first hung verdict and its time.
func run(l *Liveness, from, to uint64, answer bool, answered *uint64, frame func(uint64) (int, uint64)) (uint64, *Verdict) {
	for now := from; now <= to; now += tick {
		inc, in := frame(now)
		v := l.Tick(now, Seen{Answered: *answered, IncompleteFrame: inc, BytesIn: in})
		if v.Hung {
			return now, &v
		}
		if v.Ping > 0 && answer {
			*answered = v.Ping
		}
	}
	return 0, nil
}

func idle(uint64) (int, uint64) { return 0, 0 }

func TestLivenessAnsweredPingsKeepAlive(t *testing.T) {
	var answered uint64
	if at, v := run(NewLiveness(hb, tick, 0), 10, 5000, true, &answered, idle); v != nil {
		t.Fatalf("hung at %d: %+v", at, v)
	}
	if answered < 40 {
		t.Fatalf("only %d pings", answered)
	}
}

func TestLivenessSilentWorkerIsHungAfterThreeHeartbeats(t *testing.T) {
	var answered uint64
	at, v := run(NewLiveness(hb, tick, 0), 10, 5000, false, &answered, idle)
	if v == nil || v.Stalled || at <= 100+3*hb || at > 100+3*hb+2*tick {
		t.Fatalf("verdict %+v at %d", v, at)
	}
}

func TestLivenessTrickledFrameIsHung(t *testing.T) {
	var answered uint64
	// One byte of one frame every tick, PINGs answered: the frame clock runs out.
	at, v := run(NewLiveness(hb, tick, 0), 10, 5000, true, &answered, func(now uint64) (int, uint64) {
		return int(now / tick), now / tick
	})
	if v == nil || !v.Stalled || at > 3*hb+3*tick {
		t.Fatalf("verdict %+v at %d", v, at)
	}
}

func TestLivenessFramesThatCompleteAreProgress(t *testing.T) {
	var answered uint64
	// A new 5-byte frame starts every tick and completes by the next: never one stalled frame.
	if at, v := run(NewLiveness(hb, tick, 0), 10, 5000, true, &answered, func(now uint64) (int, uint64) {
		return 5, now / tick * 100
	}); v != nil {
		t.Fatalf("hung at %d: %+v", at, v)
	}
}

func TestLivenessLateParentJudgesNobody(t *testing.T) {
	l := NewLiveness(hb, tick, 0)
	if v := l.Tick(100, Seen{}); v.Ping != 1 {
		t.Fatalf("first ping: %+v", v)
	}
	// The parent stalls 1 s: its reader may not have read the PONG, so no verdict yet.
	if v := l.Tick(1100, Seen{}); v.Hung {
		t.Fatalf("judged after a stall: %+v", v)
	}
	if v := l.Tick(1110, Seen{Answered: 1}); v.Hung {
		t.Fatalf("judged after the PONG: %+v", v)
	}
}

func TestLivenessBoundsUnansweredPings(t *testing.T) {
	l := NewLiveness(hb, tick, 0)
	pings := 0
	// Always late: never judged, and never more than 8 PINGs in flight.
	for now := uint64(0); now < 100_000; now += 2 * hb {
		if l.Tick(now, Seen{}).Ping > 0 {
			pings++
		}
	}
	if pings != maxUnansweredPings || PingNonce(7) != [8]byte{7} || PongNonce(PingNonce(1<<40)) != 1<<40 {
		t.Fatalf("%d pings", pings)
	}
}
