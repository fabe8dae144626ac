// Command soak_parent is the Go parent's soak driver (go/pool): mixed load on a pool of
// conformance workers while their processes are killed and stopped at random, then a pool whose
// replacements keep failing. It measures and prints one JSON line (the summary);
// conformance/test_soak.py holds the invariants and asserts them on the summary. It does what
// the Python parent's driver (python/conformance/soak.py, whose docstring describes the
// procedure) and the Rust one (rust/wirepool-conformance/src/bin/soak_parent.rs) do, step for
// step, so the summaries have the same fields, through go/pool's public API only.
//
//	soak_parent --seed N [--seconds S] [--workers W] [--max-restarts R] [--fail-fast-seconds F]
//	            --python PY --fail-after conformance/soak/fail_after.py -- WORKER COMMAND...
//
// go/pool has no map: a map run is MAP_ITEMS calls at once whose results are taken in order
// (one operation: every result, or the first error), as the Rust driver does. Beside the other
// drivers' operations the load takes leases: a lease within 2 s (else DEADLINE_EXCEEDED: no
// worker was idle), whoami through it must answer the lease's pid, then calls through it
// (LEASE_LOST once its worker is gone).
//
// Where Go differs in how it measures (the figures are the same ones): RSS is read after
// debug.FreeOSMemory (a collection that returns the freed pages: garbage is not a leak, as the
// Python driver reads it after gc.collect()); one child process is started and reaped before
// the descriptor count (firstSpawn), since the Go runtime opens its poller's descriptors
// (epoll, eventfd) once, at the first pipe or socket, and keeps them.
//
// The seed fixes every random choice (the schedule still depends on timing); it is in the
// summary.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/wirepool/wirepool/go/pool"
)

const (
	loadTasks = 6
	burst     = 48 // calls at once in a burst (the pool's max_in_flight is 32 per worker)
	mapItems  = 64
	opBound   = 30 * time.Second // an operation without an outcome by then is a hang
	settle    = 15 * time.Second // after the chaos: the pool back to `workers` live workers
	liveHold  = 500 * time.Millisecond
	heartbeat = 250 * time.Millisecond
	// A worker stopped before its HELLO is found by the start-up timeout, not the heartbeat:
	// short enough to settle soon after the chaos, long enough for a Python worker on a busy
	// machine.
	startupTimeout = 4 * time.Second
	tripBound      = 20 * time.Second // from the kill to the pool giving up
	leaseWait      = 2 * time.Second  // a load lease: an idle worker within this
	gaveUp         = "restart intensity exceeded"
	samples        = 8 // unexpected outcomes kept verbatim in the summary
)

// chaosCodes are what a killed or stopped worker's requests get.
var chaosCodes = []string{"WORKER_EXITED", "WORKER_HUNG"}

type obj = map[string]any

type args struct {
	seed            uint64
	seconds         float64
	workers         int
	maxRestarts     int
	failFastSeconds float64
	python          string
	failAfter       string
	worker          []string
}

func usage(problem string) {
	fmt.Fprintf(os.Stderr, "soak_parent: %s\n", problem)
	fmt.Fprintln(os.Stderr, "usage: soak_parent --seed N [--seconds S] [--workers W] [--max-restarts R] "+
		"[--fail-fast-seconds F] --python PY --fail-after SCRIPT -- WORKER COMMAND...")
	os.Exit(2)
}

