package pool_test

import (
	"context"
	"errors"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/wirepool/wirepool/go/pool"
)

// recycles is a slog.Handler passing on the reason of each recycle the pool logs.
type recycles chan string

func (c recycles) Enabled(context.Context, slog.Level) bool { return true }
func (c recycles) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			select {
			case c <- a.Value.String():
			default:
			}
		}
		return true
	})
	return nil
}
func (c recycles) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c recycles) WithGroup(string) slog.Handler      { return c }

func whoami(t *testing.T, p *pool.Pool) int {
	t.Helper()
	pid, err := pool.Call[any, int](bounded(t), p, "whoami", nil)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// next is the next recycle's reason, failing the test when none comes in bounded time.
func (c recycles) next(t *testing.T) string {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-bounded(t).Done():
		t.Fatal("no recycle")
		return ""
	}
}

// reaped: pid has exited and been waited for (no process, no zombie, by that pid).
func reaped(t *testing.T, p *pool.Pool, pid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.Close(ctx)
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the recycled worker %d is still there after Close: %v", pid, err)
	}
}

// A worker whose resident set grows above MaxRSSBytes is replaced: the next call is served by
// a new process, the old one is drained and reaped.
func TestRecycleByRSS(t *testing.T) {
	rec := make(recycles, 16)
	o := testWorker(t)
	o.MaxRSSBytes = pool.Set[int64](256 << 20)
	o.Logger = slog.New(rec)
	p := start(t, o)
	before := whoami(t, p)
	if _, err := pool.Call[int, int](bounded(t), p, "hold", 320); err != nil {
		t.Fatal(err)
	}
	if r := rec.next(t); r != "rss" {
		t.Fatalf("recycled for %q, expected rss", r)
	}
	if after := whoami(t, p); after == before {
		t.Fatalf("the worker above max_rss_bytes (pid %d) still serves", before)
	}
	reaped(t, p, before)
}

// A worker without a request for MaxIdle is replaced; one with a request in flight for longer
// than that is not.
func TestRecycleWhenIdle(t *testing.T) {
	rec := make(recycles, 16)
	o := testWorker(t)
	o.MaxIdle = pool.Set(200 * time.Millisecond)
	o.Logger = slog.New(rec)
	p := start(t, o)
	// Busy for 3 x MaxIdle: no recycle until it ends (the check below runs well within
	// MaxIdle of the end).
	busy, err := pool.Call[int, int](bounded(t), p, "sleep", 600)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-rec:
		t.Fatalf("recycled (%s) with a request in flight", r)
	default:
	}
	if r := rec.next(t); r != "idle" {
		t.Fatalf("recycled for %q, expected idle", r)
	}
	if after := whoami(t, p); after == busy {
		t.Fatalf("the idle worker (pid %d) still serves", busy)
	}
	reaped(t, p, busy)
}
