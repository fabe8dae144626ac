package pool_test

import (
	"context"
	"fmt"
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
