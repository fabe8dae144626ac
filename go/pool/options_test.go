package pool_test

import (
	"testing"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

// An explicit 0 is a value, not "unset": MaxRestarts 0 allows no restart at all, where the
// field left out allows the default 10.
func TestExplicitZeroIsAValue(t *testing.T) {
	ctx := bounded(t)
	none := start(t, pool.Options{MaxRestarts: pool.Set(0)})
	if _, err := pool.Call[any, any](ctx, none, "crash", nil); code(err) != proto.CodeWorkerExited {
		t.Fatalf("crash: %v", err)
	}
	if _, err := pool.Call[any, any](ctx, none, "whoami", nil); code(err) != proto.CodePoolClosed {
		t.Fatalf("after one crash with MaxRestarts 0: %v, expected POOL_CLOSED", err)
	}

	dflt := start(t, pool.Options{})
	if _, err := pool.Call[any, any](ctx, dflt, "crash", nil); code(err) != proto.CodeWorkerExited {
		t.Fatalf("crash: %v", err)
	}
	if _, err := pool.Call[any, int](ctx, dflt, "whoami", nil); err != nil {
		t.Fatalf("after one crash with MaxRestarts unset (10): %v", err)
	}
	if v, set := (pool.Options{}).Workers.Get(); set || v != 0 {
		t.Fatalf("the zero Optional is set: %v %v", v, set)
	}
	if v, set := pool.Set(0).Get(); !set || v != 0 {
		t.Fatalf("Set(0) is %v %v", v, set)
	}
}
