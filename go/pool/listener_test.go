package pool_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
	"github.com/wirepool/wirepool/go/worker"
)

// listen starts a listener closed at the test's end; its refusals go to the test log.
func listen(t *testing.T, o pool.ListenOptions) *pool.Listener {
	t.Helper()
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	l, err := pool.Listen(o)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// dialTLS connects as a worker does (21.1): TLS 1.3, the certificate pinned by the listener's
// fingerprint, the given ALPN list.
func dialTLS(t *testing.T, l *pool.Listener, alpn []string) (*tls.Conn, error) {
	t.Helper()
	fp := l.Fingerprint()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: alpn, InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || sha256.Sum256(raw[0]) != fp {
				return errors.New("pin mismatch")
			}
			return nil
		}}
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", l.Addr().String(), cfg)
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

// joinBlock is 21.3's 64 bytes for id and secret.
func joinBlock(magic string, version uint16, id [16]byte, secret [32]byte) []byte {
	b := append([]byte(magic), 0, 0, 0, 0, 0, 0, 0, 0)
	binary.LittleEndian.PutUint16(b[8:], version)
	return append(append(b[:16], id[:]...), secret[:]...)
}

// readAll reads until end of file or 5 s (a bound, never the expected outcome).
func readAll(t *testing.T, c net.Conn) ([]byte, error) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return io.ReadAll(c)
}

// answer is the one ERROR id 0 frame in b, as a worker's core reads it.
func answer(t *testing.T, b []byte) *proto.ErrorFrame {
	t.Helper()
	core := proto.NewConnection(proto.Worker)
	core.Receive(b)
	ev, err := core.NextEvent()
	if err != nil {
		t.Fatalf("the listener's answer does not decode: %v (% x)", err, b)
	}
	e, ok := ev.(*proto.ErrorFrame)
	if !ok || e.ID != 0 {
		t.Fatalf("the listener's answer is %#v, not an ERROR id 0", ev)
	}
	return e
}

func TestRemoteWorkersJoinAndServe(t *testing.T) {
	l := listen(t, pool.ListenOptions{})
	p := start(t, pool.Options{Remote: l, Workers: pool.Set(2)})
	ctx := bounded(t)
	for i := range 4 {
		got, err := pool.Call[map[string]int, map[string]int](ctx, p, "add", map[string]int{"a": i, "b": 2})
		if err != nil || got["sum"] != i+2 {
			t.Fatalf("add over TLS: %v %v", got, err)
		}
	}
	if n := len(p.Stats().Workers); n != 2 {
		t.Fatalf("%d workers, want 2", n)
	}
	st := l.Stats()
	if st.Joined != 2 || st.Refused != 0 || st.Pending != 0 || st.Tickets != 0 {
		t.Fatalf("listener stats %+v: want 2 joined, none refused or pending, both single-use tickets spent", st)
	}
}

