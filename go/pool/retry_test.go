package pool_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

func attempts(t *testing.T, err error) int {
	t.Helper()
	var e *pool.Error
	if !errors.As(err, &e) {
		t.Fatalf("not a *pool.Error: %v", err)
	}
	var d struct {
		Attempts int `json:"attempts"`
	}
	if len(e.Details) > 0 {
		_ = json.Unmarshal(e.Details, &d)
	}
	return d.Attempts
}

func markers(t *testing.T, dir string) int {
	t.Helper()
	l, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(l)
}

func retryPool(t *testing.T, attempts int) *pool.Pool {
	o := testWorker(t)
	o.Workers = pool.Set(2)
	o.Retry = &pool.RetryPolicy{Methods: []string{"crash_first", "crash_first_stream", "row_then_wait", "fail"}, Attempts: pool.Set(attempts)}
	return start(t, o)
}

// A listed method whose worker dies is sent again, as a new request, until it succeeds or the
// tries run out; the caller sees one outcome, with the tries in its details.
func TestRetryIdempotentCall(t *testing.T) {
	p := retryPool(t, 3)
	ctx := bounded(t)
	dir := t.TempDir()
	pid, err := pool.Call[firstTries, int](ctx, p, "crash_first", firstTries{Dir: dir, N: 2})
	if err != nil || pid == 0 {
		t.Fatalf("two deaths then an answer: %v, %v", pid, err)
	}
	if got := p.Stats().Retries; got != 2 {
		t.Fatalf("Stats.Retries %d, expected 2", got)
	}

	dir = t.TempDir()
	_, err = pool.Call[firstTries, int](ctx, p, "crash_first", firstTries{Dir: dir, N: 10})
	if code(err) != proto.CodeWorkerExited || attempts(t, err) != 3 || markers(t, dir) != 3 {
		t.Fatalf("three deaths: %v (attempts %d, %d tries made), expected WORKER_EXITED after 3", err, attempts(t, err), markers(t, dir))
	}

	// Opted out per call: one try.
	dir = t.TempDir()
	_, err = pool.Call[firstTries, int](ctx, p, "crash_first", firstTries{Dir: dir, N: 10}, pool.Idempotent(false))
	if code(err) != proto.CodeWorkerExited || markers(t, dir) != 1 {
		t.Fatalf("Idempotent(false): %v after %d tries, expected WORKER_EXITED after 1", err, markers(t, dir))
	}

	// A handler's error is the answer, not a death: never sent again.
	before := p.Stats().Retries
	_, err = pool.Call[any, any](ctx, p, "fail", nil)
	if code(err) != proto.CodeHandlerError || attempts(t, err) != 1 || p.Stats().Retries != before {
		t.Fatalf("a handler error: %v (attempts %d), expected HANDLER_ERROR after 1 try", err, attempts(t, err))
	}

	// Through a lease: never sent again (its worker is the point).
	l, err := p.Lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	dir = t.TempDir()
	_, err = pool.Call[firstTries, int](ctx, l, "crash_first", firstTries{Dir: dir, N: 10})
	if code(err) != proto.CodeWorkerExited || markers(t, dir) != 1 {
		t.Fatalf("through a lease: %v after %d tries, expected WORKER_EXITED after 1", err, markers(t, dir))
	}
}

// A method not listed is never sent again; Idempotent(true) marks one call, and needs a policy.
func TestRetryOnlyWhenMarked(t *testing.T) {
	o := testWorker(t)
	o.Retry = &pool.RetryPolicy{} // no method listed, 3 tries for the calls marked
	p := start(t, o)
	ctx := bounded(t)
	dir := t.TempDir()
	_, err := pool.Call[firstTries, int](ctx, p, "crash_first", firstTries{Dir: dir, N: 1})
	if code(err) != proto.CodeWorkerExited || markers(t, dir) != 1 || p.Stats().Retries != 0 {
		t.Fatalf("an unlisted method: %v after %d tries, expected WORKER_EXITED after 1", err, markers(t, dir))
	}
	dir = t.TempDir()
	if _, err := pool.Call[firstTries, int](ctx, p, "crash_first", firstTries{Dir: dir, N: 1}, pool.Idempotent(true)); err != nil {
		t.Fatalf("Idempotent(true): %v", err)
	}

	plain := start(t, testWorker(t))
	_, err = pool.Call[any, int](ctx, plain, "whoami", nil, pool.Idempotent(true))
	if code(err) != proto.CodeInvalidArgument {
		t.Fatalf("Idempotent(true) without Options.Retry: %v, expected INVALID_ARGUMENT", err)
	}
}

