// Command wirepool-go-bench is the wirepool runner of bench/ with the Go parent (go/pool):
//
//	wirepool-go-bench [--worker go|rust] '<scenario json>'   # one JSON result line on stdout
//
// Run by bench/runners/wirepool_go.sh (runner wirepool_go: Go workers, wirepool-go-worker
// built beside this binary) and wirepool_go_rsworker.sh (wirepool_go_rsworker: the Rust bench
// workers, wirepool-bench-worker and founding-worker, built by wirepool_rust.sh --prepare).
//
// How the SDK is used, as a user calls it: pool.Start with one worker (W5: the scenario's),
// 16 MiB frames (1 and 16 MiB payloads travel in one frame, as for the other runners);
// pool.Call[pool.Bytes, pool.Bytes] with the raw codec for payloads; `inflight` goroutines each
// looping on pool.Call for pipelined echo; pool.Stream[kit.RowsReq, Row, struct{}] with
// Next/Row decoding each row (in the scenario's codec) into a typed struct; raw rows as
// pool.Bytes (the row's bytes, not decoded); spin over 2 x workers goroutines for W5.
package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wirepool/wirepool/bench/runners/go/kit"
	"github.com/wirepool/wirepool/go/pool"
)

const maxFrame = 16 << 20

var lang = "go"

func workerCommand(founding bool) []string {
	exe, err := os.Executable()
	if err != nil {
		kit.Fatalf("own path: %v", err)
	}
	if lang == "rust" {
		target := os.Getenv("CARGO_TARGET_DIR")
		if target == "" {
			target = filepath.Join(kit.RepoRoot(), "rust", "target")
		}
		name := "wirepool-bench-worker"
		if founding {
			name = "founding-worker"
		}
		return []string{filepath.Join(target, "release", name)}
	}
	return []string{filepath.Join(filepath.Dir(exe), "wirepool-go-worker")}
}

func start(sc kit.Scenario, workers, inflight int) *pool.Pool {
	frame := maxFrame
	if sc.MaxFrameSize > 0 {
		frame = sc.MaxFrameSize
	}
	p, err := pool.Start(context.Background(), pool.Options{
		Command:        workerCommand(sc.Founding),
		Env:            []string{"WIREPOOL_REPO=" + kit.RepoRoot()},
		Workers:        pool.Set(workers),
		MaxInFlight:    pool.Set(inflight),
		MaxFrameSize:   pool.Set(frame),
		StartupTimeout: pool.Set(20 * time.Second),
	})
	if err != nil {
		kit.Fatalf("pool.Start: %v", err)
	}
	return p
}

func childrenPeak(p *pool.Pool) *int64 {
	var pids []int
	for _, w := range p.Stats().Workers {
		pids = append(pids, w.Pid)
	}
	return kit.MaxPeak(pids)
}

func closePool(p *pool.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.Close(ctx)
}

func check(method string, reply pool.Bytes, want int) {
	got := len(reply)
	if method == "oneway" && len(reply) >= 8 {
		got = int(binary.LittleEndian.Uint64(reply))
	}
	if got != want {
		kit.Fatalf("%s answered %d bytes, expected %d", method, got, want)
	}
}

