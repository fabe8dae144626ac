// Command wirepool-go-worker is the Go worker of the wirepool bench runners (the Go SDK's
// worker package), started by a wirepool parent of any language with WIREPOOL_FD. The same
// methods as the Rust, Python and Node bench workers:
//
//	echo      unary  raw               bytes -> the same bytes
//	oneway    unary  raw               bytes -> their length, 8 bytes little-endian
//	rows      stream json/msgpack/cbor {"shape", "n"} -> rows 0..n-1 one Send at a time
//	                                   (W4's small_rows/large_rows, or a founding shape)
//	raw_rows  stream raw               "N" -> the small row's JSON text as bytes ("N large": the large row's)
//	spin      unary  json              us -> burns us of CPU time, returns us
//	mark      unary  raw               empty -> empty
//
// `wirepool-go-worker --lines SHAPE N` prints a founding shape's rows as JSON lines instead.
//
// spin runs one task at a time per worker (a mutex), as every other bench worker does (the
// Rust one spins on its I/O thread, Python under its GIL, Node on its one thread): W5's
// efficiency figures then compare one core per worker.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/wirepool/wirepool/bench/runners/go/kit"
	"github.com/wirepool/wirepool/go/worker"
)

func threadCPUNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

var spinMu sync.Mutex

func spin(_ context.Context, us uint64) (uint64, error) {
	spinMu.Lock()
	defer spinMu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	end := threadCPUNs() + int64(us)*1000
	for threadCPUNs() < end {
	}
	return us, nil
}

var (
	gens   = map[string]*kit.Gen{}
	gensMu sync.Mutex
)

func gen(shape string, fields []string) (*kit.Gen, error) {
	gensMu.Lock()
	defer gensMu.Unlock()
	if g, ok := gens[shape]; ok {
		return g, nil
	}
	g, err := kit.NewGen(shape, fields)
	if err != nil {
		return nil, err
	}
	gens[shape] = g
	return g, nil
}

func rows(_ context.Context, req kit.RowsReq, out *worker.Rows[any]) (worker.NoSummary, error) {
	var none worker.NoSummary
	switch req.Shape {
	case "small_rows":
		for i := range req.N {
			if err := out.Send(kit.SmallRow{I: i, Name: "decl_" + strconv.FormatUint(i, 10), Kind: "theorem"}); err != nil {
				return none, err
			}
		}
	case "large_rows":
		tail := strings.Repeat("x", kit.LargeTail)
		for i := range req.N {
			blob := fmt.Sprintf("%08d", i%100_000_000) + tail
			if err := out.Send(kit.LargeRow{I: i, Name: "decl_" + strconv.FormatUint(i, 10), Kind: "theorem", Blob: blob}); err != nil {
				return none, err
			}
		}
	case kit.FoundingSmallShape:
		g, err := gen(req.Shape, kit.SmallFields)
		if err != nil {
			return none, err
		}
		for i := range req.N {
			if err := out.Send(g.Small(i)); err != nil {
				return none, err
			}
		}
	case kit.FoundingLargeShape:
		g, err := gen(req.Shape, kit.LargeFields)
		if err != nil {
			return none, err
		}
		for i := range req.N {
			if err := out.Send(g.Large(i)); err != nil {
				return none, err
			}
		}
	default:
		return none, worker.Errorf(worker.CodeHandlerError, "unknown shape %q", req.Shape)
	}
	return none, nil
}

// rawRows formats each row's JSON text by hand into one reused buffer (Send copies a raw row).
func rawRows(_ context.Context, req worker.Bytes, out *worker.Rows[worker.Bytes]) (worker.NoSummary, error) {
	var none worker.NoSummary
	words := strings.Fields(string(req))
	if len(words) == 0 {
		return none, worker.Errorf(worker.CodeBadRequest, "raw_rows wants \"N\" or \"N large\"")
	}
	n, err := strconv.ParseUint(words[0], 10, 64)
	if err != nil {
		return none, err
	}
	large := len(words) > 1 && words[1] == "large"
	tail := []byte(strings.Repeat("x", kit.LargeTail) + `"}`)
	buf := make([]byte, 0, 4096+128)
	for i := range n {
		buf = append(buf[:0], `{"i":`...)
		buf = strconv.AppendUint(buf, i, 10)
		buf = append(buf, `,"name":"decl_`...)
		buf = strconv.AppendUint(buf, i, 10)
		if large {
			buf = append(buf, `","kind":"theorem","blob":"`...)
			buf = fmt.Appendf(buf, "%08d", i%100_000_000)
			buf = append(buf, tail...)
		} else {
			buf = append(buf, `","kind":"theorem"}`...)
		}
		if err := out.Send(worker.Bytes(buf)); err != nil {
			return none, err
		}
	}
	return none, nil
}

// lines prints rows 0..n-1 of a founding shape as compact JSON lines (bench/tests/test_founding.py
// compares their digest with the other languages' generators).
func lines(shape, count string) {
	n, err := strconv.ParseUint(count, 10, 64)
	if err != nil {
		kit.Fatalf("--lines SHAPE N: %v", err)
	}
	fields := kit.SmallFields
	if shape == kit.FoundingLargeShape {
		fields = kit.LargeFields
	}
	g, err := kit.NewGen(shape, fields)
	if err != nil {
		kit.Fatalf("%v", err)
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for i := range n {
		var row any
		if shape == kit.FoundingLargeShape {
			row = g.Large(i)
		} else {
			row = g.Small(i)
		}
		b, _ := json.Marshal(row)
		out.Write(append(b, '\n'))
	}
}

func main() {
	if len(os.Args) == 4 && os.Args[1] == "--lines" {
		lines(os.Args[2], os.Args[3])
		return
	}
	w := worker.New(worker.WithMaxConcurrency(256), worker.WithMaxFrameSize(16<<20), worker.WithName("wirepool-go-worker"))
	worker.Method(w, "echo", func(_ context.Context, b worker.Bytes) (worker.Bytes, error) { return b, nil })
	worker.Method(w, "oneway", func(_ context.Context, b worker.Bytes) (worker.Bytes, error) {
		return binary.LittleEndian.AppendUint64(nil, uint64(len(b))), nil
	})
	worker.Stream(w, "rows", rows, worker.Codecs(worker.JSON, worker.Msgpack, worker.CBOR))
	worker.Stream(w, "raw_rows", rawRows)
	worker.Method(w, "spin", spin)
	worker.Method(w, "mark", func(_ context.Context, _ worker.Bytes) (worker.Bytes, error) {
		_ = unix.Getpgrp()
		return worker.Bytes{}, nil
	})
	stop := profile("worker")
	err := w.Serve(context.Background())
	stop()
	if err != nil {
		os.Exit(1)
	}
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
