package pool_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/wirepool/wirepool/go/pool"
)

// Options left out take the spec's defaults; a number is given with pool.Set, so that an
// explicit zero is a value of its own (here: no restart at all, and no stderr kept).
func ExampleOptions() {
	ctx := context.Background()
	p, err := pool.Start(ctx, pool.Options{
		Command:         []string{workerBin},
		Workers:         pool.Set(2),
		CancelGrace:     pool.Set(500 * time.Millisecond),
		MaxRestarts:     pool.Set(0),
		StderrTailLines: pool.Set(0),
		MaxRSSBytes:     pool.Set[int64](1 << 30), // an int64 field wants a typed value
		MaxIdle:         pool.Set(time.Minute),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close(ctx)
	fmt.Println(len(p.Stats().Workers))

	_, err = pool.Start(ctx, pool.Options{Command: []string{workerBin}, Workers: pool.Set(0)})
	fmt.Println(err)
	// Output:
	// 2
	// wirepool: INVALID_ARGUMENT: workers 0 out of range 1-4096
}

// A pool that sends "add" again (up to 3 tries in all) when its worker dies while serving it;
// any other method only when a call says Idempotent(true).
func ExampleRetryPolicy() {
	ctx := context.Background()
	p, err := pool.Start(ctx, pool.Options{
		Command: []string{workerBin},
		Workers: pool.Set(2),
		Retry:   &pool.RetryPolicy{Methods: []string{"add"}, Attempts: pool.Set(3)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close(ctx)
	type addReq struct{ A, B int }
	sum, err := pool.Call[addReq, map[string]int](ctx, p, "add", addReq{A: 1, B: 2})
	fmt.Println(sum["sum"], err)
	_, err = pool.Call[any, any](ctx, p, "echo", "x", pool.Idempotent(true), pool.WithCodec(pool.Raw))
	fmt.Println(err)
	// Output:
	// 3 <nil>
	// <nil>
}

// The pool's metrics in the Prometheus text format, the series every wirepool parent exports
// (spec/metrics.json); PrometheusHandler serves the same at /metrics.
func ExampleWritePrometheus() {
	ctx := context.Background()
	p, err := pool.Start(ctx, pool.Options{Command: []string{workerBin}, Workers: pool.Set(1)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close(ctx)
	_, _ = pool.Call[any, any](ctx, p, "echo", "hi", pool.WithCodec(pool.Raw))
	var out strings.Builder
	_ = pool.WritePrometheus(&out, map[string]*pool.Pool{"default": p})
	for line := range strings.Lines(out.String()) {
		if strings.HasPrefix(line, "wirepool_calls_total") || strings.HasPrefix(line, "wirepool_workers{") {
			fmt.Print(line)
		}
	}
	// Output:
	// wirepool_workers{pool="default"} 1
	// wirepool_calls_total{pool="default"} 1
}
