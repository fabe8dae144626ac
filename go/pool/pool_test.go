package pool_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

func start(t *testing.T, o pool.Options) *pool.Pool {
	t.Helper()
	if o.Command == nil {
		o.Command = []string{workerBin}
	}
	if _, set := o.Workers.Get(); !set {
		o.Workers = pool.Set(1) // the tests count on one worker unless they say otherwise
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := pool.Start(ctx, o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
}

func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func code(err error) proto.ErrorCode {
	var e *pool.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

type addReq struct{ A, B int }
type addResp struct {
	Sum int `json:"sum" msgpack:"sum"`
}

func TestCallCodecs(t *testing.T) {
	p := start(t, pool.Options{Workers: pool.Set(2)})
	ctx := bounded(t)
	r, err := pool.Call[map[string]int, addResp](ctx, p, "add", map[string]int{"a": 2, "b": 3})
	if err != nil || r.Sum != 5 {
		t.Fatalf("add: %v %v", r, err)
	}
	b, err := pool.Call[[]byte, []byte](ctx, p, "echo", []byte("hi\x00there"))
	if err != nil || string(b) != "hi\x00there" {
		t.Fatalf("echo raw: %q %v", b, err)
	}
	m, err := pool.Call[pool.Bytes, pool.Bytes](ctx, p, "echo", pool.Bytes{0x93, 1, 2, 3}, pool.WithCodec(pool.Msgpack))
	if err != nil || len(m) != 4 {
		t.Fatalf("echo msgpack: %v %v", m, err)
	}
}

func TestManyInFlight(t *testing.T) {
	p := start(t, pool.Options{Workers: pool.Set(2), MaxInFlight: pool.Set(4)})
	ctx := bounded(t)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := pool.Call[map[string]int, addResp](ctx, p, "add", map[string]int{"a": i, "b": 1})
			if err == nil && r.Sum != i+1 {
				err = errors.New("wrong sum")
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestErrors(t *testing.T) {
	p := start(t, pool.Options{})
	ctx := bounded(t)
	_, err := pool.Call[any, any](ctx, p, "fail", nil)
	if code(err) != proto.CodeHandlerError || !errors.Is(err, &pool.Error{Code: proto.CodeHandlerError}) {
		t.Fatalf("fail: %v", err)
	}
	_, err = pool.Call[any, any](ctx, p, "no_such", nil)
	if code(err) != proto.CodeUnknownMethod {
		t.Fatalf("unknown: %v", err)
	}
	_, err = pool.Call[any, any](ctx, p, "crash", nil)
	if code(err) != proto.CodeWorkerExited {
		t.Fatalf("crash: %v", err)
	}
	// The worker is replaced.
	r, err := pool.Call[map[string]int, addResp](ctx, p, "add", map[string]int{"a": 1, "b": 1})
	if err != nil || r.Sum != 2 {
		t.Fatalf("after restart: %v %v", r, err)
	}
}

func TestDeadlineAndCancel(t *testing.T) {
	p := start(t, pool.Options{CancelGrace: pool.Set(200 * time.Millisecond)})
	dctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := pool.Call[int, int](dctx, p, "sleep", 5000)
	if code(err) != proto.CodeDeadlineExceeded {
		t.Fatalf("deadline: %v", err)
	}
	_, err = pool.Call[int, int](dctx, p, "sleep", 1) // expired: nothing sent
	if code(err) != proto.CodeDeadlineExceeded {
		t.Fatalf("expired: %v", err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := pool.Call[int, int](cctx, p, "hang", 5000)
		done <- err
	}()
	// A call that answers proves the hang is in flight (one worker, requests in order).
	_, _ = pool.Call[map[string]int, addResp](bounded(t), p, "add", map[string]int{"a": 1, "b": 1})
	ccancel()
	if err := <-done; code(err) != proto.CodeCancelled {
		t.Fatalf("cancel: %v", err)
	}
	// The hung worker is killed after the cancel grace and replaced.
	r, err := pool.Call[map[string]int, addResp](bounded(t), p, "add", map[string]int{"a": 2, "b": 2})
	if err != nil || r.Sum != 4 {
		t.Fatalf("after cancel: %v %v", r, err)
	}
}

func TestOptionsAndStartup(t *testing.T) {
	ctx := bounded(t)
	_, err := pool.Start(ctx, pool.Options{Command: []string{workerBin}, Workers: pool.Set(-1)})
	if code(err) != proto.CodeInvalidArgument {
		t.Fatalf("workers -1: %v", err)
	}
	_, err = pool.Start(ctx, pool.Options{})
	if code(err) != proto.CodeInvalidArgument {
		t.Fatalf("no command: %v", err)
	}
	_, err = pool.Start(ctx, pool.Options{Command: []string{"sh", "-c", "echo nope >&2; exit 3"}})
	if code(err) != proto.CodeWorkerExited {
		t.Fatalf("exit: %v", err)
	}
	if e := err.(*pool.Error); !strings.Contains(e.Message, "nope") {
		t.Fatalf("no stderr tail: %v", e)
	}
	_, err = pool.Start(ctx, pool.Options{Command: []string{"sleep", "5"}, StartupTimeout: pool.Set(100 * time.Millisecond)})
	if code(err) != proto.CodeStartupTimeout {
		t.Fatalf("timeout: %v", err)
	}
}

func TestClose(t *testing.T) {
	p := start(t, pool.Options{Workers: pool.Set(2)})
	if err := p.Close(bounded(t)); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Call[any, any](bounded(t), p, "add", nil)
	if code(err) != proto.CodePoolClosed {
		t.Fatalf("after close: %v", err)
	}
}
