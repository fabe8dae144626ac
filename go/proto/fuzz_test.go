package proto

import (
	"errors"
	"fmt"
	"testing"
)

// drive feeds chunks to a core of the role and answers what a driver answers (WELCOME to a
// HELLO, PONG to a PING, ERROR to a REJECT, a result or END to a request), and returns the
// events and the error, as text.
func drive(t *testing.T, worker bool, chunks [][]byte) []string {
	var c *Connection
	if worker {
		c = NewConnection(Worker)
		if err := c.SendHello(testHello); err != nil {
			t.Fatal(err)
		}
	} else {
		c = NewConnection(Parent)
	}
	var log []string
	check := func(err error) {
		var pe *ProtocolError
		if err != nil && !errors.As(err, &pe) {
			t.Fatalf("a send failed without a *ProtocolError: %v", err)
		}
	}
	for _, ch := range chunks {
		c.Receive(ch)
		for {
			ev, err := c.NextEvent()
			if err != nil {
				var pe *ProtocolError
				if !errors.As(err, &pe) {
					t.Fatalf("not a *ProtocolError: %v", err)
				}
				if _, again := c.NextEvent(); again != err {
					t.Fatalf("a failed core answered %v after %v", again, err)
				}
				check(c.SendFatal(pe))
				return append(log, "error "+pe.Name())
			}
			if ev == nil {
				break
			}
			log = append(log, fmt.Sprintf("%T %v", ev, eventJSON(ev, false)))
			switch ev := ev.(type) {
			case *Hello:
				if w, _, err := Negotiate(ev, Offer{MaxFrameSize: DefaultMaxFrameSize, InitialCredit: 4096,
					HeartbeatMs: 0, MaxInFlight: 8, MaxMessageSize: 1 << 20}); err == nil {
					check(c.SendWelcome(w))
				}
			case *Ping:
				check(c.SendPong(ev.Nonce))
			case *Reject:
				check(c.SendError(ev.ID, ev.Code, "refused", ""))
			case *Request:
				if err := c.SendResult(ev.ID, ev.Body); err != nil {
					check(c.SendError(ev.ID, CodeHandlerError, err.Error(), ""))
				}
			case *Rows:
				c.Consumed(ev.ID, ev.PayloadLen)
			}
			if c.InFlight() > 1<<16 {
				t.Fatal("in flight without bound")
			}
		}
	}
	if err := c.EndOfInput(); err != nil {
		log = append(log, "eof "+err.(*ProtocolError).Name())
	}
	c.TakeOutput(-1)
	return log
}

// FuzzReceive feeds arbitrary bytes to the receive path of both roles' cores, whole and split
// in two: no panic, only *ProtocolError, a failed core repeats its error, and the events and
// error do not depend on the split.
func FuzzReceive(f *testing.F) {
	f.Fuzz(func(t *testing.T, worker bool, data []byte) {
		if len(data) > 1<<20 {
			return
		}
		whole := drive(t, worker, [][]byte{data})
		if len(data) < 2 {
			return
		}
		k := 1 + int(data[0])*len(data)/256%(len(data)-1)
		split := drive(t, worker, [][]byte{data[:k], data[k:]})
		if fmt.Sprint(whole) != fmt.Sprint(split) {
			t.Fatalf("split at %d changed the outcome:\n%v\n%v", k, whole, split)
		}
	})
}
