package proto

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func runs(v any) string {
	var b strings.Builder
	for _, r := range v.([]any) {
		pair := r.([]any)
		b.WriteString(strings.Repeat(pair[0].(string), int(inum(pair[1]))))
	}
	return b.String()
}

func TestPolicyVectors(t *testing.T) {
	p := loadJSON(t, "vectors/policies.json")
	count := map[string][2]int{}
	pass := func(list string, ok bool) {
		c := count[list]
		c[1]++
		if ok {
			c[0]++
		}
		count[list] = c
	}
	for _, x := range p["negotiate"].([]any) {
		c := x.(map[string]any)
		o, h := c["offer"].(map[string]any), c["hello"].(map[string]any)
		offer := Offer{MaxFrameSize: inum(o["max_frame_size"]), InitialCredit: inum(o["initial_credit"]),
			HeartbeatMs: inum(o["heartbeat_ms"]), MaxInFlight: inum(o["max_in_flight"]),
			MaxMessageSize: inum(o["max_message_size"]), WorkerID: uint32(inum(o["worker_id"])), Remote: o["remote"].(bool)}
		hello := &Hello{MinVersion: uint16(inum(h["min_version"])), MaxVersion: uint16(inum(h["max_version"])),
			MaxConcurrency: uint32(inum(h["max_concurrency"])), MaxFrameSize: uint32(inum(h["max_frame_size"]))}
		w, clamped, err := Negotiate(hello, offer)
		var got map[string]any
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("%v: not a *ProtocolError: %v", c["name"], err)
			}
			e := map[string]any{"code": uint32(pe.Code), "name": pe.Name()}
			if pe.Field != "" {
				e["field"] = pe.Field
			}
			got = map[string]any{"error": e}
		} else {
			ev := eventJSON(w, false)
			delete(ev, "type")
			delete(ev, "id")
			got = map[string]any{"welcome": ev, "clamped": clamped}
		}
		ok := same(got, c["expect"])
		if !ok {
			t.Errorf("negotiate %v: got %v, want %v", c["name"], got, c["expect"])
		}
		pass("negotiate", ok)
	}
	for _, x := range p["rows_batch_bytes"].([]any) {
		c := x.(map[string]any)
		got := RowsBatchBytes(inum(c["preferred"]), inum(c["initial_credit"]), inum(c["max_frame_size"]))
		ok := got == inum(c["expect"])
		if !ok {
			t.Errorf("rows_batch_bytes %v: got %d, want %v", c["name"], got, c["expect"])
		}
		pass("rows_batch_bytes", ok)
	}
	for _, x := range p["grant"].([]any) {
		c := x.(map[string]any)
		got := Grant(inum(c["initial_credit"]), inum(c["credit"]), inum(c["consumed"]))
		ok := got == inum(c["expect"])
		if !ok {
			t.Errorf("grant %v: got %d, want %v", c["name"], got, c["expect"])
		}
		pass("grant", ok)
	}
	for _, x := range p["fit_error"].([]any) {
		c := x.(map[string]any)
		message, details := runs(c["message"]), runs(c["details"])
		m, d := FitError(message, details, int(inum(c["max_frame_size"])))
		want := c["expect"].(map[string]any)
		wantDetails := details
		if s, ok := want["details"].(string); ok {
			wantDetails = s
		}
		ok := int64(len(m)) == inum(want["message_bytes"]) && m == message[:len(m)] && d == wantDetails
		if !ok {
			t.Errorf("fit_error %v: got %d bytes and %.60q, want %v", c["name"], len(m), d, want)
		}
		pass("fit_error", ok)
	}
	for _, x := range p["stream_window"].([]any) {
		c := x.(map[string]any)
		got := StreamWindow(inum(c["window"]), inum(c["initial_credit"]), inum(c["drained_us"]),
			inum(c["rtt_us"]), inum(c["max_stream_window"]), inum(c["connection_room"]))
		ok := got == inum(c["expect"])
		if !ok {
			t.Errorf("stream_window %v: got %d, want %v", c["name"], got, c["expect"])
		}
		pass("stream_window", ok)
	}
	for _, list := range []string{"negotiate", "rows_batch_bytes", "grant", "fit_error", "stream_window"} {
		if count[list][1] == 0 {
			t.Errorf("policies.json %s: no cases", list)
		}
		t.Logf("policies.json %s: %d of %d cases pass", list, count[list][0], count[list][1])
	}
}

