package pool_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

func pids(p *pool.Pool) []int {
	var out []int
	for _, w := range p.Stats().Workers {
		out = append(out, w.Pid)
	}
	return out
}

func TestHeartbeatFindsAStoppedWorker(t *testing.T) {
	p := start(t, pool.Options{Heartbeat: 100 * time.Millisecond})
	before := pids(p)
	started := time.Now()
	_, err := pool.Call[any, any](bounded(t), p, "freeze", nil)
	if code(err) != proto.CodeWorkerHung || time.Since(started) > 3*time.Second {
		t.Fatalf("freeze: %v after %v", err, time.Since(started))
	}
	r, err := pool.Call[map[string]int, addResp](bounded(t), p, "add", map[string]int{"a": 1, "b": 2})
	if err != nil || r.Sum != 3 {
		t.Fatalf("after the hang: %v %v", r, err)
	}
	if after := pids(p); len(after) != 1 || after[0] == before[0] || p.Stats().Restarts != 1 {
		t.Fatalf("not replaced: %v -> %v", before, after)
	}
}

func TestParentDeadlineIsTheBackstop(t *testing.T) {
	// No heartbeat: only the parent's own deadline (plus the grace) ends a frozen worker's call.
	p := start(t, pool.Options{Heartbeat: pool.NoHeartbeat, DeadlineGrace: pool.Set(200 * time.Millisecond),
		CancelGrace: pool.Set(100 * time.Millisecond)})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err := pool.Call[any, any](ctx, p, "freeze", nil)
	if elapsed := time.Since(started); code(err) != proto.CodeDeadlineExceeded || elapsed < 300*time.Millisecond {
		t.Fatalf("freeze: %v after %v (the deadline plus the grace is 300 ms)", err, elapsed)
	}
	// The request stays in flight until the cancel grace kills the worker: a call sent to it
	// meanwhile ends with it; the next reaches the replacement.
	_, err = pool.Call[map[string]int, addResp](bounded(t), p, "add", map[string]int{"a": 2, "b": 2})
	var e *pool.Error
	if code(err) != proto.CodeWorkerExited || !errors.As(err, &e) || !strings.Contains(string(e.Details), `"signal":9`) {
		t.Fatalf("a call on the frozen worker: %v", err)
	}
	r, err := pool.Call[map[string]int, addResp](bounded(t), p, "add", map[string]int{"a": 2, "b": 2})
	if err != nil || r.Sum != 4 {
		t.Fatalf("after the kill: %v %v", r, err)
	}
}

func TestRecycleByRequestCount(t *testing.T) {
	p := start(t, pool.Options{MaxRequests: pool.Set(3)})
	seen := map[int]bool{}
	for i := range 10 {
		pid, err := pool.Call[any, int](bounded(t), p, "whoami", nil)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		seen[pid] = true
	}
	if len(seen) != 4 {
		t.Fatalf("10 calls, 3 per worker: %d workers served", len(seen))
	}
}

func TestLease(t *testing.T) {
	p := start(t, pool.Options{Workers: pool.Set(2)})
	ctx := bounded(t)
	l, err := p.Lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	for range 5 {
		if pid, err := pool.Call[any, int](ctx, l, "whoami", nil); err != nil || pid != l.Pid() {
			t.Fatalf("lease call: %v %v (lease of %d)", pid, err, l.Pid())
		}
		if pid, err := pool.Call[any, int](ctx, p, "whoami", nil); err != nil || pid == l.Pid() {
			t.Fatalf("pool call: %v %v (lease of %d)", pid, err, l.Pid())
		}
	}
	_, crashed := pool.Call[any, any](ctx, l, "crash", nil)
	_, lost := pool.Call[any, any](ctx, l, "whoami", nil)
	var e *pool.Error
	if code(crashed) != proto.CodeWorkerExited || code(lost) != proto.CodeLeaseLost || !errors.As(lost, &e) ||
		!strings.Contains(string(e.Details), `"signal":6`) {
		t.Fatalf("crash %v, then %v", crashed, lost)
	}
	l.Release()
	if _, err := pool.Call[any, any](ctx, l, "whoami", nil); code(err) != proto.CodeLeaseLost {
		t.Fatalf("released: %v", err)
	}
}

