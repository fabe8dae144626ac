package worker

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wirepool/wirepool/go/proto"
)

// fakeParent is a parent core over one end of a socketpair; the worker serves the other end.
type fakeParent struct {
	t       *testing.T
	conn    net.Conn
	core    *proto.Connection
	methods map[string]uint16
	served  chan error
	buf     []byte
}

func socketpair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// start serves w on a socketpair and completes the handshake with offer's settings.
func start(t *testing.T, w *Worker, offer proto.Offer) *fakeParent {
	t.Helper()
	pc, wc := socketpair(t)
	w.conn = wc
	p := &fakeParent{t: t, conn: pc, core: proto.NewConnection(proto.Parent), methods: map[string]uint16{}, served: make(chan error, 1), buf: make([]byte, 1<<20)}
	go func() { p.served <- w.Serve(context.Background()) }()
	t.Cleanup(func() {
		_ = p.conn.Close()
		select {
		case <-p.served:
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after end of file")
		}
	})
	hello, ok := p.next().(*proto.Hello)
	if !ok {
		t.Fatal("the worker did not start with HELLO")
	}
	if hello.MaxConcurrency != 64 || hello.MaxFrameSize != 16<<20 || hello.SDKName != SDKName {
		t.Fatalf("HELLO offers %d, %d, %q", hello.MaxConcurrency, hello.MaxFrameSize, hello.SDKName)
	}
	for i, m := range hello.Methods {
		p.methods[m.Name] = uint16(i)
	}
	if offer.MaxFrameSize == 0 {
		offer.MaxFrameSize = proto.DefaultMaxFrameSize
	}
	if offer.InitialCredit == 0 {
		offer.InitialCredit = proto.DefaultInitialCredit
	}
	if offer.MaxInFlight == 0 {
		offer.MaxInFlight = 64
	}
	if offer.MaxMessageSize == 0 {
		offer.MaxMessageSize = proto.DefaultMaxMessageSize
	}
	welcome, _, err := proto.Negotiate(hello, offer)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.core.SendWelcome(welcome); err != nil {
		t.Fatal(err)
	}
	p.flush()
	return p
}

func (p *fakeParent) flush() {
	p.t.Helper()
	if b := p.core.TakeOutput(-1); len(b) > 0 {
		if _, err := p.conn.Write(b); err != nil {
			p.t.Fatal(err)
		}
	}
}

// nextWithin is the next event, or nil when none comes within d (or at end of file).
func (p *fakeParent) nextWithin(d time.Duration) proto.Event {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		ev, err := p.core.NextEvent()
		if err != nil {
			p.t.Fatal(err)
		}
		if ev != nil {
			return ev
		}
		_ = p.conn.SetReadDeadline(deadline)
		n, err := p.conn.Read(p.buf)
		p.core.Receive(p.buf[:n])
		if err != nil {
			if n == 0 {
				return nil
			}
		}
	}
}

func (p *fakeParent) next() proto.Event {
	p.t.Helper()
	ev := p.nextWithin(5 * time.Second)
	if ev == nil {
		p.t.Fatal("no event from the worker within 5 s")
	}
	return ev
}

func (p *fakeParent) request(method, body string, timeout time.Duration) uint64 {
	p.t.Helper()
	return p.requestCodec(method, proto.CodecJSON, body, timeout)
}

func (p *fakeParent) requestCodec(method string, codec uint8, body string, timeout time.Duration) uint64 {
	p.t.Helper()
	id, err := p.core.SendRequest(p.methods[method], codec, uint64(timeout/time.Microsecond), []byte(body))
	if err != nil {
		p.t.Fatal(err)
	}
	p.flush()
	return id
}

func (p *fakeParent) expectResult(id uint64, want string) {
	p.t.Helper()
	switch e := p.next().(type) {
	case *proto.Result:
		if e.ID != id || string(e.Body) != want {
			p.t.Fatalf("RESULT %d %q, want %d %q", e.ID, e.Body, id, want)
		}
	case *proto.ErrorFrame:
		p.t.Fatalf("ERROR %v %q, want RESULT %q", e.Code, e.Message, want)
	default:
		p.t.Fatalf("%T, want RESULT", e)
	}
}