func TestRemoteWorkerDeathIsALostConnection(t *testing.T) {
	l := listen(t, pool.ListenOptions{})
	p := start(t, pool.Options{Remote: l, Workers: pool.Set(1), RestartBackoff: pool.Set(time.Millisecond)})
	ctx := bounded(t)
	const n = 3
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := pool.Call[int, int](ctx, p, "sleep", 15000)
			errs <- err
		}()
	}
	for p.InFlight() < n { // polling the pool's own accounting, bounded by ctx
		if ctx.Err() != nil {
			t.Fatal("the sleeps never reached the worker")
		}
		time.Sleep(2 * time.Millisecond)
	}
	_, err := pool.Call[map[string]int, any](ctx, p, "exit", map[string]int{"status": 3})
	lost := func(err error) {
		t.Helper()
		var e *pool.Error
		if !errors.As(err, &e) || e.Code != proto.CodeWorkerExited {
			t.Fatalf("got %v, want WORKER_EXITED", err)
		}
		var d map[string]any
		if json.Unmarshal(e.Details, &d) != nil || d["connection"] != "lost" || d["exit_status"] != nil ||
			d["signal"] != nil || d["host"] == "" || d["pid"] == nil {
			t.Fatalf("details %s: want connection lost, host and pid, status and signal null", e.Details)
		}
		if e.StderrTail != nil || !strings.Contains(e.Message, "connection lost") {
			t.Fatalf("a lost connection's error %q has a stderr tail %q", e.Message, e.StderrTail)
		}
	}
	lost(err)
	for range n {
		select {
		case err := <-errs:
			lost(err)
		case <-ctx.Done():
			t.Fatal("an in-flight call never ended")
		}
	}
	got, err := pool.Call[map[string]int, map[string]int](ctx, p, "add", map[string]int{"a": 1, "b": 2})
	if err != nil || got["sum"] != 3 {
		t.Fatalf("the replacement did not serve: %v %v", got, err)
	}
	if st := p.Stats(); st.Restarts != 1 || p.InFlight() != 0 {
		t.Fatalf("stats %+v, in flight %d: want one restart, nothing in flight", st, p.InFlight())
	}
	if st := l.Stats(); st.Joined != 2 {
		t.Fatalf("listener stats %+v: want 2 joins (the worker and its replacement)", st)
	}
}

func TestRemoteWorkerThatNeverJoins(t *testing.T) {
	l := listen(t, pool.ListenOptions{})
	ctx := bounded(t)
	for _, c := range []struct {
		name, script string
		code         proto.ErrorCode
		want         string
	}{
		{"exits", "echo cannot join >&2; exit 3", proto.CodeWorkerExited, "exited before it joined"},
		{"silent", "exec sleep 30", proto.CodeStartupTimeout, "did not join within"},
	} {
		t.Run(c.name, func(t *testing.T) {
			started := time.Now()
			_, err := pool.Start(ctx, pool.Options{Command: []string{"sh", "-c", c.script}, Workers: pool.Set(1),
				Remote: l, StartupTimeout: pool.Set(300 * time.Millisecond)})
			var e *pool.Error
			if !errors.As(err, &e) || e.Code != c.code || !strings.Contains(e.Message, c.want) {
				t.Fatalf("Start: %v, want %v saying %q", err, c.code, c.want)
			}
			if c.code == proto.CodeWorkerExited && !strings.Contains(e.Message, "cannot join") {
				t.Fatalf("the child's own stderr is not in %q", e.Message)
			}
			if time.Since(started) > 10*time.Second {
				t.Fatalf("Start took %v", time.Since(started))
			}
		})
	}
	if st := l.Stats(); st.Tickets != 0 {
		t.Fatalf("%d tickets left behind by workers that never joined", st.Tickets)
	}
}