func parseArgs(argv []string) args {
	a := args{seconds: 20, workers: 3, maxRestarts: 5, failFastSeconds: 2, python: "python3"}
	seen := false
	for i := 0; i < len(argv); i++ {
		arg := argv[i]
		if arg == "--" {
			a.worker = append(a.worker, argv[i+1:]...)
			break
		}
		if i+1 >= len(argv) {
			usage(arg + " needs a value")
		}
		i++
		v := argv[i]
		var err error
		switch arg {
		case "--seed":
			a.seed, err = strconv.ParseUint(v, 10, 64)
			seen = err == nil
		case "--seconds":
			a.seconds, err = strconv.ParseFloat(v, 64)
		case "--workers":
			a.workers, err = strconv.Atoi(v)
		case "--max-restarts":
			a.maxRestarts, err = strconv.Atoi(v)
		case "--fail-fast-seconds":
			a.failFastSeconds, err = strconv.ParseFloat(v, 64)
		case "--python":
			a.python = v
		case "--fail-after":
			a.failAfter = v
		default:
			usage(fmt.Sprintf("unknown argument %q", arg))
		}
		if err != nil {
			usage("bad " + arg)
		}
	}
	switch {
	case !seen:
		usage("--seed N is required")
	case len(a.worker) == 0:
		usage("the worker command follows --")
	case a.failAfter == "":
		usage("--fail-after SCRIPT is required")
	case a.workers < 1 || a.maxRestarts < 1 || a.seconds < 0 || a.failFastSeconds < 0:
		usage("--workers and --max-restarts must be positive, the seconds not negative")
	}
	return a
}

func logf(format string, v ...any) {
	fmt.Fprintf(os.Stderr, "soak_parent: "+format+"\n", v...)
}

// rng is SplitMix64 (seeded, as the Rust driver's), safe for concurrent use.
type rng struct {
	mu    sync.Mutex
	state uint64
}

func (r *rng) next() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state += 0x9E3779B97F4A7C15
	z := r.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func (r *rng) unit() float64                  { return float64(r.next()>>11) / float64(uint64(1)<<53) }
func (r *rng) uniform(lo, hi float64) float64 { return lo + (hi-lo)*r.unit() }
func (r *rng) int(lo, hi int64) int64         { return lo + int64(r.next()%uint64(hi-lo+1)) }

// ---------------------------------------------------------------------------------------------
// The process: memory, descriptors, children
// ---------------------------------------------------------------------------------------------

