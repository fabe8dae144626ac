// Command conformance_parent is the Go parent runner of the conformance matrix
// (conformance/README.md, "The runner contract"): it runs every scenario of a scenario file
// against a go/pool of any language's conformance worker and prints one JSON line per scenario,
// {"scenario", "ok", "detail", "elapsed"}, flushed as it goes:
//
//	conformance_parent --scenarios FILE [--only NAME ...] [--transport socketpair|tls|tcp] -- WORKER COMMAND...
//
// Each scenario gets a fresh pool and is bounded by its timeout_s. Besides its own expectation,
// every scenario that starts a pool checks that every request ended at the pool (nothing in
// flight within settle_s), whether the worker was replaced (restarted), the live worker count
// (live_workers) and that the pool still serves the suite's health-check call. The procedure
// of each kind is the one of python/conformance/parent.py and the Rust runner.
//
// --transport tls (conformance/test_remote.py) runs every pool's workers as children that join
// one listener of this runner over TCP + TLS 1.3 with a single-use ticket each (tcp: plain
// loopback); every WORKER_EXITED must then say "connection": "lost" in its details (21.6).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/wirepool/wirepool/go/pool"
)

// failed is a scenario whose expectation does not hold; its text says how.
type failed struct{ msg string }

func (f failed) Error() string { return f.msg }

func failf(format string, args ...any) error { return failed{fmt.Sprintf(format, args...)} }

type report struct {
	Scenario string  `json:"scenario"`
	OK       bool    `json:"ok"`
	Detail   string  `json:"detail"`
	Elapsed  float64 `json:"elapsed"`
}

// listener is the one every pool's workers join with --transport tls or tcp (nil: socketpair).
var listener *pool.Listener

func main() {
	var only multi
	scenarios := flag.String("scenarios", "", "the scenario file (conformance/scenarios.json)")
	transport := flag.String("transport", "socketpair", "socketpair, tls or tcp (remote workers joining a listener, PROTOCOL.md 21)")
	flag.Var(&only, "only", "run only this scenario (repeatable)")
	flag.Parse()
	worker := flag.Args()
	if *scenarios == "" || len(worker) == 0 {
		fmt.Fprintln(os.Stderr, "usage: conformance_parent --scenarios FILE [--only NAME ...] -- WORKER COMMAND...")
		os.Exit(2)
	}
	switch *transport {
	case "socketpair":
	case "tls", "tcp":
		// Refusals are logged to stderr (bounded per second by the listener): stdout is the report.
		l, err := pool.Listen(pool.ListenOptions{Plain: *transport == "tcp",
			Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
		if err != nil {
			fmt.Fprintf(os.Stderr, "conformance_parent: %v\n", err)
			os.Exit(2)
		}
		defer l.Close()
		listener = l
	default:
		fmt.Fprintf(os.Stderr, "conformance_parent: --transport must be socketpair, tls or tcp, not %q\n", *transport)
		os.Exit(2)
	}
	raw, err := os.ReadFile(*scenarios)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s, list, err := loadSuite(raw)
	if err != nil {
		fmt.Fprintf(os.Stderr, "conformance_parent: %s: %v\n", *scenarios, err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)
	for _, sc := range list {
		if len(only) > 0 && !only.has(str(sc, "name")) {
			continue
		}
		_ = out.Encode(s.runBounded(sc, worker))
	}
}

// runBounded runs one scenario within its timeout_s and turns its outcome into a report.
func (s *suite) runBounded(sc obj, worker []string) report {
	bound := dur(s.setting(sc, "timeout_s"))
	started := time.Now()
	runtime.GC()
	debug.FreeOSMemory()
	resetPeakRSS()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	done := make(chan error, 1)
	var detail string
	go func() {
		d, err := s.run(ctx, sc, worker)
		detail = d
		done <- err
	}()
	var err error
	select {
	case err = <-done:
		if err != nil && ctx.Err() != nil {
			err = failf("did not finish within its timeout_s of %vs (%v)", bound.Seconds(), err)
		}
	case <-time.After(bound + 30*time.Second):
		// The scenario's own waits all end with ctx: this is a runner bug, reported as one.
		err = failf("did not finish within its timeout_s of %vs (and not 30 s later)", bound.Seconds())
	}
	r := report{Scenario: str(sc, "name"), OK: err == nil, Detail: detail}
	if err != nil {
		var f failed
		if errors.As(err, &f) {
			r.Detail = f.msg
		} else {
			r.Detail = "unexpected error: " + err.Error()
		}
	}
	if limit, ok := s.setting(sc, "max_parent_rss_mb").(json.Number); ok {
		peak := peakRSSMB()
		r.Detail += fmt.Sprintf("; parent peak RSS %.0f MB", peak)
		if lim, _ := limit.Float64(); r.OK && peak > lim {
			r.OK = false
			r.Detail += fmt.Sprintf(", above the bound of %v MB", limit)
		}
	}
	r.Elapsed = time.Since(started).Seconds()
	return r
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }
func (m multi) has(v string) bool {
	for _, x := range m {
		if x == v {
			return true
		}
	}
	return false
}

// rss reads a "VmXXX:" line of /proc/self/status in MB.
func rss(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if bytes.HasPrefix(line, []byte(field+":")) {
			var kb float64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(string(line[len(field)+1:]), "kB")), &kb)
			return kb / 1024
		}
	}
	return 0
}

func peakRSSMB() float64 { return rss("VmHWM") }

// resetPeakRSS restarts VmHWM at the current RSS, so each scenario's peak is its own.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

func debugFree() { debug.FreeOSMemory() }