func TestListenerRefusesBadJoins(t *testing.T) {
	l := listen(t, pool.ListenOptions{HelloTimeout: 300 * time.Millisecond})
	good, err := l.Issue(0, false)
	if err != nil {
		t.Fatal(err)
	}
	single, _ := l.Issue(0, true)
	expired, _ := l.Issue(0, false)
	pool.ExpireTicket(l, expired.ID) // after the last Issue, which forgets expired tickets
	var unknown [16]byte
	unknown[0] = 1
	wrong := good.Secret
	wrong[31] ^= 1
	reserved := joinBlock(proto.RemoteJoinMagic, 1, good.ID, good.Secret)
	reserved[12] = 1
	cases := []struct {
		name  string
		block []byte
		code  proto.ErrorCode // 0: closed without a word
		msg   string
		cause string
	}{
		{"bad magic", joinBlock("NOTAJOIN", 1, good.ID, good.Secret), 0, "", "bad magic"},
		{"version", joinBlock(proto.RemoteJoinMagic, 2, good.ID, good.Secret), proto.CodeVersionMismatch, "join version 2 is not supported (1)", "join version"},
		{"reserved", reserved, proto.CodeBadHandshake, "join refused", "reserved bytes not zero"},
		{"unknown", joinBlock(proto.RemoteJoinMagic, 1, unknown, good.Secret), proto.CodeBadHandshake, "join refused", "unknown or revoked ticket"},
		{"wrong secret", joinBlock(proto.RemoteJoinMagic, 1, good.ID, wrong), proto.CodeBadHandshake, "join refused", "wrong secret"},
		{"expired", joinBlock(proto.RemoteJoinMagic, 1, expired.ID, expired.Secret), proto.CodeBadHandshake, "join refused", "expired ticket"},
		// Nobody waits for a worker: parked until the hello bound, then refused (21.4) ...
		{"no slot", joinBlock(proto.RemoteJoinMagic, 1, single.ID, single.Secret), proto.CodeBadHandshake, "join refused: the pool is full", "pool full"},
		// ... and the single-use ticket was spent by that join all the same (21.2).
		{"spent", joinBlock(proto.RemoteJoinMagic, 1, single.ID, single.Secret), proto.CodeBadHandshake, "join refused", "unknown or revoked ticket"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := l.Stats().RefusedBy[c.cause]
			conn, err := dialTLS(t, l, []string{proto.RemoteALPN})
			if err != nil {
				t.Fatalf("TLS: %v", err)
			}
			// The HELLO a worker sends at once behind its JOIN block: the refusal must reach it
			// all the same (read and dropped, not reset).
			if _, err := conn.Write(append(c.block, bytes.Repeat([]byte{0}, 300)...)); err != nil {
				t.Fatal(err)
			}
			b, err := readAll(t, conn)
			conn.Close() // as a refused worker does: the listener's linger ends with it
			if err != nil {
				t.Fatalf("read %d bytes, then %v: want the answer and end of file", len(b), err)
			}
			if c.code == 0 {
				if len(b) != 0 {
					t.Fatalf("answered % x, want a close without a word", b)
				}
			} else if e := answer(t, b); e.Code != c.code || e.Message != c.msg {
				t.Fatalf("answer %v %q, want %v %q", e.Code, e.Message, c.code, c.msg)
			}
			if got := l.Stats().RefusedBy[c.cause]; got != before+1 {
				t.Fatalf("refusals for %q: %d, want %d (%v)", c.cause, got, before+1, l.Stats().RefusedBy)
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Pending > 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond) // polling the listener's accounting, bounded
	}
	st := l.Stats()
	if st.Joined != 0 || st.Pending != 0 || st.Refused != len(cases) {
		t.Fatalf("stats %+v: want %d refused, none joined or pending", st, len(cases))
	}
}

func TestListenerRefusesWhatIsNotAWirepoolTLSClient(t *testing.T) {
	l := listen(t, pool.ListenOptions{})
	tk, _ := l.Issue(0, false)
	block := joinBlock(proto.RemoteJoinMagic, 1, tk.ID, tk.Secret)
	t.Run("other ALPN", func(t *testing.T) {
		if _, err := dialTLS(t, l, []string{"h2"}); err == nil {
			t.Fatal("a client offering only h2 completed its handshake")
		}
	})
	t.Run("no ALPN", func(t *testing.T) {
		c, err := dialTLS(t, l, nil)
		if err != nil {
			t.Fatalf("TLS: %v", err)
		}
		_, _ = c.Write(block)
		if b, _ := readAll(t, c); len(b) != 0 {
			t.Fatalf("a client without ALPN was answered % x", b)
		}
	})
	t.Run("no TLS", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		started := time.Now()
		_, _ = c.Write(block)
		b, _ := readAll(t, c)
		// Go's TLS server answers a record that is not TLS with a plain-text HTTP 400 line at
		// most, and never a wirepool frame.
		if len(b) > 0 && !bytes.HasPrefix(b, []byte("HTTP/1.0 400")) && b[0] != 0x15 {
			t.Fatalf("plain bytes on the TLS port were answered % x", b)
		}
		if time.Since(started) > 4*time.Second {
			t.Fatalf("garbage held the connection %v: it must end at once", time.Since(started))
		}
	})
	t.Run("TLS 1.2", func(t *testing.T) {
		cfg := &tls.Config{MaxVersion: tls.VersionTLS12, NextProtos: []string{proto.RemoteALPN}, InsecureSkipVerify: true}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", l.Addr().String(), cfg)
		if err == nil {
			c.Close()
			t.Fatal("a TLS 1.2 client completed its handshake")
		}
	})
	// The server side of a failed handshake ends after the client's: wait for the counts.
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().RefusedBy["tls handshake failed"] < 4 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond) // polling the listener's counters, bounded
	}
	if st := l.Stats(); st.RefusedBy["tls handshake failed"] != 4 || st.Joined != 0 {
		t.Fatalf("stats %+v: want 4 TLS handshake refusals, no join", st)
	}
}