// window runs echo/oneway calls for d (and at least minCalls) with inflight outstanding;
// (calls, seconds, latencies in ns when latency).
func window(p *pool.Pool, method string, body pool.Bytes, inflight int, d time.Duration, minCalls int, latency bool) (int, float64, []int64) {
	ctx := context.Background()
	start := time.Now()
	deadline := start.Add(d)
	if inflight <= 1 {
		var lat []int64
		calls := 0
		now := start
		for now.Before(deadline) || calls < minCalls {
			t0 := now
			reply, err := pool.Call[pool.Bytes, pool.Bytes](ctx, p, method, body)
			if err != nil {
				kit.Fatalf("call %s: %v", method, err)
			}
			check(method, reply, len(body))
			now = time.Now()
			if latency {
				lat = append(lat, now.Sub(t0).Nanoseconds())
			}
			calls++
		}
		return calls, now.Sub(start).Seconds(), lat
	}
	var calls atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				reply, err := pool.Call[pool.Bytes, pool.Bytes](ctx, p, method, body)
				if err != nil {
					kit.Fatalf("call %s: %v", method, err)
				}
				check(method, reply, len(body))
				done := calls.Add(1)
				if done%16 == 0 && done >= int64(minCalls) && time.Now().After(deadline) {
					stop.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	return int(calls.Load()), time.Since(start).Seconds(), nil
}

func runEcho(sc kit.Scenario) ([]kit.Figure, *int64, string) {
	inflight := max(sc.Inflight, 1)
	method := "echo"
	if sc.Kind == "oneway" {
		method = "oneway"
	}
	p := start(sc, 1, inflight)
	defer closePool(p)
	body := pool.Bytes(kit.Payload(sc.Payload))
	latency := sc.Kind == "echo" && inflight == 1
	win := time.Duration(sc.DurationS * float64(time.Second))
	window(p, method, body, inflight, time.Duration(sc.WarmupS*float64(time.Second)), 1, false)
	var rates, mbs, p50, p99 []float64
	for range sc.Repeats {
		calls, secs, lat := window(p, method, body, inflight, win, max(sc.MinCalls, 1), latency)
		rates = append(rates, float64(calls)/secs)
		dirs := 1.0
		if sc.Kind == "echo_large" {
			dirs = 2
		}
		mbs = append(mbs, float64(calls)*float64(sc.Payload)*dirs/secs/1e6)
		if len(lat) > 0 {
			p50 = append(p50, kit.PercentileUs(lat, 50))
			p99 = append(p99, kit.PercentileUs(lat, 99))
		}
	}
	children := childrenPeak(p)
	var figs []kit.Figure
	if sc.Kind == "oneway" || sc.Kind == "echo_large" {
		figs = []kit.Figure{kit.Fig("mb_per_s", "MB/s", mbs, "higher")}
	} else {
		figs = []kit.Figure{kit.Fig("calls_per_s", "calls/s", rates, "higher")}
		if len(p50) > 0 {
			figs = append(figs, kit.Fig("p50_us", "us", p50, "lower"), kit.Fig("p99_us", "us", p99, "lower"))
		}
	}
	how := "one call at a time"
	if inflight > 1 {
		how = fmt.Sprintf("%d goroutines each keeping one call outstanding", inflight)
	}
	return figs, children, fmt.Sprintf("pool.Call[pool.Bytes, pool.Bytes], raw codec, %d KiB frames; %s", maxFrameOf(sc)>>10, how)
}

func maxFrameOf(sc kit.Scenario) int {
	if sc.MaxFrameSize > 0 {
		return sc.MaxFrameSize
	}
	return maxFrame
}

func codecOf(name string) (pool.Codec, bool) {
	switch name {
	case "json":
		return pool.JSON, true
	case "msgpack":
		return pool.Msgpack, true
	case "cbor":
		return pool.CBOR, true
	case "raw":
		return pool.Raw, true
	}
	return 0, false
}

// readRows reads one stream of rows into Row, checking each index; pauses every `every` rows.
func readRows[Row any](p *pool.Pool, req kit.RowsReq, c pool.Codec, every int, pause time.Duration, index func(*Row) uint64) int {
	s, err := pool.Stream[kit.RowsReq, Row, struct{}](context.Background(), p, "rows", req, pool.WithCodec(c))
	if err != nil {
		kit.Fatalf("stream rows: %v", err)
	}
	count := 0
	for s.Next() {
		row := s.Row()
		if got := index(&row); got != uint64(count) {
			kit.Fatalf("row %d carried index %d", count, got)
		}
		count++
		if every > 0 && count%every == 0 {
			time.Sleep(pause)
		}
	}
	if err := s.Err(); err != nil {
		kit.Fatalf("stream rows: %v", err)
	}
	return count
}

func readRawRows(p *pool.Pool, n int, large bool) int {
	req := fmt.Sprint(n)
	if large {
		req += " large"
	}
	s, err := pool.Stream[pool.Bytes, pool.Bytes, struct{}](context.Background(), p, "raw_rows", pool.Bytes(req))
	if err != nil {
		kit.Fatalf("stream raw_rows: %v", err)
	}
	count, bytes := 0, 0
	for s.Next() {
		count++
		bytes += len(s.Row())
	}
	if err := s.Err(); err != nil {
		kit.Fatalf("stream raw_rows: %v", err)
	}
	if bytes < count*30 {
		kit.Fatalf("raw rows too short")
	}
	return count
}

func runRows(sc kit.Scenario) ([]kit.Figure, *int64, string) {
	c, ok := codecOf(sc.Codec)
	if !ok {
		kit.Fatalf("codec %q", sc.Codec)
	}
	p := start(sc, 1, 4)
	defer closePool(p)
	if sc.Founding {
		return runFounding(p, sc, c)
	}
	req := kit.RowsReq{Shape: sc.Shape, N: uint64(sc.N)}
	pause := time.Duration(sc.PauseMs * float64(time.Millisecond))
	var rates []float64
	for range sc.Repeats {
		t := time.Now()
		var got int
		switch {
		case c == pool.Raw:
			got = readRawRows(p, sc.N, sc.Shape == "large_rows")
		case sc.Shape == "large_rows":
			got = readRows(p, req, c, sc.Every, pause, func(r *kit.LargeRow) uint64 { return r.I })
		default:
			got = readRows(p, req, c, sc.Every, pause, func(r *kit.SmallRow) uint64 { return r.I })
		}
		if got != sc.N {
			kit.Fatalf("got %d rows, expected %d", got, sc.N)
		}
		rates = append(rates, float64(sc.N)/time.Since(t).Seconds())
	}
	notes := fmt.Sprintf("pool.Stream[kit.RowsReq, %s] (%s codec), Next/Row: one typed struct per row", map[bool]string{true: "LargeRow", false: "SmallRow"}[sc.Shape == "large_rows"], sc.Codec)
	if c == pool.Raw {
		notes = "pool.Stream[pool.Bytes, pool.Bytes] (raw codec): the row's JSON text as bytes, not decoded"
	}
	return []kit.Figure{kit.Fig("rows_per_s", "rows/s", rates, "higher")}, childrenPeak(p), notes
}

// runFounding: one untimed stream of 256 rows, then per repeat whole streams for the window.
func runFounding(p *pool.Pool, sc kit.Scenario, c pool.Codec) ([]kit.Figure, *int64, string) {
	read := func(n int) int {
		req := kit.RowsReq{Shape: sc.Shape, N: uint64(n)}
		if sc.Shape == kit.FoundingLargeShape {
			return readRows(p, req, c, 0, 0, func(r *kit.FoundingLarge) uint64 { return r.ID })
		}
		return readRows(p, req, c, 0, 0, func(r *kit.FoundingSmall) uint64 { return r.ID })
	}
	read(min(sc.N, 256))
	win := sc.DurationS
	if win == 0 {
		win = 0.25
	}
	var rates []float64
	for range sc.Repeats {
		t := time.Now()
		rows := 0
		for rows == 0 || time.Since(t).Seconds() < win {
			if got := read(sc.N); got != sc.N {
				kit.Fatalf("got %d rows, expected %d", got, sc.N)
			}
			rows += sc.N
		}
		rates = append(rates, float64(rows)/time.Since(t).Seconds())
	}
	return []kit.Figure{kit.Fig("rows_per_s", "rows/s", rates, "higher")}, childrenPeak(p),
		fmt.Sprintf("pool.Stream (%s), Next/Row into typed structs, every index checked; %s worker yielding one row at a time", sc.Codec, lang)
}

func runPool(sc kit.Scenario) ([]kit.Figure, *int64, string) {
	workers := max(sc.Workers, 1)
	p := start(sc, workers, 2)
	defer closePool(p)
	ctx := context.Background()
	spin := func(us uint64) {
		got, err := pool.Call[uint64, uint64](ctx, p, "spin", us)
		if err != nil || got != us {
			kit.Fatalf("spin: %v %d", err, got)
		}
	}
	var wg sync.WaitGroup
	for range workers * 2 {
		wg.Go(func() { spin(1) })
	}
	wg.Wait()
	var rates []float64
	for range sc.Repeats {
		var next atomic.Int64
		t := time.Now()
		for range workers * 2 {
			wg.Go(func() {
				for next.Add(1) <= int64(sc.Tasks) {
					spin(sc.TaskUs)
				}
			})
		}
		wg.Wait()
		rates = append(rates, float64(sc.Tasks)/time.Since(t).Seconds())
	}
	return []kit.Figure{kit.Fig("tasks_per_s", "tasks/s", rates, "higher")}, childrenPeak(p),
		"pool.Call[uint64, uint64](\"spin\") from 2 x workers goroutines, max_in_flight 2 per worker; the worker spins on thread CPU time, one task at a time"
}

func main() {
	if l := kit.Flag("--worker"); l != "" {
		lang = l
	}
	runner := map[string]string{"go": "wirepool_go", "rust": "wirepool_go_rsworker"}[lang]
	if runner == "" {
		kit.Fatalf("--worker %q: go or rust", lang)
	}
	sc := kit.LoadScenario()
	defer profile("parent")()
	if exe := workerCommand(sc.Founding)[0]; !isExecutable(exe) {
		kit.Unsupported(runner, sc, exe+" is not built (bench/runners/"+map[string]string{"go": "wirepool_go.sh", "rust": "wirepool_rust.sh"}[lang]+" --prepare)")
		return
	}
	var figs []kit.Figure
	var children *int64
	var notes string
	switch sc.Kind {
	case "echo", "oneway", "echo_large":
		figs, children, notes = runEcho(sc)
	case "rows", "slow_rows":
		figs, children, notes = runRows(sc)
	case "pool":
		figs, children, notes = runPool(sc)
	default:
		kit.Unsupported(runner, sc, "not a scenario this runner drives: "+sc.Kind)
		return
	}
	kit.OK(runner, sc, figs, children, notes)
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// profile writes a CPU profile to $WIREPOOL_GO_CPUPROFILE.<role>.<pid> when that is set (the
// profiles of docs/performance.md); the returned func stops it.
func profile(role string) func() {
	dir := os.Getenv("WIREPOOL_GO_CPUPROFILE")
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(fmt.Sprintf("%s.%s.%d", dir, role, os.Getpid()))
	if err != nil {
		return func() {}
	}
	_ = pprof.StartCPUProfile(f)
	return func() { pprof.StopCPUProfile(); f.Close() }
}
