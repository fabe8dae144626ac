package proto

import (
	"fmt"
	"testing"
)

// runSession plays one case; split(k, data) chooses the chunks of each recv step.
func runSession(c map[string]any, chunk func(data []byte) [][]byte) error {
	role := Worker
	if c["role"] == "parent" {
		role = Parent
	}
	conn := NewConnection(role)
	for i, x := range c["steps"].([]any) {
		st := x.(map[string]any)
		if fr, ok := st["send"]; ok {
			if err := conn.Send(frameFromJSON(fr.(map[string]any))); err != nil {
				return fmt.Errorf("step %d: send %v refused: %v", i, fr, err)
			}
			conn.TakeOutput(-1)
			continue
		}
		events := []any{}
		var err error
		if hexData, ok := st["recv"]; ok {
		feed:
			for _, ch := range chunk(unhex(hexData)) {
				conn.Receive(ch)
				for {
					ev, e := conn.NextEvent()
					if e != nil {
						err = e
						break feed
					}
					if ev == nil {
						break
					}
					events = append(events, eventJSON(ev, false))
				}
			}
		} else {
			err = conn.EndOfInput()
		}
		if !sameJSON(events, st["events"].([]any)) || !sameErr(err, st["error"]) {
			return fmt.Errorf("step %d: got events %v error %v; want %v error %v", i, events, errJSON(err), st["events"], st["error"])
		}
		if err != nil {
			// The core is failed: it repeats the error and accepts only a fatal report.
			if _, again := conn.NextEvent(); !sameErr(again, st["error"]) {
				return fmt.Errorf("step %d: a failed core answered %v", i, again)
			}
			if e := conn.SendPing([8]byte{}); e == nil {
				return fmt.Errorf("step %d: a failed core accepted a PING", i)
			}
			if e := conn.SendFatal(err.(*ProtocolError)); e != nil {
				return fmt.Errorf("step %d: SendFatal refused: %v", i, e)
			}
		}
	}
	return nil
}

func TestSessionVectors(t *testing.T) {
	cases := loadJSON(t, "vectors/sessions.json")["cases"].([]any)
	passed := 0
	for _, x := range cases {
		c := x.(map[string]any)
		name := c["name"].(string)
		// Every split position of any recv step of the case (sampled above 4 KiB).
		set := map[int]bool{}
		for _, s := range c["steps"].([]any) {
			if h, ok := s.(map[string]any)["recv"]; ok {
				for _, k := range positions(unhex(h)) {
					set[k] = true
				}
			}
		}
		modes := []struct {
			name  string
			chunk func([]byte) [][]byte
		}{
			{"whole", func(d []byte) [][]byte { return [][]byte{d} }},
			{"bytes", oneByteAtATime},
		}
		for k := range set {
			modes = append(modes, struct {
				name  string
				chunk func([]byte) [][]byte
			}{fmt.Sprintf("split at %d", k), func(d []byte) [][]byte {
				if k >= len(d) {
					return [][]byte{d}
				}
				return [][]byte{d[:k], d[k:]}
			}})
		}
		ok := true
		for _, m := range modes {
			if err := runSession(c, m.chunk); err != nil {
				t.Errorf("%s (%s): %v", name, m.name, err)
				ok = false
				break
			}
		}
		if ok {
			passed++
		}
	}
	t.Logf("sessions.json: %d of %d cases pass", passed, len(cases))
}

func oneByteAtATime(d []byte) [][]byte {
	out := make([][]byte, len(d))
	for i := range d {
		out[i] = d[i : i+1]
	}
	return out
}
