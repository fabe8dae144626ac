// Command goplugin-bench is the HashiCorp go-plugin incumbent of bench/ (issue 27): a Go host
// and a Go plugin (this same binary, `goplugin-bench plugin`), the same functions as the
// wirepool bench workers, over gRPC or net/rpc as go-plugin's README shows:
//
//	goplugin-bench --proto grpc|netrpc '<scenario json>'   # one JSON result line (runner contract)
//	goplugin-bench plugin grpc|netrpc                      # the plugin (started by the host)
//
// Payloads: bytes (wrapperspb.BytesValue over gRPC, []byte over net/rpc's gob). Rows: made one
// at a time in the plugin and sent 256 per message (batched by hand: a gRPC server stream of
// JSON arrays; net/rpc has no streams, so one call per page of 256 rows, gob-encoded typed
// structs), decoded into typed structs in the host, every index checked. W5: go-plugin is one
// plugin per process, so N clients, two calls in flight each.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wirepool/wirepool/bench/runners/go/kit"
)

var proto = "grpc"

type conn struct {
	client *plugin.Client
	bench  Bench
}

func dial() conn {
	self, err := os.Executable()
	if err != nil {
		kit.Fatalf("own path: %v", err)
	}
	protocol := plugin.ProtocolGRPC
	if proto == "netrpc" {
		protocol = plugin.ProtocolNetRPC
	}
	cmd := exec.Command(self, "plugin", proto)
	cmd.Env = append(os.Environ(), "WIREPOOL_REPO="+kit.RepoRoot())
	c := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          map[string]plugin.Plugin{"bench": &BenchPlugin{}},
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{protocol},
		Logger:           hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: os.Stderr}),
	})
	rc, err := c.Client()
	if err != nil {
		kit.Fatalf("go-plugin client: %v", err)
	}
	raw, err := rc.Dispense("bench")
	if err != nil {
		kit.Fatalf("dispense: %v", err)
	}
	return conn{c, raw.(Bench)}
}