func statusMB(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// settledRSS is VmRSS after a collection that returns the freed pages to the system.
func settledRSS() float64 {
	debug.FreeOSMemory()
	return statusMB("VmRSS")
}

func round(x float64, digits int) float64 {
	m := math.Pow(10, float64(digits))
	return math.Round(x*m) / m
}

func openFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

// children are our child processes that have not exited (zombies excluded), with their state
// letter (T for a stopped one).
func children() map[int]string {
	me := os.Getpid()
	found := map[int]string{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return found
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		at := strings.LastIndexByte(s, ')')
		if at < 0 {
			continue
		}
		f := strings.Fields(s[at+1:]) // after the command name
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == me && f[0] != "Z" {
			found[pid] = f[0]
		}
	}
	return found
}

// selfCmdline is this process's argv as /proc shows it.
var selfCmdline, _ = os.ReadFile("/proc/self/cmdline")

// execd: the child has run exec (its argv is no longer ours). Between fork and exec a child is
// this process's own copy (with vfork, sharing its memory while the forking thread waits):
// stopping it there stops the parent's spawn, not a worker, so the chaos leaves it alone.
func execd(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return err == nil && !bytes.Equal(b, selfCmdline)
}

func sortedKeys(m map[int]string) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sameChildren(a, b map[int]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// outcomeOf is an error's outcome name: its code's name if typed, else untyped:<type>.
func outcomeOf(err error) string {
	var e *pool.Error
	if errors.As(err, &e) {
		return e.Code.String()
	}
	return fmt.Sprintf("untyped:%T", err)
}

// ---------------------------------------------------------------------------------------------
// The soak
// ---------------------------------------------------------------------------------------------

type addReq struct {
	A int64 `json:"a"`
	B int64 `json:"b"`
}

type sum struct {
	Sum int64 `json:"sum"`
}

type decl struct {
	I    int64  `json:"i"`
	Name string `json:"name"`
	Kind string `json:"kind"`
}

type declsSummary struct {
	Rows int64 `json:"rows"`
}

type soak struct {
	pool    *pool.Pool
	rng     *rng
	running atomic.Bool

	mu         sync.Mutex
	outcomes   map[string]int64
	started    map[string]int64 // requests started, by operation
	byOp       map[string]map[string]int64
	unexpected []string
	rows       map[string]int64
	actions    map[string]int64
}

// op is one bounded operation's recorder: once the bound passed (no_outcome recorded), what
// the operation would still record is dropped, so each request has one outcome.
type op struct {
	s    *soak
	over bool // guarded by s.mu
}

// record is one request's single outcome; one outside allowed (besides the chaos codes) is
// unexpected.
func (o *op) record(name, outcome string, allowed []string, detail string) {
	o.s.mu.Lock()
	defer o.s.mu.Unlock()
	if !o.over {
		o.recordLocked(name, outcome, allowed, detail)
	}
}

// recordLocked records an outcome; s.mu is held.
func (o *op) recordLocked(name, outcome string, allowed []string, detail string) {
	s := o.s
	s.outcomes[outcome]++
	if s.byOp[name] == nil {
		s.byOp[name] = map[string]int64{}
	}
	s.byOp[name][outcome]++
	if !slices.Contains(allowed, outcome) && !slices.Contains(chaosCodes, outcome) {
		s.outcomes["unexpected"]++
		if len(s.unexpected) < samples {
			text := fmt.Sprintf("%s: %s: %s", name, outcome, detail)
			if len(text) > 400 {
				text = text[:400]
			}
			s.unexpected = append(s.unexpected, text)
		}
	}
}

func (o *op) countRows(what string, n int64) {
	o.s.mu.Lock()
	defer o.s.mu.Unlock()
	if !o.over {
		o.s.rows[what] += n
	}
}

// bounded runs one operation, which records its own outcomes, within opBound. A burst's calls
// are counted as requests each (burst_call), the burst itself not. Past the bound the
// operation is cancelled and counted no_outcome.
func (s *soak) bounded(name string, allowed []string, run func(ctx context.Context, o *op)) {
	s.mu.Lock()
	if name == "burst" {
		s.started["burst_call"] += burst
	} else {
		s.started[name]++
	}
	s.mu.Unlock()
	o := &op{s: s}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, o)
	}()
	t := time.NewTimer(opBound)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.mu.Lock()
		o.recordLocked(name, "no_outcome", allowed, fmt.Sprintf("no outcome within %v", opBound))
		o.over = true
		s.mu.Unlock()
	}
}

var okOnly = []string{"ok"}

func (s *soak) add(ctx context.Context, o *op, i int64, name string) {
	got, err := pool.Call[addReq, sum](ctx, s.pool, "add", addReq{i, 2 * i})
	switch {
	case err != nil:
		o.record(name, outcomeOf(err), okOnly, err.Error())
	case got.Sum != 3*i:
		o.record(name, "wrong_result", okOnly, fmt.Sprintf("add %d answered %d", i, got.Sum))
	default:
		o.record(name, "ok", okOnly, "")
	}
}

func (s *soak) burst(ctx context.Context, o *op) {
	base := s.rng.int(0, 1<<20)
	var wg sync.WaitGroup
	for k := range int64(burst) {
		wg.Go(func() { s.add(ctx, o, base+k, "burst_call") })
	}
	wg.Wait()
}

// mapRun counts as one operation: every result in order, or the first error.
func (s *soak) mapRun(ctx context.Context, o *op) {
	base := s.rng.int(0, 1<<20)
	type res struct {
		got sum
		err error
	}
	results := make([]chan res, mapItems)
	for k := range results {
		results[k] = make(chan res, 1)
		i := base + int64(k)
		go func() {
			got, err := pool.Call[addReq, sum](ctx, s.pool, "add", addReq{i, 2 * i})
			results[k] <- res{got, err}
		}()
	}
	outcome, detail := "ok", ""
	for k, ch := range results {
		r := <-ch
		if outcome != "ok" {
			continue // the map has failed: the rest still end, unread
		}
		switch {
		case r.err != nil:
			outcome, detail = outcomeOf(r.err), r.err.Error()
		case r.got.Sum != 3*(base+int64(k)):
			outcome, detail = "wrong_result", fmt.Sprintf("item %d answered %d", k, r.got.Sum)
		}
	}
	o.record("map", outcome, okOnly, detail)
}