func TestListenerJoinTimeout(t *testing.T) {
	const bound = 200 * time.Millisecond
	l := listen(t, pool.ListenOptions{JoinTimeout: bound})
	tk, _ := l.Issue(0, false)
	t.Run("silent TCP", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		started := time.Now()
		if b, _ := readAll(t, c); len(b) != 0 {
			t.Fatalf("a silent peer was sent % x", b)
		}
		if d := time.Since(started); d < bound/2 || d > 4*time.Second {
			t.Fatalf("a silent peer was closed after %v, want about %v", d, bound)
		}
	})
	t.Run("trickling JOIN", func(t *testing.T) {
		c, err := dialTLS(t, l, []string{proto.RemoteALPN})
		if err != nil {
			t.Fatalf("TLS: %v", err)
		}
		started := time.Now()
		_, _ = c.Write(joinBlock(proto.RemoteJoinMagic, 1, tk.ID, tk.Secret)[:10])
		if b, _ := readAll(t, c); len(b) != 0 {
			t.Fatalf("a half JOIN was answered % x", b)
		}
		if d := time.Since(started); d > 4*time.Second {
			t.Fatalf("a half JOIN held the connection %v", d)
		}
	})
	if st := l.Stats(); st.RefusedBy["join timeout"] != 2 || st.Pending != 0 {
		t.Fatalf("stats %+v: want 2 join timeouts, nothing pending", st)
	}
}

func TestListenerBoundsPendingJoins(t *testing.T) {
	l := listen(t, pool.ListenOptions{MaxPendingJoins: 2, JoinTimeout: 20 * time.Second})
	var crowd []net.Conn
	for range 2 {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		crowd = append(crowd, c)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Pending < 2 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond) // polling the listener's accounting, bounded
	}
	if st := l.Stats(); st.Pending != 2 {
		t.Fatalf("stats %+v: the silent crowd of 2 is not pending", st)
	}
	extra, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	started := time.Now()
	if b, _ := readAll(t, extra); len(b) != 0 || time.Since(started) > 4*time.Second {
		t.Fatalf("the third connection got % x after %v: want it closed at once", b, time.Since(started))
	}
	if st := l.Stats(); st.RefusedBy["too many pending"] != 1 || st.Pending != 2 {
		t.Fatalf("stats %+v: want one too many pending, the crowd still pending", st)
	}
	// A good worker still gets in once the crowd leaves.
	for _, c := range crowd {
		c.Close()
	}
	p := start(t, pool.Options{Remote: l})
	if _, err := pool.Call[map[string]int, map[string]int](bounded(t), p, "add", map[string]int{"a": 1, "b": 2}); err != nil {
		t.Fatalf("add after the crowd: %v", err)
	}
}

