// Command conformance_worker is the Go conformance worker: the method table of
// conformance/README.md ("The conformance worker's methods") on the Go SDK, so that every
// parent runner drives it through conformance/scenarios.json. Started by a parent (it needs
// WIREPOOL_FD); not meant to be run by hand.
package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wirepool/wirepool/go/worker"
)

const (
	crashLine    = "conformance worker: crash requested"
	appErrorCode = 1042
)

type addReq struct {
	A int64 `json:"a" msgpack:"a" cbor:"a"`
	B int64 `json:"b" msgpack:"b" cbor:"b"`
}

type addResp struct {
	Sum int64 `json:"sum" msgpack:"sum" cbor:"sum"`
}

type countReq struct {
	N int `json:"n" msgpack:"n" cbor:"n"`
}

type decl struct {
	I    int    `json:"i" msgpack:"i" cbor:"i"`
	Name string `json:"name" msgpack:"name" cbor:"name"`
	Kind string `json:"kind" msgpack:"kind" cbor:"kind"`
}

type declsSummary struct {
	Rows int `json:"rows" msgpack:"rows" cbor:"rows"`
}

type sizeReq struct {
	Size int `json:"size"`
}

type exitReq struct {
	Status int `json:"status"`
}

type printReq struct {
	Stream string `json:"stream"`
	N      int    `json:"n"`
}

// rawRowsProduced counts the rows the latest raw_rows has started handing to the SDK.
var rawRowsProduced atomic.Int64

// gathered counts the gather calls that reached a handler; changed is closed and replaced at
// every arrival.
var (
	gatherMu sync.Mutex
	gathered int
	changed  = make(chan struct{})
)

func gather(ctx context.Context, n int) (int, error) {
	gatherMu.Lock()
	gathered++
	close(changed)
	changed = make(chan struct{})
	for gathered < n {
		wait := changed
		gatherMu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
		gatherMu.Lock()
	}
	gatherMu.Unlock()
	return n, nil
}

func sendDecls(rows *worker.Rows[decl], n int) error {
	for i := range n {
		if err := rows.Send(decl{I: i, Name: "decl_" + strconv.Itoa(i), Kind: "theorem"}); err != nil {
			return err
		}
	}
	return nil
}

// patternString is the scenarios' {"string": {"size": N}}: character i is 'a' + (31 i + 17) mod 26.
func patternString(n int) string {
	var b strings.Builder
	b.Grow(n)
	for i := range n {
		b.WriteByte(byte('a' + (31*i+17)%26))
	}
	return b.String()
}

func crash() {
	fmt.Fprintln(os.Stderr, crashLine)
	abort()
}