// stream reads decls: row k must be row number k (nothing lost or repeated), then the
// summary; with closeAfter > 0, the stream is closed (cancelled) after that many rows.
func (s *soak) stream(ctx context.Context, o *op, closeAfter int64) {
	name := "stream"
	if closeAfter > 0 {
		name = "stream_closed_early"
	}
	n := s.rng.int(1, 3000)
	o.countRows("streams", 1)
	rows, err := pool.Stream[obj, decl, declsSummary](ctx, s.pool, "decls", obj{"n": n})
	if err != nil {
		o.countRows("broken", 1)
		o.record(name, outcomeOf(err), okOnly, "at the start: "+err.Error())
		return
	}
	defer rows.Close()
	k := int64(0)
	for rows.Next() {
		row := rows.Row()
		if want := (decl{I: k, Name: fmt.Sprintf("decl_%d", k), Kind: "theorem"}); row != want {
			o.countRows("seq_errors", 1)
			o.record(name, "wrong_row", okOnly, fmt.Sprintf("row %d of %d was %+v", k, n, row))
			return
		}
		k++
		o.countRows("total", 1)
		if closeAfter > 0 && k >= closeAfter {
			rows.Close()
			o.countRows("closed_early", 1)
			o.record(name, "ok", okOnly, "")
			return
		}
	}
	if err := rows.Err(); err != nil {
		o.countRows("broken", 1)
		o.record(name, outcomeOf(err), okOnly, fmt.Sprintf("after %d of %d rows: %v", k, n, err))
		return
	}
	if rows.Next() { // a second read of an ended stream yields nothing new
		o.record(name, "read_after_end", okOnly, fmt.Sprintf("got %+v", rows.Row()))
		return
	}
	if k != n || !rows.HasSummary() || rows.Summary().Rows != n {
		o.countRows("seq_errors", 1)
		o.record(name, "wrong_rows", okOnly, fmt.Sprintf("%d of %d rows, summary %+v (sent: %v)", k, n,
			rows.Summary(), rows.HasSummary()))
		return
	}
	o.countRows("complete", 1)
	o.record(name, "ok", okOnly, "")
}

var deadlineOnly = []string{"DEADLINE_EXCEEDED"}

func (s *soak) deadline(ctx context.Context, o *op) {
	ms := s.rng.int(300, 600)
	got, err := pool.Call[int64, any](ctx, s.pool, "sleep", ms, pool.WithTimeout(100*time.Millisecond))
	if err != nil {
		o.record("deadline", outcomeOf(err), deadlineOnly, err.Error())
		return
	}
	o.record("deadline", "ok", deadlineOnly, fmt.Sprintf("sleep %d with a 100 ms deadline gave %v", ms, got))
}

var failedOnly = []string{"HANDLER_ERROR"}

func (s *soak) fail(ctx context.Context, o *op) {
	got, err := pool.Call[any, any](ctx, s.pool, "fail", nil)
	if err != nil {
		o.record("fail", outcomeOf(err), failedOnly, err.Error())
		return
	}
	o.record("fail", "ok", failedOnly, fmt.Sprintf("fail answered %v", got))
}

// leaseAllowed: a lease and its calls, LEASE_LOST once its worker is gone, DEADLINE_EXCEEDED
// when no worker was idle within leaseWait.
var leaseAllowed = []string{"ok", "LEASE_LOST", "DEADLINE_EXCEEDED"}

