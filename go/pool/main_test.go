package pool_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// workerBin is the Go conformance worker, built once for the package's tests.
var workerBin string

func TestMain(m *testing.M) {
	if os.Getenv(testWorkerEnv) != "" {
		runTestWorker() // this binary, re-executed as a worker by a test: never returns
	}
	dir, err := os.MkdirTemp("", "wirepool-pool-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workerBin = filepath.Join(dir, "conformance_worker")
	out, err := exec.Command("go", "build", "-o", workerBin, "../cmd/conformance_worker").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build the conformance worker: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