func (p *fakeParent) expectError(id uint64, code proto.ErrorCode, contains string) *proto.ErrorFrame {
	p.t.Helper()
	for {
		ev := p.next()
		if _, ok := ev.(*proto.Rows); ok {
			continue
		}
		e, ok := ev.(*proto.ErrorFrame)
		if !ok || e.ID != id || e.Code != code || !strings.Contains(e.Message, contains) {
			p.t.Fatalf("%#v, want ERROR %d %v containing %q", ev, id, code, contains)
		}
		return e
	}
}

type addReq struct{ A, B int }
type addResp struct {
	Sum int `json:"sum"`
}

func TestUnary(t *testing.T) {
	w := New()
	Method(w, "add", func(_ context.Context, r addReq) (addResp, error) { return addResp{r.A + r.B}, nil })
	Method(w, "echo", func(_ context.Context, b Bytes) (Bytes, error) { return b, nil }, Codecs(Raw, JSON, Msgpack, CBOR))
	Method(w, "fail", func(_ context.Context, _ any) (any, error) {
		return nil, Error{Code: 1042, Message: "no", Details: map[string]int{"x": 1}}
	})
	Method(w, "plain", func(_ context.Context, _ any) (any, error) { return nil, errors.New("plain error") })
	Method(w, "panic", func(_ context.Context, _ any) (any, error) { panic("boom") })
	Method(w, "big", func(_ context.Context, n int) (string, error) { return strings.Repeat("x", n), nil })
	p := start(t, w, proto.Offer{MaxFrameSize: 65536, MaxMessageSize: 65536})

	p.expectResult(p.request("add", `{"A": 1, "B": 2}`, 0), `{"sum":3}`)
	p.expectResult(p.requestCodec("echo", proto.CodecRaw, "", 0), "")
	e := p.expectError(p.request("fail", `null`, 0), 1042, "no")
	if e.Details != `{"x":1}` {
		t.Fatalf("details %q", e.Details)
	}
	p.expectError(p.request("plain", `null`, 0), proto.CodeHandlerError, "plain error")
	p.expectError(p.request("panic", `null`, 0), proto.CodeHandlerPanic, "boom")
	p.expectError(p.request("add", `{"A": "x"}`, 0), proto.CodeBadRequest, "json")
	p.expectError(p.requestCodec("add", proto.CodecMsgpack, "\x80", 0), proto.CodeCodecUnsupported, "")
	p.expectError(p.request("big", `70000`, 0), proto.CodeHandlerError, "is above max_message_size 65536")
	p.expectResult(p.request("big", `60000`, 0), `"`+strings.Repeat("x", 60000)+`"`)
}

func TestContinuedRequestAndResult(t *testing.T) {
	w := New()
	Method(w, "echo", func(_ context.Context, b Bytes) (Bytes, error) { return b, nil })
	p := start(t, w, proto.Offer{MaxFrameSize: 65536})
	body := strings.Repeat("abcdefgh", 50000) // 400,000 bytes: seven frames each way
	p.expectResult(p.requestCodec("echo", proto.CodecRaw, body, 0), body)
}

type row struct {
	I int `json:"i"`
}

func TestStreamWithCredit(t *testing.T) {
	const n = 5000
	w := New()
	Stream(w, "rows", func(_ context.Context, count int, rows *Rows[row]) (string, error) {
		for i := range count {
			if err := rows.Send(row{i}); err != nil {
				return "", err
			}
		}
		return "done", nil
	})
	const credit = 4096
	p := start(t, w, proto.Offer{MaxFrameSize: 65536, InitialCredit: credit})
	id := p.request("rows", "5000", 0)

	// Without a grant the worker stops once its credit is spent: at most credit + one frame.
	unread := 0
	var held []*proto.Rows
	for unread < credit {
		r, ok := p.next().(*proto.Rows)
		if !ok {
			t.Fatal("the stream ended before its credit was spent")
		}
		unread += r.PayloadLen
		held = append(held, r)
	}
	if ev := p.nextWithin(100 * time.Millisecond); ev != nil {
		t.Fatalf("a %T came with the credit spent (%d bytes unread)", ev, unread)
	}
	if unread > credit+65536 {
		t.Fatalf("%d bytes unread, above credit + max_frame_size", unread)
	}
	got := 0
	check := func(r *proto.Rows) {
		for _, b := range r.Rows {
			if want := `{"i":` + strconv.Itoa(got) + `}`; string(b) != want {
				t.Fatalf("row %d is %q", got, b)
			}
			got++
		}
		p.core.Consumed(r.ID, r.PayloadLen)
		p.flush()
	}
	for _, r := range held {
		check(r)
	}
	for {
		switch e := p.next().(type) {
		case *proto.Rows:
			check(e)
		case *proto.End:
			if e.ID != id || e.RowCount != n || got != n || string(e.Summary) != `"done"` {
				t.Fatalf("END %d rows %d (read %d), summary %q", e.ID, e.RowCount, got, e.Summary)
			}
			return
		default:
			t.Fatalf("%#v in the stream", e)
		}
	}
}