// lease holds a worker: whoami through it must be its pid, then calls through it.
func (s *soak) lease(ctx context.Context, o *op) {
	lctx, cancel := context.WithTimeout(ctx, leaseWait)
	l, err := s.pool.Lease(lctx)
	cancel()
	if err != nil {
		o.record("lease", outcomeOf(err), leaseAllowed, "at the lease: "+err.Error())
		return
	}
	defer l.Release()
	calls := s.rng.int(1, 20)
	pid, err := pool.Call[any, int](ctx, l, "whoami", nil)
	if err != nil {
		o.record("lease", outcomeOf(err), leaseAllowed, "whoami: "+err.Error())
		return
	}
	if pid != l.Pid() {
		o.record("lease", "wrong_worker", leaseAllowed, fmt.Sprintf("whoami through the lease of %d answered %d", l.Pid(), pid))
		return
	}
	for j := range calls {
		got, err := pool.Call[addReq, sum](ctx, l, "add", addReq{j, 2 * j})
		if err != nil {
			o.record("lease", outcomeOf(err), leaseAllowed, fmt.Sprintf("call %d through the lease: %v", j, err))
			return
		}
		if got.Sum != 3*j {
			o.record("lease", "wrong_result", leaseAllowed, fmt.Sprintf("add %d through the lease answered %d", j, got.Sum))
			return
		}
	}
	o.record("lease", "ok", leaseAllowed, "")
}

func (s *soak) load() {
	for s.running.Load() {
		r := s.rng.unit()
		switch {
		case r < 0.27:
			i := s.rng.int(0, 1<<30)
			s.bounded("add", okOnly, func(ctx context.Context, o *op) { s.add(ctx, o, i, "add") })
		case r < 0.51:
			s.bounded("stream", okOnly, func(ctx context.Context, o *op) { s.stream(ctx, o, 0) })
		case r < 0.58:
			c := s.rng.int(1, 200)
			s.bounded("stream_closed_early", okOnly, func(ctx context.Context, o *op) { s.stream(ctx, o, c) })
		case r < 0.70:
			s.bounded("burst", okOnly, s.burst)
		case r < 0.80:
			s.bounded("map", okOnly, s.mapRun)
		case r < 0.90:
			s.bounded("deadline", deadlineOnly, s.deadline)
		case r < 0.95:
			s.bounded("fail", failedOnly, s.fail)
		default:
			s.bounded("lease", leaseAllowed, s.lease)
		}
	}
}

func (s *soak) act(what string) {
	s.mu.Lock()
	s.actions[what]++
	s.mu.Unlock()
}

func (s *soak) chaos(conts *sync.WaitGroup) {
	for s.running.Load() {
		time.Sleep(time.Duration(s.rng.uniform(0.05, 0.4) * float64(time.Second))) // the chaos's pace
		kids := slices.DeleteFunc(sortedKeys(children()), func(pid int) bool { return !execd(pid) })
		if len(kids) == 0 || !s.running.Load() {
			continue
		}
		pid := kids[s.rng.int(0, int64(len(kids)-1))]
		r := s.rng.unit()
		switch {
		case r < 0.5:
			_ = syscall.Kill(pid, syscall.SIGKILL)
			s.act("kill")
		case r < 0.8:
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			after := time.Duration(s.rng.uniform(0.05, 0.6) * float64(time.Second))
			conts.Add(1)
			time.AfterFunc(after, func() {
				defer conts.Done()
				if _, ok := children()[pid]; ok {
					_ = syscall.Kill(pid, syscall.SIGCONT) // still ours (not reaped and reused)
				}
			})
			s.act("stop_cont")
		default:
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			s.act("stop_left")
		}
	}
}

func poolPids(p *pool.Pool) []int {
	out := []int{}
	for _, w := range p.Stats().Workers {
		out = append(out, w.Pid)
	}
	slices.Sort(out)
	return out
}