func (c conn) pid() int {
	if rc := c.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

func call(b Bench, method string, body []byte) {
	if method == "oneway" {
		n, err := b.Oneway(body)
		if err != nil || n != uint64(len(body)) {
			kit.Fatalf("oneway: %v, %d", err, n)
		}
		return
	}
	out, err := b.Echo(body)
	if err != nil || len(out) != len(body) {
		kit.Fatalf("echo: %v, %d bytes", err, len(out))
	}
}

func window(b Bench, method string, body []byte, inflight int, d time.Duration, minCalls int, latency bool) (int, float64, []int64) {
	start := time.Now()
	deadline := start.Add(d)
	if inflight <= 1 {
		var lat []int64
		calls := 0
		now := start
		for now.Before(deadline) || calls < minCalls {
			t0 := now
			call(b, method, body)
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
		wg.Go(func() {
			for !stop.Load() {
				call(b, method, body)
				done := calls.Add(1)
				if done%16 == 0 && done >= int64(minCalls) && time.Now().After(deadline) {
					stop.Store(true)
				}
			}
		})
	}
	wg.Wait()
	return int(calls.Load()), time.Since(start).Seconds(), nil
}

func runEcho(sc kit.Scenario) ([]kit.Figure, *int64, string) {
	c := dial()
	defer c.client.Kill()
	inflight := max(sc.Inflight, 1)
	method := "echo"
	if sc.Kind == "oneway" {
		method = "oneway"
	}
	body := kit.Payload(sc.Payload)
	latency := sc.Kind == "echo" && inflight == 1
	window(c.bench, method, body, inflight, time.Duration(sc.WarmupS*float64(time.Second)), 1, false)
	win := time.Duration(sc.DurationS * float64(time.Second))
	var rates, mbs, p50, p99 []float64
	for range sc.Repeats {
		calls, secs, lat := window(c.bench, method, body, inflight, win, max(sc.MinCalls, 1), latency)
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
	children := kit.PeakRSSKiB(c.pid())
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
		how = fmt.Sprintf("%d goroutines each keeping one call outstanding on the one client", inflight)
	}
	what := "gRPC unary, wrapperspb.BytesValue"
	if proto == "netrpc" {
		what = "net/rpc Call, []byte (gob)"
	}
	return figs, children, what + "; " + how
}

// readGRPC reads one Rows server stream, each message a JSON array of rows decoded into []T.
func readGRPC[T any](c conn, req kit.RowsReq, every int, pause time.Duration, index func(*T) uint64) int {
	cc := c.bench.(*GRPCClient).cc
	reqJSON, _ := json.Marshal(req)
	ctx := context.Background()
	s, err := cc.NewStream(ctx, rowsDesc, "/"+service+"/Rows")
	if err != nil {
		kit.Fatalf("rows stream: %v", err)
	}
	if err := s.SendMsg(wrapperspb.Bytes(reqJSON)); err != nil {
		kit.Fatalf("rows request: %v", err)
	}
	if err := s.CloseSend(); err != nil {
		kit.Fatalf("rows close send: %v", err)
	}
	count := 0
	msg := new(wrapperspb.BytesValue)
	var batch []T
	for {
		if err := s.RecvMsg(msg); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			kit.Fatalf("rows: %v", err)
		}
		batch = batch[:0]
		if err := json.Unmarshal(msg.Value, &batch); err != nil {
			kit.Fatalf("rows batch: %v", err)
		}
		for k := range batch {
			if got := index(&batch[k]); got != uint64(count) {
				kit.Fatalf("row %d carried index %d", count, got)
			}
			count++
			if every > 0 && count%every == 0 {
				time.Sleep(pause)
			}
		}
	}
	return count
}

// readRPC reads rows in pages of Batch through net/rpc (gob into []T).
func readRPC[T any](c conn, method string, req kit.RowsReq, every int, pause time.Duration, index func(*T) uint64) int {
	rc := c.bench.(*RPCClient).c
	count := 0
	for start := uint64(0); start < req.N; start += Batch {
		var batch []T
		if err := rc.Call("Plugin."+method, Page{Shape: req.Shape, Start: start, Count: min(Batch, req.N-start)}, &batch); err != nil {
			kit.Fatalf("rows: %v", err)
		}
		for k := range batch {
			if got := index(&batch[k]); got != uint64(count) {
				kit.Fatalf("row %d carried index %d", count, got)
			}
			count++
			if every > 0 && count%every == 0 {
				time.Sleep(pause)
			}
		}
	}
	return count
}

func read(c conn, req kit.RowsReq, every int, pause time.Duration) int {
	g := proto == "grpc"
	switch req.Shape {
	case "large_rows":
		if g {
			return readGRPC(c, req, every, pause, func(r *kit.LargeRow) uint64 { return r.I })
		}
		return readRPC(c, "RowsLarge", req, every, pause, func(r *kit.LargeRow) uint64 { return r.I })
	case kit.FoundingSmallShape:
		if g {
			return readGRPC(c, req, every, pause, func(r *kit.FoundingSmall) uint64 { return r.ID })
		}
		return readRPC(c, "FoundingSmall", req, every, pause, func(r *kit.FoundingSmall) uint64 { return r.ID })
	case kit.FoundingLargeShape:
		if g {
			return readGRPC(c, req, every, pause, func(r *kit.FoundingLarge) uint64 { return r.ID })
		}
		return readRPC(c, "FoundingLarge", req, every, pause, func(r *kit.FoundingLarge) uint64 { return r.ID })
	}
	if g {
		return readGRPC(c, req, every, pause, func(r *kit.SmallRow) uint64 { return r.I })
	}
	return readRPC(c, "RowsSmall", req, every, pause, func(r *kit.SmallRow) uint64 { return r.I })
}

func runRows(sc kit.Scenario) ([]kit.Figure, *int64, string) {
	c := dial()
	defer c.client.Kill()
	req := kit.RowsReq{Shape: sc.Shape, N: uint64(sc.N)}
	pause := time.Duration(sc.PauseMs * float64(time.Millisecond))
	var rates []float64
	if sc.Founding {
		read(c, kit.RowsReq{Shape: sc.Shape, N: uint64(min(sc.N, 256))}, 0, 0)
		win := sc.DurationS
		if win == 0 {
			win = 0.25
		}
		for range sc.Repeats {
			t := time.Now()
			rows := 0
			for rows == 0 || time.Since(t).Seconds() < win {
				if got := read(c, req, 0, 0); got != sc.N {
					kit.Fatalf("got %d rows, expected %d", got, sc.N)
				}
				rows += sc.N
			}
			rates = append(rates, float64(rows)/time.Since(t).Seconds())
		}
	} else {
		for range sc.Repeats {
			t := time.Now()
			if got := read(c, req, sc.Every, pause); got != sc.N {
				kit.Fatalf("got %d rows, expected %d", got, sc.N)
			}
			rates = append(rates, float64(sc.N)/time.Since(t).Seconds())
		}
	}
	notes := "gRPC server stream, 256 rows per wrapperspb.BytesValue as a JSON array (batched by hand), encoding/json into typed structs"
	if proto == "netrpc" {
		notes = "net/rpc (no streams): one Call per page of 256 rows, gob-encoded typed structs"
	}
	return []kit.Figure{kit.Fig("rows_per_s", "rows/s", rates, "higher")}, kit.PeakRSSKiB(c.pid()), notes
}

func runPool(sc kit.Scenario) ([]kit.Figure, *int64, string) {
	workers := max(sc.Workers, 1)
	conns := make([]conn, workers)
	for i := range conns {
		conns[i] = dial()
		defer conns[i].client.Kill()
	}
	spin := func(b Bench, us uint64) {
		got, err := b.Spin(us)
		if err != nil || got != us {
			kit.Fatalf("spin: %v %d", err, got)
		}
	}
	var wg sync.WaitGroup
	for i := range workers * 2 {
		wg.Go(func() { spin(conns[i%workers].bench, 1) })
	}
	wg.Wait()
	var rates []float64
	for range sc.Repeats {
		var next atomic.Int64
		t := time.Now()
		for i := range workers * 2 {
			wg.Go(func() {
				for next.Add(1) <= int64(sc.Tasks) {
					spin(conns[i%workers].bench, sc.TaskUs)
				}
			})
		}
		wg.Wait()
		rates = append(rates, float64(sc.Tasks)/time.Since(t).Seconds())
	}
	var pids []int
	for _, c := range conns {
		pids = append(pids, c.pid())
	}
	return []kit.Figure{kit.Fig("tasks_per_s", "tasks/s", rates, "higher")}, kit.MaxPeak(pids),
		"go-plugin has no pool: one plugin process per worker, 2 calls in flight each; the plugin spins on thread CPU time, one task at a time"
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "plugin" {
		servePlugin(len(os.Args) > 2 && os.Args[2] == "grpc")
		return
	}
	if p := kit.Flag("--proto"); p != "" {
		proto = p
	}
	runner := map[string]string{"grpc": "go_plugin_grpc", "netrpc": "go_plugin_netrpc"}[proto]
	if runner == "" {
		kit.Fatalf("--proto %q: grpc or netrpc", proto)
	}
	sc := kit.LoadScenario()
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
		kit.Unsupported(runner, sc, "not a scenario this incumbent drives: "+sc.Kind)
		return
	}
	kit.OK(runner, sc, figs, children, notes+" (go-plugin v1.8.0, grpc v1.85.0)")
	plugin.CleanupClients()
}