func TestFlushRuleAndRowTooLarge(t *testing.T) {
	release := make(chan struct{})
	w := New()
	Stream(w, "one", func(ctx context.Context, _ any, rows *Rows[int]) (NoSummary, error) {
		if err := rows.Send(7); err != nil {
			return NoSummary{}, err
		}
		<-release
		return NoSummary{}, nil
	})
	Stream(w, "huge", func(_ context.Context, _ any, rows *Rows[Bytes]) (NoSummary, error) {
		_ = rows.Send(make(Bytes, 70000)) // the handler ignores the error: the stream still ends ROW_TOO_LARGE
		return NoSummary{}, nil
	})
	p := start(t, w, proto.Offer{MaxFrameSize: 65536})
	id := p.request("one", "null", 0)
	began := time.Now()
	r, ok := p.next().(*proto.Rows)
	if !ok || r.ID != id || len(r.Rows) != 1 || string(r.Rows[0]) != "7" {
		t.Fatalf("%#v, want the one row", r)
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("the row came after %v", d)
	}
	close(release)
	if e, ok := p.next().(*proto.End); !ok || e.RowCount != 1 || len(e.Summary) != 0 {
		t.Fatalf("%#v, want END with 1 row and no summary", e)
	}
	p.expectError(p.request("huge", "null", 0), proto.CodeRowTooLarge, "70000")
}

func TestCancel(t *testing.T) {
	w := New()
	Method(w, "sleep", func(ctx context.Context, _ any) (any, error) {
		<-ctx.Done()
		return "ignored", nil // returns normally, yet the request ends CANCELLED (8.3)
	})
	Stream(w, "forever", func(_ context.Context, _ any, rows *Rows[int]) (NoSummary, error) {
		for i := 0; ; i++ {
			if err := rows.Send(i); err != nil {
				return NoSummary{}, err
			}
		}
	})
	p := start(t, w, proto.Offer{MaxFrameSize: 65536, InitialCredit: 4096})
	id := p.request("sleep", "null", 0)
	if err := p.core.SendCancel(id); err != nil {
		t.Fatal(err)
	}
	p.flush()
	p.expectError(id, proto.CodeCancelled, "")

	// A stream stalled on credit is woken by CANCEL.
	sid := p.request("forever", "null", 0)
	if _, ok := p.next().(*proto.Rows); !ok {
		t.Fatal("no rows")
	}
	if err := p.core.SendCancel(sid); err != nil {
		t.Fatal(err)
	}
	p.flush()
	p.expectError(sid, proto.CodeCancelled, "")
}