// settleLive waits (bounded) for exactly want live, running children held for liveHold, which
// must be the pool's own pids; it returns what it saw.
func settleLive(p *pool.Pool, want int) obj {
	started := time.Now()
	for {
		seen := children()
		running := []int{}
		for pid, st := range seen {
			if st != "T" {
				running = append(running, pid)
			}
		}
		slices.Sort(running)
		if len(seen) == want && len(running) == want && slices.Equal(poolPids(p), running) {
			held := time.Now().Add(liveHold)
			for time.Now().Before(held) && sameChildren(children(), seen) {
				time.Sleep(50 * time.Millisecond) // polling /proc: nothing to wait on
			}
			if sameChildren(children(), seen) {
				return obj{"settled": true, "after_s": round(time.Since(started).Seconds(), 3),
					"live_pids": sortedKeys(seen), "pool_pids": poolPids(p)}
			}
		}
		if time.Since(started) >= settle {
			stopped := []int{}
			for pid, st := range seen {
				if st == "T" {
					stopped = append(stopped, pid)
				}
			}
			slices.Sort(stopped)
			return obj{"settled": false, "after_s": round(time.Since(started).Seconds(), 3),
				"live_pids": sortedKeys(seen), "stopped_pids": stopped, "pool_pids": poolPids(p)}
		}
		time.Sleep(50 * time.Millisecond) // polling /proc, bounded by settle
	}
}

// leasePids holds n leases at once, each answering whoami: the pids of n serving workers.
func leasePids(p *pool.Pool, n int) ([]int, error) {
	var leases []*pool.Lease
	defer func() {
		for _, l := range leases {
			l.Release()
		}
	}()
	pids := []int{}
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := p.Lease(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("lease with %d held: %w", len(leases), err)
		}
		leases = append(leases, l)
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		pid, err := pool.Call[any, int](ctx, l, "whoami", nil)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("whoami through a lease: %w", err)
		}
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids, nil
}

// noChildren is our children left after a pool closed (bounded wait for them to be reaped).
func noChildren() []int {
	deadline := time.Now().Add(5 * time.Second)
	for len(children()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // polling /proc, bounded
	}
	return sortedKeys(children())
}

// firstSpawn starts and reaps one child with a pipe before the descriptor count: the Go
// runtime opens its poller's descriptors at the first pipe or socket and keeps them.
func firstSpawn(python string) {
	cmd := exec.Command(python, "-c", "")
	cmd.Stderr = &strings.Builder{}
	if err := cmd.Run(); err != nil {
		logf("a first child process (%s -c ''): %v", python, err)
	}
}

// phases is how long each phase took (seconds), for the summary: where a run's time goes.
type phases struct {
	times obj
	last  time.Time
}

func (p *phases) mark(name string) {
	now := time.Now()
	p.times[name] = round(now.Sub(p.last).Seconds(), 2)
	p.last = now
}

func closePool(p *pool.Pool, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t := time.Now()
	_ = p.Close(ctx)
	if time.Since(t) > 30*time.Second {
		logf("the %s pool's close took more than 30s", what)
	}
}