func TestRestartIntensityClosesThePool(t *testing.T) {
	p := start(t, pool.Options{MaxRestarts: pool.Set(2)})
	ctx := bounded(t)
	for i := range 3 {
		if _, err := pool.Call[any, any](ctx, p, "crash", nil); code(err) != proto.CodeWorkerExited {
			t.Fatalf("crash %d: %v", i, err)
		}
	}
	_, err := pool.Call[any, any](ctx, p, "whoami", nil)
	if code(err) != proto.CodePoolClosed || !strings.Contains(err.Error(), "restart intensity exceeded") || !p.Stats().Closed {
		t.Fatalf("after 3 crashes with max_restarts 2: %v", err)
	}
}

func TestRequiredMethods(t *testing.T) {
	ctx := bounded(t)
	for _, r := range []pool.Requirement{
		{Method: "add", Kind: proto.KindUnary, Codec: pool.Msgpack},
		{Method: "decls", Kind: proto.KindUnary, Codec: pool.JSON},
		{Method: "no_such", Kind: proto.KindUnary, Codec: pool.JSON},
	} {
		_, err := pool.Start(ctx, pool.Options{Command: []string{workerBin}, Require: []pool.Requirement{r}})
		if code(err) != proto.CodeCodecMismatch {
			t.Fatalf("%+v: %v", r, err)
		}
	}
	start(t, pool.Options{Require: []pool.Requirement{{Method: "decls", Kind: proto.KindStream, Codec: pool.CBOR}}})
	_, err := pool.Start(ctx, pool.Options{Command: []string{workerBin}, Require: []pool.Requirement{{Method: "x"}}})
	if code(err) != proto.CodeInvalidArgument {
		t.Fatalf("a requirement without a kind: %v", err)
	}
}

// countWarnings counts the records a pool logs at WARN or above.
type countWarnings struct{ n *atomic.Int64 }

func (c countWarnings) Enabled(context.Context, slog.Level) bool { return true }
func (c countWarnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && strings.Contains(r.Message, "is above the worker's max_concurrency") {
		c.n.Add(1)
	}
	return nil
}
func (c countWarnings) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c countWarnings) WithGroup(string) slog.Handler      { return c }

func TestClampSaidOncePerPool(t *testing.T) {
	n := new(atomic.Int64)
	p := start(t, pool.Options{Workers: pool.Set(2), MaxInFlight: pool.Set(1000), MaxRequests: pool.Set(2), Logger: slog.New(countWarnings{n})})
	for range 6 { // replacements clamp too, and say nothing more
		if _, err := pool.Call[any, int](bounded(t), p, "whoami", nil); err != nil {
			t.Fatal(err)
		}
	}
	if n.Load() != 1 {
		t.Fatalf("%d clamp notices", n.Load())
	}
	start(t, pool.Options{MaxInFlight: pool.Set(64), Logger: slog.New(countWarnings{n})})
	if n.Load() != 1 {
		t.Fatalf("a pool that does not clamp said it: %d", n.Load())
	}
}

func TestReplacementsThatNeverStartCountAgainstTheLimit(t *testing.T) {
	// Only the first process is a worker; every replacement exits 5 before its HELLO.
	dir := t.TempDir()
	script := `if [ -e "$0/started" ]; then exit 5; fi; touch "$0/started"; exec "$1"`
	p := start(t, pool.Options{Command: []string{"sh", "-c", script, dir, workerBin}, MaxRestarts: pool.Set(2)})
	ctx := bounded(t)
	if _, err := pool.Call[any, any](ctx, p, "crash", nil); code(err) != proto.CodeWorkerExited {
		t.Fatalf("crash: %v", err)
	}
	// The crash and two failed starts are the two restarts allowed and one more death.
	_, err := pool.Call[any, any](ctx, p, "whoami", nil)
	var e *pool.Error
	if code(err) != proto.CodePoolClosed || !errors.As(err, &e) || !strings.Contains(e.Message, "restart intensity exceeded") ||
		!strings.Contains(string(e.Details), `"exit_status":5`) {
		t.Fatalf("after the failed replacements: %v (%s)", err, e.Details)
	}
	if _, err := pool.Start(ctx, pool.Options{Command: []string{"/no/such/program"}}); code(err) != proto.CodeSpawnFailed {
		t.Fatalf("no such program: %v", err)
	}
}

