package pool_test

import (
	"context"
	"fmt"
	"time"

	"github.com/wirepool/wirepool/go/pool"
)

// A pool whose workers join over TCP + TLS 1.3 (PROTOCOL.md 21) instead of a socketpair: each
// worker program is started as a child with a single-use ticket in WIREPOOL_TICKET, pins the
// listener's certificate and joins; from its HELLO on it is a worker like any other.
func ExampleListen() {
	l, err := pool.Listen(pool.ListenOptions{}) // 127.0.0.1, any free port, TLS 1.3
	if err != nil {
		panic(err)
	}
	defer l.Close() // after the pool

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := pool.Start(ctx, pool.Options{Command: []string{workerBin}, Workers: pool.Set(1), Remote: l})
	if err != nil {
		panic(err)
	}
	defer p.Close(ctx)

	sum, err := pool.Call[map[string]int, map[string]int](ctx, p, "add", map[string]int{"a": 1, "b": 2})
	fmt.Println(sum["sum"], err, l.Stats().Joined)
	// Output: 3 <nil> 1
}
