package pool_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
	"github.com/wirepool/wirepool/go/worker"
)

// testWorkerEnv makes the test binary a worker (TestMain): methods the conformance worker has
// no reason to offer, for the retry and recycling tests.
const testWorkerEnv = "WIREPOOL_POOL_TEST_WORKER"

// testWorker is the Options of a pool of this binary run as a worker.
func testWorker(t *testing.T) pool.Options {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return pool.Options{Command: []string{exe}, Env: []string{testWorkerEnv + "=1"}}
}

// firstTries is a request of the *_first methods: the first N requests of it (counted by
// marker files in Dir, across processes) kill their worker; the later ones succeed.
type firstTries struct {
	Dir  string `json:"dir"`
	N    int    `json:"n"`
	Rows int    `json:"rows"`
}

// dies is whether this request is one of the first N: it takes the next marker if one is left.
func (r firstTries) dies() bool {
	for i := range r.N {
		f, err := os.OpenFile(filepath.Join(r.Dir, strconv.Itoa(i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			f.Close()
			return true
		}
	}
	return false
}

var held [][]byte // hold's memory, kept for the life of the process

func runTestWorker() {
	w := worker.New()
	worker.Method(w, "whoami", func(context.Context, any) (int, error) { return os.Getpid(), nil })
	worker.Method(w, "crash_first", func(_ context.Context, r firstTries) (int, error) {
		if r.dies() {
			os.Exit(3)
		}
		return os.Getpid(), nil
	})
	worker.Stream(w, "crash_first_stream", func(_ context.Context, r firstTries, rows *worker.Rows[int]) (worker.NoSummary, error) {
		if r.dies() {
			os.Exit(3)
		}
		for i := range r.Rows {
			if err := rows.Send(i); err != nil {
				return worker.NoSummary{}, err
			}
		}
		return worker.NoSummary{}, nil
	})
	worker.Method(w, "sleep", func(ctx context.Context, ms int) (int, error) {
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			return os.Getpid(), nil
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	})
	// row_then_wait sends its pid as one row, then waits to be cancelled (or killed).
	worker.Stream(w, "row_then_wait", func(ctx context.Context, _ any, rows *worker.Rows[int]) (worker.NoSummary, error) {
		if err := rows.Send(os.Getpid()); err != nil {
			return worker.NoSummary{}, err
		}
		<-ctx.Done()
		return worker.NoSummary{}, context.Cause(ctx)
	})
	// says_exited answers an ERROR with WORKER_EXITED's code: the worker's word, not a death.
	worker.Method(w, "says_exited", func(context.Context, any) (any, error) {
		return nil, worker.Error{Code: uint32(proto.CodeWorkerExited), Message: "a worker saying WORKER_EXITED"}
	})
	worker.Method(w, "fail", func(context.Context, any) (any, error) {
		return nil, worker.Errorf(worker.CodeHandlerError, "failed on purpose")
	})
	// hold maps MiB of memory, faulted in by the kernel (MAP_POPULATE: no Go code touches it,
	// so the race detector's shadow does not double it), and keeps it.
	worker.Method(w, "hold", func(_ context.Context, mib int) (int, error) {
		b, err := unix.Mmap(-1, 0, mib<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_POPULATE)
		if err != nil {
			return 0, err
		}
		held = append(held, b)
		return mib, nil
	})
	w.Run()
}