func TestCallerInput(t *testing.T) {
	p := start(t, pool.Options{MaxFrameSize: pool.Set(65536), MaxMessageSize: pool.Set[int64](65536)})
	ctx := bounded(t)
	long := strings.Repeat("m", 1<<20)
	for name, c := range map[string]struct {
		err  error
		want proto.ErrorCode
	}{
		"empty method":               {second(pool.Call[any, any](ctx, p, "", 1)), proto.CodeUnknownMethod},
		"stream method through Call": {second(pool.Call[any, any](ctx, p, "decls", nil)), proto.CodeUnknownMethod},
		"1 MiB name":                 {second(pool.Call[any, any](ctx, p, long, 1)), proto.CodeUnknownMethod},
		"unencodable value":          {second(pool.Call[any, any](ctx, p, "echo", make(chan int))), proto.CodeBadRequest},
		"not bytes under raw":        {second(pool.Call[any, any](ctx, p, "echo", 12, pool.WithCodec(pool.Raw))), proto.CodeBadRequest},
		"unknown codec":              {second(pool.Call[any, any](ctx, p, "echo", 1, pool.WithCodec(pool.Codec(9)))), proto.CodeInvalidArgument},
		"negative timeout":           {second(pool.Call[any, any](ctx, p, "echo", 1, pool.WithTimeout(-time.Millisecond))), proto.CodeInvalidArgument},
		"zero timeout":               {second(pool.Call[any, any](ctx, p, "echo", 1, pool.WithTimeout(0))), proto.CodeDeadlineExceeded},
		"nil option":                 {second(pool.Call[any, any](ctx, p, "no_such", 1, nil)), proto.CodeUnknownMethod},
		"above max_message_size":     {second(pool.Call[[]byte, []byte](ctx, p, "echo", make([]byte, 70000))), proto.CodeMessageTooLarge},
	} {
		if code(c.err) != c.want || len(c.err.Error()) > 1000 {
			t.Errorf("%s: %.300v, want %d", name, c.err, c.want)
		}
	}
	far, cancel := context.WithTimeout(context.Background(), 25*24*time.Hour) // above max_timeout_ms (~24.8 days)
	defer cancel()
	if _, err := pool.Call[any, any](far, p, "echo", 1); code(err) != proto.CodeInvalidArgument {
		t.Errorf("a 25-day timeout: %v", err)
	}
	// Nothing was poisoned.
	if r, err := pool.Call[map[string]int, addResp](ctx, p, "add", map[string]int{"a": 1, "b": 2}); err != nil || r.Sum != 3 {
		t.Fatalf("after the refusals: %v %v", r, err)
	}
}

func second(_ any, err error) error { return err }

// A worker that dies between the pool's choice of it and the send is not sent to (the request
// would be in a dead worker's table, never ended): the call goes to its replacement.
func TestWorkerDyingAsItIsPickedIsNotSentTo(t *testing.T) {
	p := start(t, pool.Options{RestartBackoff: pool.Set(time.Millisecond)})
	ctx := bounded(t)
	if _, err := pool.Call[addReq, addResp](ctx, p, "add", addReq{1, 2}); err != nil {
		t.Fatalf("add: %v", err)
	}
	first := p.Stats().Workers[0].Pid
	restore := pool.KillRoutedOnce()
	defer restore()
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := pool.Call[addReq, addResp](wait, p, "add", addReq{A: 2, B: 3})
	if err != nil || r.Sum != 5 {
		t.Fatalf("add after its worker died as it was picked: %v %v (want 5 from the replacement)", r, err)
	}
	if st := p.Stats(); len(st.Workers) != 1 || st.Workers[0].Pid == first || st.Restarts != 1 {
		t.Fatalf("stats %+v: want one replacement worker, not pid %d", st, first)
	}
}