func main() {
	w := worker.New(worker.WithName("wirepool-go-conformance"), worker.WithMaxConcurrency(64))
	all := worker.Codecs(worker.Raw, worker.JSON, worker.Msgpack, worker.CBOR)
	structured := worker.Codecs(worker.JSON, worker.Msgpack, worker.CBOR)
	jsonOnly := worker.Codecs(worker.JSON)

	worker.Method(w, "echo", func(_ context.Context, body worker.Bytes) (worker.Bytes, error) {
		return body, nil
	}, all)
	worker.Method(w, "add", func(_ context.Context, r addReq) (addResp, error) {
		return addResp{Sum: r.A + r.B}, nil
	}, jsonOnly)
	worker.Stream(w, "decls", func(_ context.Context, r countReq, rows *worker.Rows[decl]) (declsSummary, error) {
		if err := sendDecls(rows, r.N); err != nil {
			return declsSummary{}, err
		}
		return declsSummary{Rows: r.N}, nil
	}, structured)
	worker.Stream(w, "raw_rows", func(_ context.Context, body worker.Bytes, rows *worker.Rows[worker.Bytes]) (worker.NoSummary, error) {
		f := strings.Fields(string(body))
		if len(f) != 2 {
			return worker.NoSummary{}, fmt.Errorf("raw_rows wants \"N SIZE\", got %q", body)
		}
		n, err1 := strconv.Atoi(f[0])
		size, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil || n < 0 || size < 0 {
			return worker.NoSummary{}, fmt.Errorf("raw_rows wants \"N SIZE\", got %q", body)
		}
		rawRowsProduced.Store(0)
		row := bytes.Repeat([]byte{0xAB}, size)
		prefix := min(8, size)
		var idx [8]byte
		for i := range n {
			for k := range 8 {
				idx[k] = byte(uint64(i) >> (8 * k))
			}
			copy(row[:prefix], idx[:prefix])
			rawRowsProduced.Store(int64(i + 1))
			if err := rows.Send(row); err != nil {
				return worker.NoSummary{}, err
			}
		}
		return worker.NoSummary{}, nil
	}, worker.Codecs(worker.Raw))
	worker.Method(w, "raw_rows_produced", func(_ context.Context, _ any) (int64, error) {
		return rawRowsProduced.Load(), nil
	}, jsonOnly)
	worker.Stream(w, "forever", func(_ context.Context, _ any, rows *worker.Rows[int]) (worker.NoSummary, error) {
		for i := 0; ; i++ {
			if err := rows.Send(i); err != nil {
				return worker.NoSummary{}, err
			}
		}
	}, jsonOnly)
	worker.Stream(w, "one_row_then_wait", func(ctx context.Context, _ any, rows *worker.Rows[int]) (worker.NoSummary, error) {
		if err := rows.Send(0); err != nil {
			return worker.NoSummary{}, err
		}
		<-ctx.Done() // blocked after one row: the flush rule must still deliver it
		return worker.NoSummary{}, context.Cause(ctx)
	}, jsonOnly)
	worker.Method(w, "sleep", func(ctx context.Context, ms int64) (int64, error) {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
			return ms, nil
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	}, jsonOnly)
	worker.Method(w, "hang", func(_ context.Context, ms int64) (int64, error) {
		time.Sleep(time.Duration(ms) * time.Millisecond) // deaf to cancellation and deadline
		return ms, nil
	}, jsonOnly)
	worker.Method(w, "fail", func(_ context.Context, _ any) (any, error) {
		return nil, worker.Errorf(worker.CodeHandlerError, "the fail method was called")
	}, jsonOnly)
	worker.Method(w, "fail_app", func(_ context.Context, req any) (any, error) {
		return nil, worker.Error{Code: appErrorCode, Message: "application failure", Details: map[string]any{"request": req}}
	}, jsonOnly)
	worker.Method(w, "crash", func(_ context.Context, _ any) (any, error) {
		crash()
		return nil, nil
	}, jsonOnly)
	worker.Stream(w, "crash_stream", func(_ context.Context, r countReq, rows *worker.Rows[decl]) (worker.NoSummary, error) {
		if err := sendDecls(rows, r.N); err != nil {
			return worker.NoSummary{}, err
		}
		crash()
		return worker.NoSummary{}, nil
	}, jsonOnly)
	worker.Method(w, "fail_long", func(_ context.Context, r countReq) (any, error) {
		return nil, worker.Error{Code: appErrorCode, Message: "long failure: " + strings.Repeat("\u00e9", r.N)}
	}, jsonOnly)
	worker.Stream(w, "big_summary", func(_ context.Context, r sizeReq, rows *worker.Rows[int]) (string, error) {
		if err := rows.Send(0); err != nil {
			return "", err
		}
		return patternString(r.Size), nil
	}, jsonOnly)
	worker.Stream(w, "fail_after", func(_ context.Context, r countReq, rows *worker.Rows[decl]) (worker.NoSummary, error) {
		if err := sendDecls(rows, r.N); err != nil {
			return worker.NoSummary{}, err
		}
		return worker.NoSummary{}, worker.Errorf(worker.CodeHandlerError, "failed after the rows")
	}, jsonOnly)
	worker.Method(w, "gather", gather, jsonOnly)
	worker.Method(w, "spin", func(ctx context.Context, ms int64) (int64, error) {
		end := time.Now().Add(time.Duration(ms) * time.Millisecond)
		for time.Now().Before(end) {
			if ctx.Err() != nil {
				return 0, context.Cause(ctx)
			}
		}
		return ms, nil
	}, jsonOnly)
	worker.Method(w, "whoami", func(_ context.Context, _ any) (int, error) {
		return os.Getpid(), nil
	}, jsonOnly)
	worker.Method(w, "exit", func(_ context.Context, r exitReq) (any, error) {
		os.Exit(r.Status)
		return nil, nil
	}, jsonOnly)
	worker.Method(w, "freeze", func(_ context.Context, _ any) (any, error) {
		_ = unix.Kill(os.Getpid(), unix.SIGSTOP)
		select {} // resumed: never answer (the parent's WORKER_HUNG is the one terminal)
	}, jsonOnly)
	worker.Method(w, "print", func(_ context.Context, r printReq) (int, error) {
		out := os.Stdout
		switch r.Stream {
		case "stdout":
		case "stderr":
			out = os.Stderr
		default:
			return 0, fmt.Errorf("no stream named %q", r.Stream)
		}
		if _, err := out.Write(bytes.Repeat([]byte{'x'}, r.N)); err != nil {
			return 0, err
		}
		_ = out.Sync()
		return r.N, nil
	}, jsonOnly)
	w.Run()
}