func TestListenOptionsRefuseBadInput(t *testing.T) {
	for _, c := range []struct {
		o     pool.ListenOptions
		field string
	}{
		{pool.ListenOptions{Addr: "nonsense"}, "addr"},
		{pool.ListenOptions{Addr: "127.0.0.1:70000"}, "addr"},
		{pool.ListenOptions{Addr: "0.0.0.0:0"}, "advertise"},
		{pool.ListenOptions{Advertise: strings.Repeat("a", 254)}, "advertise"},
		{pool.ListenOptions{Addr: "0.0.0.0:0", Advertise: "10.0.0.7", Plain: true}, "plain"},
		{pool.ListenOptions{Advertise: "example.com", Plain: true}, "plain"},
		{pool.ListenOptions{JoinTimeout: -time.Second}, "join_timeout"},
		{pool.ListenOptions{HelloTimeout: -1}, "hello_timeout"},
		{pool.ListenOptions{MaxPendingJoins: -1}, "max_pending_joins"},
		{pool.ListenOptions{MaxPendingJoins: 1 << 20}, "max_pending_joins"},
		{pool.ListenOptions{RefusalLogPerSecond: -1}, "refusal_log_per_second"},
	} {
		t.Run(fmt.Sprintf("%s %+v", c.field, c.o), func(t *testing.T) {
			l, err := pool.Listen(c.o)
			if l != nil {
				l.Close()
			}
			var e *pool.Error
			if !errors.As(err, &e) || e.Code != proto.CodeInvalidArgument || !strings.Contains(string(e.Details), `"field":"`+c.field+`"`) {
				t.Fatalf("got %v (%s), want INVALID_ARGUMENT for %s", err, detailsOf(err), c.field)
			}
		})
	}
	l := listen(t, pool.ListenOptions{})
	if _, err := l.Issue(-time.Second, false); !errors.Is(err, &pool.Error{Code: proto.CodeInvalidArgument}) {
		t.Fatalf("Issue(-1s): %v, want INVALID_ARGUMENT", err)
	}
	l.Close()
	if _, err := l.Issue(0, false); !errors.Is(err, &pool.Error{Code: proto.CodePoolClosed}) {
		t.Fatalf("Issue after Close: %v, want POOL_CLOSED", err)
	}
	ctx := bounded(t)
	if _, err := pool.Start(ctx, pool.Options{Command: []string{workerBin}, Workers: pool.Set(1), Remote: l}); !errors.Is(err, &pool.Error{Code: proto.CodePoolClosed}) {
		t.Fatalf("Start on a closed listener: %v, want POOL_CLOSED", err)
	}
}

func detailsOf(err error) string {
	var e *pool.Error
	if errors.As(err, &e) {
		return string(e.Details)
	}
	return ""
}

func TestPlainLoopbackListener(t *testing.T) {
	l := listen(t, pool.ListenOptions{Plain: true})
	tk, err := l.Issue(time.Minute, false)
	if err != nil {
		t.Fatal(err)
	}
	back, err := worker.ParseTicket(tk.Encode())
	if err != nil || back.TLS || back.Host != "127.0.0.1" || back.Port != tk.Port {
		t.Fatalf("the plain ticket reads back as %v (%v)", back, err)
	}
	p := start(t, pool.Options{Remote: l})
	if got, err := pool.Call[map[string]int, map[string]int](bounded(t), p, "add", map[string]int{"a": 2, "b": 2}); err != nil || got["sum"] != 4 {
		t.Fatalf("add over plain TCP: %v %v", got, err)
	}
}

// The listener's goroutines end with Close, also with connections in every state.
func TestListenerCloseEndsEverything(t *testing.T) {
	l, err := pool.Listen(pool.ListenOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	tk, _ := l.Issue(0, true)
	silent, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	parked, err := dialTLS(t, l, []string{proto.RemoteALPN})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = parked.Write(joinBlock(proto.RemoteJoinMagic, 1, tk.ID, tk.Secret))
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Pending < 2 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond) // polling the listener's accounting, bounded
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = readAll(t, parked)
	}()
	done := make(chan struct{})
	go func() {
		_ = l.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	wg.Wait()
	if st := l.Stats(); st.Pending != 0 {
		t.Fatalf("stats after Close %+v", st)
	}
}

// lines is a slog handler that keeps the messages it is given.
type lines struct {
	mu  sync.Mutex
	msg []string
}