// Consumed and SendError use the policies on a live connection.
func TestConsumedAndSendErrorUsePolicies(t *testing.T) {
	w := openWorker(t, 65536, 1000)
	if _, err := w.NextEvent(); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", 40000)
	if err := w.SendError(0, CodeHandlerError, long, ""); err != nil {
		t.Fatal(err)
	}
	d := NewDecoder(65536)
	d.Write(w.TakeOutput(-1))
	f, _, err := d.Next()
	if err != nil {
		t.Fatal(err)
	}
	wantMsg, _ := FitError(long, "", 65536)
	if got := f.(*ErrorFrame).Message; got != wantMsg {
		t.Fatalf("SendError sent %d bytes of message, FitError says %d", len(got), len(wantMsg))
	}

	p := openParent(t, 1000)
	id, err := p.SendRequest(1, 1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.TakeOutput(-1)
	if g := p.Consumed(id, 499); g != 0 {
		t.Fatalf("granted %d below half the window", g)
	}
	if g := p.Consumed(id, 1); g != 500 {
		t.Fatalf("granted %d at half the window, want 500", g)
	}
	if cr, _ := p.Credit(id); cr != 1500 {
		t.Fatalf("credit %d after the grant, want 1500", cr)
	}
}

var testHello = &Hello{MinVersion: 1, MaxVersion: 1, Pid: 1, MaxConcurrency: 4, MaxFrameSize: MaxMaxFrameSize,
	SDKName: "wirepool-go", SDKVersion: "0", Methods: []Method{
		{Name: "echo", Kind: KindUnary, Codecs: []uint8{0, 1}},
		{Name: "count", Kind: KindStream, Codecs: []uint8{1}},
	}}

func testWelcome(maxFrame, credit uint32) *Welcome {
	return &Welcome{Version: 1, WorkerID: 1, MaxFrameSize: maxFrame, InitialCredit: credit, HeartbeatMs: 1000,
		MaxInFlight: 4, MaxMessageSize: 1 << 30}
}

// openParent returns a parent core that has received testHello and sent a WELCOME.
func openParent(t testing.TB, credit uint32) *Connection {
	t.Helper()
	p := NewConnection(Parent)
	b, _ := AppendFrame(nil, testHello)
	p.Receive(b)
	if _, err := p.NextEvent(); err != nil {
		t.Fatal(err)
	}
	if err := p.SendWelcome(testWelcome(65536, credit)); err != nil {
		t.Fatal(err)
	}
	p.TakeOutput(-1)
	return p
}

// openWorker returns a worker core that has sent testHello and has a WELCOME waiting.
func openWorker(t testing.TB, maxFrame, credit uint32) *Connection {
	t.Helper()
	w := NewConnection(Worker)
	if err := w.SendHello(testHello); err != nil {
		t.Fatal(err)
	}
	w.TakeOutput(-1)
	b, _ := AppendFrame(nil, testWelcome(maxFrame, credit))
	w.Receive(b)
	return w
}

const mib = 1 << 20

func windowOf(t *testing.T, p *Connection, id uint64) int64 {
	t.Helper()
	w, ok := p.Window(id)
	if !ok {
		t.Fatalf("no window for %d", id)
	}
	return w
}

// ConsumedAt on a live core (section 6): half windows drained in half a round trip double the
// window (the grant is the consumed bytes plus the growth) up to 16 MiB; a slow consumer halves
// it back to InitialCredit, the halving taken out of the grants.
func TestConsumedAtGrowsAWindowLimitedStreamAndShrinksItBack(t *testing.T) {
	p := openParent(t, mib)
	id, err := p.SendRequest(1, 1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, rtt := range []int64{150_000, 100_000, 400_000} {
		p.ObserveRtt(rtt) // the smallest counts
	}
	if g := p.ConsumedAt(id, 0, 1_000); g != 0 {
		t.Fatalf("granted %d on the first read", g)
	}
	now := int64(1_000)
	var windows []int64
	for range 8 {
		half := windowOf(t, p, id) / 2
		if g := p.ConsumedAt(id, int(half-1), now); g != 0 {
			t.Fatalf("granted %d below half the window", g)
		}
		now += 50_000
		old := windowOf(t, p, id)
		g := p.ConsumedAt(id, 1, now)
		fresh := windowOf(t, p, id)
		if int64(g) != half+fresh-old {
			t.Fatalf("granted %d, want %d", g, half+fresh-old)
		}
		windows = append(windows, fresh/mib)
	}
	if want := []int64{2, 4, 8, 16, 16, 16, 16, 16}; !slices.Equal(windows, want) {
		t.Fatalf("windows %v, want %v", windows, want)
	}
	var shrinking []int64
	for windowOf(t, p, id) > mib {
		now += 10_000_000 // 10 s for half a window: more than 8 round trips
		old := windowOf(t, p, id)
		g := p.ConsumedAt(id, int(old/2), now)
		fresh := windowOf(t, p, id)
		if int64(g) != old/2+fresh-old {
			t.Fatalf("granted %d, want %d", g, old/2+fresh-old)
		}
		shrinking = append(shrinking, fresh/mib)
	}
	if want := []int64{8, 4, 2, 1}; !slices.Equal(shrinking, want) {
		t.Fatalf("shrinking %v, want %v", shrinking, want)
	}
	p.ConsumedAt(id, mib/2, now+10_000_000)
	if w := windowOf(t, p, id); w != mib {
		t.Fatalf("window %d below initial_credit", w)
	}
}

func TestConsumedAtWithoutARoundTripAndConsumedNeverAdapt(t *testing.T) {
	p := openParent(t, mib)
	id, _ := p.SendRequest(1, 1, 0, nil)
	p.ConsumedAt(id, 0, 0)
	if g := p.ConsumedAt(id, mib/2, 10); g != mib/2 || windowOf(t, p, id) != mib {
		t.Fatalf("granted %d, window %d", g, windowOf(t, p, id))
	}
	p.ObserveRtt(100_000)
	if g := p.Consumed(id, mib/2); g != mib/2 || windowOf(t, p, id) != mib {
		t.Fatalf("granted %d, window %d", g, windowOf(t, p, id))
	}
	if _, ok := p.Window(id + 1); ok {
		t.Fatal("a window for a request not in flight")
	}
}

func TestTheConnectionCapBoundsTheSumOfWindows(t *testing.T) {
	p := openParent(t, mib)
	a, _ := p.SendRequest(1, 1, 0, nil)
	b, _ := p.SendRequest(1, 1, 0, nil)
	p.SetWindowCaps(16*mib, 3*mib)
	p.ObserveRtt(100_000)
	for _, id := range []uint64{a, b} {
		p.ConsumedAt(id, 0, 0)
	}
	for now := int64(1); now < 6; now++ {
		for _, id := range []uint64{a, b} {
			p.ConsumedAt(id, int(windowOf(t, p, id)/2), now*1_000)
		}
		if s := windowOf(t, p, a) + windowOf(t, p, b); s > 3*mib {
			t.Fatalf("windows sum to %d above the cap", s)
		}
	}
	if windowOf(t, p, a) != 2*mib || windowOf(t, p, b) != mib {
		t.Fatalf("windows %d, %d", windowOf(t, p, a), windowOf(t, p, b))
	}
}