// A stream is sent again only while none of its rows reached the caller.
func TestRetryStream(t *testing.T) {
	p := retryPool(t, 3)
	ctx := bounded(t)
	dir := t.TempDir()
	s, err := pool.Stream[firstTries, int, any](ctx, p, "crash_first_stream", firstTries{Dir: dir, N: 1, Rows: 3})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for s.Next() {
		if s.Row() != n {
			t.Fatalf("row %d is %d", n, s.Row())
		}
		n++
	}
	if s.Err() != nil || n != 3 || p.Stats().Retries != 1 {
		t.Fatalf("a death before the rows: %d rows, %v, %d retries; expected 3 rows after one retry", n, s.Err(), p.Stats().Retries)
	}

	rows, err := pool.Stream[any, int, any](ctx, p, "row_then_wait", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatalf("no row: %v", rows.Err())
	}
	if err := syscall.Kill(rows.Row(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if rows.Next() {
		t.Fatal("a second row")
	}
	if code(rows.Err()) != proto.CodeWorkerExited || attempts(t, rows.Err()) != 1 || p.Stats().Retries != 1 {
		t.Fatalf("a death after a row: %v (attempts %d), expected WORKER_EXITED, not sent again", rows.Err(), attempts(t, rows.Err()))
	}
}

// Only a death the parent saw is retried: an ERROR a worker sends with WORKER_EXITED's code
// is its answer.
func TestRetryNotForAWorkersError(t *testing.T) {
	p := retryPool(t, 3)
	_, err := pool.Call[any, any](bounded(t), p, "says_exited", nil, pool.Idempotent(true))
	if code(err) != proto.CodeWorkerExited || attempts(t, err) != 1 || p.Stats().Retries != 0 {
		t.Fatalf("an ERROR with code 300: %v (attempts %d, %d retries), expected it as the outcome of 1 try",
			err, attempts(t, err), p.Stats().Retries)
	}
}

// A retry waits for a worker only within the call's deadline; past it the caller gets the
// last try's death, not DEADLINE_EXCEEDED.
func TestRetryWithinTheDeadline(t *testing.T) {
	o := testWorker(t)
	o.RestartBackoff = pool.Set(time.Minute) // no replacement within the call's deadline
	o.RestartBackoffMax = pool.Set(time.Minute)
	o.Retry = &pool.RetryPolicy{Methods: []string{"crash_first"}, Attempts: pool.Set(100)}
	p := start(t, o)
	dir := t.TempDir()
	started := time.Now()
	_, err := pool.Call[firstTries, int](bounded(t), p, "crash_first", firstTries{Dir: dir, N: 10}, pool.WithTimeout(300*time.Millisecond))
	if code(err) != proto.CodeWorkerExited || attempts(t, err) != 1 || markers(t, dir) != 1 {
		t.Fatalf("no worker for the retry within the deadline: %v (attempts %d, %d tries), expected the death after 1",
			err, attempts(t, err), markers(t, dir))
	}
	if el := time.Since(started); el > 10*time.Second {
		t.Fatalf("the call ended after %v, its deadline was 300 ms", el)
	}
}

// A caller that cancels while a retry waits for a worker gets CANCELLED, as any cancelled call
// or stream does, not the death before it.
func TestRetryCancelledWhileWaiting(t *testing.T) {
	o := testWorker(t)
	o.RestartBackoff = pool.Set(time.Minute) // no replacement: the retry waits
	o.RestartBackoffMax = pool.Set(time.Minute)
	o.Retry = &pool.RetryPolicy{Methods: []string{"crash_first", "crash_first_stream"}}
	p := start(t, o)
	ctx, cancel := context.WithCancel(bounded(t))
	defer pool.OnRetrying(cancel)()
	_, err := pool.Call[firstTries, int](ctx, p, "crash_first", firstTries{Dir: t.TempDir(), N: 10})
	if code(err) != proto.CodeCancelled {
		t.Fatalf("cancelled while the retry waited: %v, expected CANCELLED", err)
	}

	p = start(t, o) // the first one's only worker is gone for a minute
	sctx, scancel := context.WithCancel(bounded(t))
	defer pool.OnRetrying(scancel)()
	s, err := pool.Stream[firstTries, int, any](sctx, p, "crash_first_stream", firstTries{Dir: t.TempDir(), N: 10, Rows: 1})
	if err != nil {
		t.Fatal(err)
	}
	if s.Next() || code(s.Err()) != proto.CodeCancelled {
		t.Fatalf("a stream cancelled while its retry waited: %v, expected CANCELLED", s.Err())
	}
}