func runSoak(a args, r *rng, ph *phases) obj {
	firstSpawn(a.python)
	fdsBefore := openFDs()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	p, err := pool.Start(ctx, pool.Options{Command: a.worker, Workers: pool.Set(a.workers), MaxInFlight: pool.Set(32),
		Heartbeat: heartbeat, StartupTimeout: pool.Set(startupTimeout), RestartBackoff: pool.Set(10 * time.Millisecond),
		RestartBackoffMax: pool.Set(200 * time.Millisecond), MaxRestarts: pool.Set(100_000), RestartWindow: pool.Set(60 * time.Second),
		DrainGrace: pool.Set(2 * time.Second)})
	cancel()
	if err != nil {
		logf("the soak pool did not start: %v", err)
		os.Exit(1)
	}
	for i := range int64(200) { // warm up before the memory baseline
		_, _ = pool.Call[addReq, sum](context.Background(), p, "add", addReq{i, 2 * i})
	}
	rssBefore := settledRSS()
	ph.mark("start")
	s := &soak{pool: p, rng: r, outcomes: map[string]int64{}, started: map[string]int64{},
		byOp: map[string]map[string]int64{}, rows: map[string]int64{}, actions: map[string]int64{}}
	s.running.Store(true)
	started := time.Now()
	var conts, tasks sync.WaitGroup
	tasks.Go(func() { s.chaos(&conts) })
	for range loadTasks {
		tasks.Go(s.load)
	}
	time.Sleep(time.Duration(a.seconds * float64(time.Second))) // the load and the chaos run meanwhile
	ph.mark("chaos")
	s.running.Store(false)
	tasks.Wait()
	conts.Wait()
	loadS := time.Since(started).Seconds()
	ph.mark("load_ends")
	s.mu.Lock()
	logf("load done after %.1fs: %v; chaos %v", loadS, s.outcomes, s.actions)
	s.mu.Unlock()
	live := settleLive(p, a.workers)
	ph.mark("settle")
	if pids, err := leasePids(p, a.workers); err != nil {
		live["answer_error"] = err.Error()
	} else {
		live["lease_pids"] = pids
	}
	health := map[string]int64{}
	for i := range int64(50) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := pool.Call[addReq, sum](ctx, p, "add", addReq{i, 2 * i})
		cancel()
		switch {
		case err != nil:
			health[outcomeOf(err)]++
		case got.Sum != 3*i:
			health["wrong_result"]++
		default:
			health["ok"]++
		}
	}
	live["health"] = health
	live["in_flight"] = p.InFlight()
	rssAfter := settledRSS()
	ph.mark("final_checks")
	closePool(p, "soak")
	s.mu.Lock()
	total := int64(0)
	for k, v := range s.outcomes {
		if k != "unexpected" {
			total += v
		}
	}
	rows := obj{}
	for _, k := range []string{"total", "streams", "complete", "closed_early", "broken", "seq_errors"} {
		rows[k] = s.rows[k]
	}
	actions := obj{}
	for _, k := range []string{"kill", "stop_cont", "stop_left"} {
		actions[k] = s.actions[k]
	}
	requests := obj{"total": total, "by_outcome": s.outcomes, "by_op": s.byOp,
		"started_by_op": s.started, "unexpected_samples": append([]string{}, s.unexpected...)}
	s.mu.Unlock()
	childrenAfter := noChildren()
	ph.mark("close")
	return obj{"load_s": round(loadS, 2), "requests": requests, "rows": rows, "chaos": actions,
		"final": live, "memory_mb": obj{"before": round(rssBefore, 1), "after": round(rssAfter, 1)},
		"children_after_close": childrenAfter, "fds": obj{"before": fdsBefore, "after": openFDs()}}
}

// ---------------------------------------------------------------------------------------------
// The restart limit
// ---------------------------------------------------------------------------------------------

func spawns(dir string) int {
	e, _ := os.ReadDir(dir)
	return len(e)
}