func TestDeadline(t *testing.T) {
	release := make(chan struct{})
	returned := make(chan struct{})
	w := New()
	Method(w, "deaf", func(_ context.Context, _ any) (string, error) {
		<-release // ignores its deadline: the worker answers at its timer anyway
		close(returned)
		return "late", nil
	})
	Method(w, "polite", func(ctx context.Context, _ any) (any, error) {
		if _, ok := ctx.Deadline(); !ok {
			return nil, errors.New("no deadline in the context")
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	p := start(t, w, proto.Offer{})
	began := time.Now()
	id := p.request("deaf", "null", 50*time.Millisecond)
	p.expectError(id, proto.CodeDeadlineExceeded, "")
	if d := time.Since(began); d < 50*time.Millisecond {
		t.Fatalf("DEADLINE_EXCEEDED after %v", d)
	}
	close(release)
	<-returned
	p.expectError(p.request("polite", "null", 20*time.Millisecond), proto.CodeDeadlineExceeded, "")
	// The abandoned handler's late result was dropped: the connection still serves.
	p.expectError(p.request("polite", "null", time.Microsecond), proto.CodeDeadlineExceeded, "")
}

func TestPingDuringLongHandler(t *testing.T) {
	release := make(chan struct{})
	w := New()
	Method(w, "long", func(_ context.Context, _ any) (int, error) {
		<-release
		return 1, nil
	})
	Method(w, "spin", func(ctx context.Context, ms int) (int, error) {
		end := time.Now().Add(time.Duration(ms) * time.Millisecond)
		for time.Now().Before(end) && ctx.Err() == nil {
		}
		return ms, nil
	})
	p := start(t, w, proto.Offer{})
	id := p.request("long", "null", 0)
	spins := []uint64{p.request("spin", "300", 0), p.request("spin", "300", 0), p.request("spin", "300", 0)}
	for i := range 3 {
		nonce := [8]byte{byte(i), 2, 3}
		if err := p.core.SendPing(nonce); err != nil {
			t.Fatal(err)
		}
		p.flush()
		pong, ok := p.next().(*proto.Pong)
		if !ok || pong.Nonce != nonce {
			t.Fatalf("%#v, want PONG %v", pong, nonce)
		}
	}
	pending := map[uint64]bool{spins[0]: true, spins[1]: true, spins[2]: true}
	for len(pending) > 0 {
		r, ok := p.next().(*proto.Result)
		if !ok || !pending[r.ID] || string(r.Body) != "300" {
			t.Fatalf("%#v, want a spin's RESULT", r)
		}
		delete(pending, r.ID)
	}
	close(release)
	p.expectResult(id, "1")
}

func TestDrain(t *testing.T) {
	release := make(chan struct{})
	w := New()
	Method(w, "wait", func(_ context.Context, _ any) (int, error) {
		<-release
		return 1, nil
	})
	p := start(t, w, proto.Offer{})
	id := p.request("wait", "null", 0)
	if err := p.core.SendDrain(10_000); err != nil {
		t.Fatal(err)
	}
	p.flush()
	if ev := p.nextWithin(50 * time.Millisecond); ev != nil {
		t.Fatalf("%#v before the request in flight ended", ev)
	}
	close(release)
	p.expectResult(id, "1")
	if g, ok := p.next().(*proto.Goodbye); !ok || g.Reason != proto.GoodbyeDrained {
		t.Fatalf("%#v, want GOODBYE 0", g)
	}
	if err := <-p.served; err != nil {
		t.Fatalf("Serve after a drain: %v", err)
	}
	p.served <- nil // for the cleanup
}

func TestDrainPastGrace(t *testing.T) {
	release := make(chan struct{})
	returned := make(chan struct{})
	w := New()
	Method(w, "deaf", func(_ context.Context, _ any) (int, error) {
		<-release
		close(returned)
		return 1, nil
	})
	p := start(t, w, proto.Offer{})
	id := p.request("deaf", "null", 0)
	if err := p.core.SendDrain(50); err != nil {
		t.Fatal(err)
	}
	p.flush()
	p.expectError(id, proto.CodeCancelled, "")
	if _, ok := p.next().(*proto.Goodbye); !ok {
		t.Fatal("no GOODBYE")
	}
	if err := <-p.served; err != nil {
		t.Fatalf("Serve after a drain: %v", err)
	}
	p.served <- nil
	close(release)
	<-returned
}

func TestFatal(t *testing.T) {
	w := New()
	Method(w, "add", func(_ context.Context, r addReq) (addResp, error) { return addResp{r.A + r.B}, nil })
	p := start(t, w, proto.Offer{})
	// A frame of an unknown type: the worker reports it (ERROR id 0) and leaves with an error.
	bad := make([]byte, 16)
	bad[4] = 0x7d
	if _, err := p.conn.Write(bad); err != nil {
		t.Fatal(err)
	}
	e, ok := p.next().(*proto.ErrorFrame)
	if !ok || e.ID != 0 || e.Code != proto.CodeUnknownFrameType {
		t.Fatalf("%#v, want ERROR 0 UNKNOWN_FRAME_TYPE", e)
	}
	err := <-p.served
	var fe *FatalError
	if !errors.As(err, &fe) || fe.Code != proto.CodeUnknownFrameType {
		t.Fatalf("Serve returned %v", err)
	}
	p.served <- nil
}

func TestEndOfFile(t *testing.T) {
	release := make(chan struct{})
	returned := make(chan struct{})
	w := New()
	Method(w, "wait", func(ctx context.Context, _ any) (int, error) {
		<-release
		close(returned)
		return 1, nil
	})
	p := start(t, w, proto.Offer{})
	p.request("wait", "null", 0)
	_ = p.conn.Close()
	if err := <-p.served; err != nil { // without waiting for the handler (8.4)
		t.Fatalf("Serve at end of file: %v", err)
	}
	p.served <- nil
	close(release)
	<-returned
}