func (h *lines) Enabled(context.Context, slog.Level) bool { return true }
func (h *lines) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msg = append(h.msg, r.Message)
	h.mu.Unlock()
	return nil
}
func (h *lines) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *lines) WithGroup(string) slog.Handler      { return h }

// counted is how many refusals the log accounts for: the lines, plus the counts of the
// "N more refusals not logged" lines.
func (h *lines) counted() (refusals, dropLines int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.msg {
		var n int
		if _, err := fmt.Sscanf(m, "wirepool listener: %d more refusals not logged", &n); err == nil {
			refusals += n
			dropLines++
		} else if strings.HasPrefix(m, "wirepool listener: refused ") {
			refusals++
		}
	}
	return refusals, dropLines
}

func TestListenerRateLimitsItsRefusalLog(t *testing.T) {
	h := &lines{}
	const burst = 6
	l := listen(t, pool.ListenOptions{RefusalLogPerSecond: 2, MaxPendingJoins: 1, JoinTimeout: 20 * time.Second,
		Logger: slog.New(h)})
	hold, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Pending < 1 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond) // polling the listener's accounting, bounded
	}
	for range burst { // each refused at accept: too many pending
		c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = readAll(t, c)
		c.Close()
	}
	// The dropped count is logged when its second ends, with no further refusal to carry it.
	deadline = time.Now().Add(5 * time.Second)
	for n, _ := h.counted(); n < burst && time.Now().Before(deadline); n, _ = h.counted() {
		time.Sleep(5 * time.Millisecond) // polling the log, bounded
	}
	n, drops := h.counted()
	h.mu.Lock()
	logged := len(h.msg)
	h.mu.Unlock()
	if n != burst || (logged-drops > 2 && drops == 0) {
		t.Fatalf("the log accounts for %d of %d refusals in %d lines (%d of them counts): %q", n, burst, logged, drops, h.msg)
	}
}

func TestRemoteHelloTimeout(t *testing.T) {
	const bound = 500 * time.Millisecond
	joiner := filepath.Join(t.TempDir(), "silentjoiner") // joins, then sends nothing
	if out, err := exec.Command("go", "build", "-o", joiner, "./testdata/silentjoiner").CombinedOutput(); err != nil {
		t.Fatalf("build testdata/silentjoiner: %v\n%s", err, out)
	}
	l := listen(t, pool.ListenOptions{HelloTimeout: bound})
	_, err := pool.Start(bounded(t), pool.Options{Command: []string{joiner}, Workers: pool.Set(1), Remote: l,
		StartupTimeout: pool.Set(15 * time.Second)})
	var e *pool.Error
	if !errors.As(err, &e) || e.Code != proto.CodeStartupTimeout || !strings.Contains(e.Message, "no complete HELLO within the hello timeout") {
		t.Fatalf("Start: %v, want STARTUP_TIMEOUT at the hello bound", err)
	}
	if st := l.Stats(); st.Joined != 1 {
		t.Fatalf("listener stats %+v: the silent worker had joined", st)
	}
}

func TestRemoteHeartbeatIsNeverOff(t *testing.T) {
	l := listen(t, pool.ListenOptions{})
	p := start(t, pool.Options{Remote: l, Heartbeat: pool.NoHeartbeat})
	ctx := bounded(t)
	started := time.Now()
	_, err := pool.Call[any, any](ctx, p, "freeze", nil)
	// 21.5: heartbeat 0 is the default 1 s on a remote connection, so a stopped worker is found
	// hung (3 heartbeats), not waited for until ctx ends.
	if !errors.Is(err, &pool.Error{Code: proto.CodeWorkerHung}) {
		t.Fatalf("freeze: %v after %v, want WORKER_HUNG", err, time.Since(started))
	}
	if d := time.Since(started); d > 10*time.Second {
		t.Fatalf("WORKER_HUNG after %v: the heartbeat was not 1 s", d)
	}
}