func restartLimit(a args) obj {
	r := a.maxRestarts
	state, err := os.MkdirTemp("", "wirepool-soak-")
	if err != nil {
		logf("a state directory: %v", err)
		os.Exit(1)
	}
	defer os.RemoveAll(state)
	argv := append([]string{a.python, a.failAfter, state, "1", "--"}, a.worker...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	p, err := pool.Start(ctx, pool.Options{Command: argv, Workers: pool.Set(1), Heartbeat: heartbeat,
		MaxRestarts: pool.Set(r), RestartWindow: pool.Set(60 * time.Second), RestartBackoff: pool.Set(10 * time.Millisecond),
		RestartBackoffMax: pool.Set(100 * time.Millisecond), DrainGrace: pool.Set(time.Second)})
	cancel()
	if err != nil {
		logf("the restart-limit pool did not start: %v", err)
		os.Exit(1)
	}
	out := obj{"max_restarts": r}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	first, err := pool.Call[any, int](ctx, p, "whoami", nil)
	cancel()
	if err != nil {
		logf("whoami on the first worker: %v", err)
		os.Exit(1)
	}
	killedAt := time.Now()
	_ = syscall.Kill(first, syscall.SIGKILL)
	// Calls wait while the slot is being refilled (one sent before the pool saw the kill fails
	// with it); once the pool gives up, they fail saying so.
	var trip error
	before := map[string]int64{}
	for time.Since(killedAt) < tripBound {
		ctx, cancel := context.WithTimeout(context.Background(), tripBound)
		_, err := pool.Call[addReq, sum](ctx, p, "add", addReq{1, 2})
		cancel()
		if err == nil {
			before["ok"]++
		} else if strings.Contains(err.Error(), gaveUp) {
			trip = err
			break
		} else {
			before[outcomeOf(err)]++
		}
	}
	out["trip_s"] = round(time.Since(killedAt).Seconds(), 3)
	out["before_trip"] = before
	out["error"], out["message"] = "none", ""
	if trip != nil {
		msg := trip.Error()
		if len(msg) > 300 {
			msg = msg[:300]
		}
		out["error"], out["message"] = outcomeOf(trip), msg
	}
	// Anything the pool would still start shows up within a few backoffs.
	time.Sleep(time.Second) // the time a late spawn gets to appear, not a sync point
	out["spawns"] = spawns(state)
	out["live_after_trip"] = sortedKeys(children())
	calls, outcomes, slowest := int64(0), map[string]int64{}, time.Duration(0)
	failOnce := func() {
		t := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := pool.Call[addReq, sum](ctx, p, "add", addReq{1, 2})
		cancel()
		if err == nil {
			outcomes["ok"]++
		} else {
			outcomes[outcomeOf(err)]++
		}
		slowest = max(slowest, time.Since(t))
		calls++
	}
	for range 500 { // warm up before the memory baseline
		failOnce()
	}
	rssBefore := settledRSS()
	started := time.Now()
	for time.Since(started).Seconds() < a.failFastSeconds {
		for range 100 {
			failOnce()
		}
	}
	took := time.Since(started).Seconds()
	rssAfter := settledRSS()
	out["fail_fast"] = obj{"calls": calls, "outcomes": outcomes,
		"max_call_ms": round(float64(slowest)/float64(time.Millisecond), 2),
		"calls_per_s": math.Round(float64(calls) / took), "rss_before_mb": round(rssBefore, 1),
		"rss_after_mb": round(rssAfter, 1)}
	out["spawns_after_calls"] = spawns(state)
	closePool(p, "restart-limit")
	out["children_after_close"] = noChildren()
	return out
}

func main() {
	a := parseArgs(os.Args[1:])
	logf("seed %d", a.seed)
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) // VmHWM from here
	started := time.Now()
	r := &rng{state: a.seed}
	summary := obj{"parent": "go", "worker": a.worker, "seed": a.seed, "seconds": a.seconds,
		"workers": a.workers}
	ph := &phases{times: obj{}, last: time.Now()}
	for k, v := range runSoak(a, r, ph) {
		summary[k] = v
	}
	rl := restartLimit(a)
	summary["restart_limit"] = rl
	ph.mark("restart_limit")
	summary["phases_s"] = ph.times
	// VmHWM is updated lazily by the kernel: never report a peak below an RSS we read.
	mem := summary["memory_mb"].(obj)
	ff := rl["fail_fast"].(obj)
	mem["peak"] = round(max(statusMB("VmHWM"), mem["before"].(float64), mem["after"].(float64),
		ff["rss_before_mb"].(float64), ff["rss_after_mb"].(float64)), 1)
	summary["elapsed_s"] = round(time.Since(started).Seconds(), 2)
	line, err := json.Marshal(summary)
	if err != nil {
		logf("the summary: %v", err)
		os.Exit(1)
	}
	fmt.Println(string(line))
	// Both pools are closed and their processes reaped; an operation past its bound (already
	// counted no_outcome) must not keep the driver alive.
	os.Exit(0)
}
