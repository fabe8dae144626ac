package pool_test

import (
	"context"
	"testing"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

type decl struct {
	I    int    `json:"i" msgpack:"i"`
	Name string `json:"name" msgpack:"name"`
}
type declsSummary struct {
	Rows int `json:"rows" msgpack:"rows"`
}

func TestStream(t *testing.T) {
	// A small credit makes the worker wait for CREDIT many times over 5,000 rows.
	p := start(t, pool.Options{InitialCredit: pool.Set(4096)})
	ctx := bounded(t)
	for _, c := range []pool.Codec{pool.JSON, pool.Msgpack} {
		s, err := pool.Stream[map[string]int, decl, declsSummary](ctx, p, "decls", map[string]int{"n": 5000}, pool.WithCodec(c))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for row, err := range s.All() {
			if err != nil {
				t.Fatal(err)
			}
			if row.I != n {
				t.Fatalf("row %d is %d", n, row.I)
			}
			n++
		}
		if n != 5000 || s.Summary().Rows != 5000 {
			t.Fatalf("codec %d: %d rows, summary %+v", c, n, s.Summary())
		}
	}
}

func TestStreamErrorsAndCancel(t *testing.T) {
	p := start(t, pool.Options{})
	ctx := bounded(t)
	s, err := pool.Stream[map[string]int, decl, struct{}](ctx, p, "fail_after", map[string]int{"n": 3})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for s.Next() {
		n++
	}
	if n != 3 || code(s.Err()) != proto.CodeHandlerError {
		t.Fatalf("fail_after: %d rows, %v", n, s.Err())
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f, err := pool.Stream[any, int, struct{}](cctx, p, "forever", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; f.Next(); i++ {
		if i == 100 {
			cancel()
		}
	}
	if code(f.Err()) != proto.CodeCancelled {
		t.Fatalf("forever: %v", f.Err())
	}
	// Breaking out of All cancels too, and the worker stays usable.
	g, err := pool.Stream[any, int, struct{}](ctx, p, "forever", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range g.All() {
		if i == 10 {
			break
		}
	}
	r, err := pool.Call[map[string]int, addResp](ctx, p, "add", map[string]int{"a": 1, "b": 2})
	if err != nil || r.Sum != 3 {
		t.Fatalf("after streams: %v %v", r, err)
	}
	_, err = pool.Call[any, any](ctx, p, "decls", nil)
	if code(err) != proto.CodeUnknownMethod {
		t.Fatalf("call of a stream: %v", err)
	}
}
