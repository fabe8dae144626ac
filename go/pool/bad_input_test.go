package pool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

// conformance/bad_input.json (PROTOCOL.md 22.5) replayed against go/pool and the Go
// conformance worker. A row passes, or is named below with why: goInexpressible (Go's types
// have no form for the input; these belong in the row's "inexpressible" map of the table) or
// goPending (go/pool does not do it yet). A pending row that can be expressed still runs and
// must still fail, so a row that starts passing has to leave the list.

var goInexpressible = map[string]string{
	"pool.workers.nan":                "Options.Workers is an int",
	"pool.workers.fraction":           "Options.Workers is an int",
	"pool.workers.string":             "Options.Workers is an int",
	"pool.max_in_flight.nan":          "Options.MaxInFlight is an int",
	"pool.startup_timeout_ms.nan":     "a time.Duration is an integer of nanoseconds",
	"pool.startup_timeout_ms.inf":     "a time.Duration is an integer of nanoseconds",
	"pool.startup_timeout_ms.1e300":   "a time.Duration holds at most ~292 years",
	"pool.heartbeat_ms.nan":           "a time.Duration is an integer of nanoseconds",
	"pool.heartbeat_ms.inf":           "a time.Duration is an integer of nanoseconds",
	"pool.heartbeat_ms.string":        "Options.Heartbeat is a time.Duration",
	"pool.cancel_grace_ms.nan":        "a time.Duration is an integer of nanoseconds",
	"pool.deadline_grace_ms.nan":      "a time.Duration is an integer of nanoseconds",
	"pool.deadline_grace_ms.inf":      "a time.Duration is an integer of nanoseconds",
	"pool.drain_grace_ms.nan":         "a time.Duration is an integer of nanoseconds",
	"pool.restart_backoff_max_ms.nan": "a time.Duration is an integer of nanoseconds",
	"pool.max_restarts.fraction":      "Options.MaxRestarts is an int",
	"pool.max_frame_size.nan":         "Options.MaxFrameSize is an int",
	"pool.max_message_size.nan":       "Options.MaxMessageSize is an int64",
	"pool.max_idle_ms.nan":            "a time.Duration is an integer of nanoseconds",
	"pool.retry_attempts.fraction":    "an attempt count would be an int",
	"pool.codec.wrong_type":           "a codec is a pool.Codec",
	"call.timeout_ms.nan":             "a deadline is a context's time.Time",
	"call.timeout_ms.inf":             "a deadline is a context's time.Time",
	"call.timeout_ms.-inf":            "a deadline is a context's time.Time",
	"call.timeout_ms.1e300":           "a time.Duration holds at most ~292 years",
	"call.timeout_ms.string":          "a deadline is a context's time.Time",
	"stream.timeout_ms.nan":           "a deadline is a context's time.Time",
	"call.codec.unknown":              "a codec is a pool.Codec (TestCallerInput refuses pool.Codec(9))",
	"pool.codec.unknown":              "a codec is a pool.Codec, and go/pool takes it per call",
}

var goPending = map[string]string{
	"request.json.bigint":           "issue 27: encoding/json writes a *big.Int 2^64 as an exact JSON number; the parent sends it",
	"request.json.opaque_object":    "issue 27: encoding/json writes a struct without exported fields as {}",
	"request.msgpack.opaque_object": "issue 27: msgpack writes a struct without exported fields as an empty map",
	"request.msgpack.bigint":        "issue 27: vmihailenco/msgpack writes a *big.Int 2^64 without an error; the parent sends it",
}

type badRow struct {
	ID            string            `json:"id"`
	Kind          string            `json:"kind"`
	Option        string            `json:"option"`
	Value         json.RawMessage   `json:"value"`
	At            string            `json:"at"`
	Code          *int              `json:"code"`
	Method        json.RawMessage   `json:"method"`
	Request       json.RawMessage   `json:"request"`
	Codec         string            `json:"codec"`
	Stream        bool              `json:"stream"`
	Action        string            `json:"action"`
	Pool          map[string]int64  `json:"pool"`
	Only          []string          `json:"only"`
	Inexpressible map[string]string `json:"inexpressible"`
	MessageMax    int               `json:"message_max_chars"`
}

// errNoForm: the row's input has no Go form.
var errNoForm = errors.New("no Go form for this input")

func loadBadInput(t *testing.T) []badRow {
	raw, err := os.ReadFile("../../conformance/bad_input.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Rows []badRow }
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Rows
}

func TestBadInputListsNameRealRows(t *testing.T) {
	ids := map[string]bool{}
	for _, r := range loadBadInput(t) {
		ids[r.ID] = true
	}
	for _, list := range []map[string]string{goInexpressible, goPending} {
		for id, why := range list {
			if !ids[id] {
				t.Errorf("%s names no row of bad_input.json", id)
			}
			if why == "" {
				t.Errorf("%s is listed without a reason", id)
			}
			if _, both := goInexpressible[id]; both && goPending[id] != "" {
				t.Errorf("%s is both inexpressible and pending", id)
			}
		}
	}
}

// number is a JSON value as an integer; errNoForm for a fraction, a string or {"$": ...}.
func number(v json.RawMessage) (int64, error) {
	var n json.Number
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	if err := d.Decode(&n); err != nil {
		return 0, errNoForm
	}
	i, err := n.Int64()
	if err != nil {
		return 0, errNoForm
	}
	return i, nil
}

// setOption sets one option of the table (durations in ms) on o.
func setOption(o *pool.Options, name string, v json.RawMessage) error {
	if strings.Contains(string(v), `"$": "options"`) || strings.Contains(string(v), `"$":"options"`) {
		var many map[string]json.RawMessage
		_ = json.Unmarshal(v, &many)
		for k, x := range many {
			if k == "$" {
				continue
			}
			if err := setOption(o, k, x); err != nil {
				return err
			}
		}
		return nil
	}
	if name == "command" {
		return json.Unmarshal(v, &o.Command)
	}
	n, err := number(v)
	if err != nil {
		return err
	}
	ints := map[string]*pool.Optional[int]{"workers": &o.Workers, "max_in_flight": &o.MaxInFlight, "max_frame_size": &o.MaxFrameSize,
		"initial_credit": &o.InitialCredit, "max_restarts": &o.MaxRestarts, "max_requests": &o.MaxRequests,
		"stderr_tail_lines": &o.StderrTailLines}
	durs := map[string]*pool.Optional[time.Duration]{"startup_timeout_ms": &o.StartupTimeout,
		"cancel_grace_ms": &o.CancelGrace, "deadline_grace_ms": &o.DeadlineGrace, "drain_grace_ms": &o.DrainGrace,
		"goodbye_grace_ms": &o.GoodbyeGrace, "restart_backoff_ms": &o.RestartBackoff,
		"restart_backoff_max_ms": &o.RestartBackoffMax, "restart_window_ms": &o.RestartWindow, "max_idle_ms": &o.MaxIdle}
	switch {
	case ints[name] != nil:
		*ints[name] = pool.Set(int(n))
	case durs[name] != nil:
		*durs[name] = pool.Set(time.Duration(n) * time.Millisecond)
	case name == "heartbeat_ms":
		o.Heartbeat = time.Duration(n) * time.Millisecond
		if n == 0 {
			o.Heartbeat = pool.NoHeartbeat // the table's 0 is off
		}
	case name == "max_message_size":
		o.MaxMessageSize = pool.Set(n)
	case name == "max_rss_bytes":
		o.MaxRSSBytes = pool.Set(n)
	case name == "retry_attempts":
		o.Retry = &pool.RetryPolicy{Methods: []string{"add"}, Attempts: pool.Set(int(n))}
	default:
		return fmt.Errorf("go/pool has no option %s: %w", name, errNoForm)
	}
	return nil
}

// special builds a {"$": NAME} value of the table.
func special(v json.RawMessage) (any, error) {
	var s struct {
		Name string `json:"$"`
		S    string `json:"s"`
		N    int    `json:"n"`
	}
	if json.Unmarshal(v, &s) != nil || s.Name == "" {
		var plain any
		err := json.Unmarshal(v, &plain)
		return plain, err
	}
	switch s.Name {
	case "repeat":
		return strings.Repeat(s.S, s.N), nil
	case "string_of_bytes":
		return bytes.Repeat([]byte{'x'}, s.N), nil
	case "cyclic":
		m := map[string]any{}
		m["self"] = m
		return m, nil
	case "function":
		return func() {}, nil
	case "bigint":
		return new(big.Int).Lsh(big.NewInt(1), 64), nil
	case "opaque_object":
		return struct{ hidden int }{1}, nil
	case "non_string_key":
		return map[[2]int]int{{1, 2}: 3}, nil
	}
	return nil, errNoForm
}

func codecNamed(name string) pool.Codec {
	switch name {
	case "raw":
		return pool.Raw
	case "msgpack":
		return pool.Msgpack
	case "cbor":
		return pool.CBOR
	}
	return pool.JSON
}

// outcome runs one row; its error is nil for a row that succeeded.
func (b *badInput) outcome(r badRow) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch r.Kind {
	case "pool_option":
		o := pool.Options{Command: []string{workerBin}}
		if err := setOption(&o, r.Option, r.Value); err != nil {
			return err
		}
		p, err := pool.Start(ctx, o)
		if err == nil {
			_ = p.Close(ctx)
		}
		return err
	case "call_option", "method", "request":
		p := b.shared
		if len(r.Pool) > 0 {
			o := pool.Options{Command: []string{workerBin}}
			if n, ok := r.Pool["max_frame_size"]; ok {
				o.MaxFrameSize = pool.Set(int(n))
			}
			if n, ok := r.Pool["max_message_size"]; ok {
				o.MaxMessageSize = pool.Set(n)
			}
			own, err := pool.Start(ctx, o)
			if err != nil {
				return fmt.Errorf("the row's pool did not start: %w", err)
			}
			defer own.Close(ctx)
			p = own
		}
		method, err := special(r.Method)
		if err != nil {
			return err
		}
		req, err := special(r.Request)
		if err != nil {
			return err
		}
		opts := []pool.CallOption{pool.WithCodec(codecNamed(r.Codec))}
		if r.Kind == "call_option" && r.Option == "timeout_ms" {
			var f float64
			if json.Unmarshal(r.Value, &f) != nil {
				return errNoForm
			}
			opts = append(opts, pool.WithTimeout(time.Duration(f*float64(time.Millisecond))))
		} else if r.Kind == "call_option" {
			return errNoForm
		}
		name, _ := method.(string)
		if r.Stream {
			s, err := pool.Stream[any, any, any](ctx, p, name, req, opts...)
			if err != nil {
				return err
			}
			for s.Next() {
			}
			return s.Err()
		}
		_, err = pool.Call[any, any](ctx, p, name, req, opts...)
		return err
	case "lifecycle":
		return b.lifecycle(ctx, r.Action)
	}
	return fmt.Errorf("unknown row kind %q", r.Kind)
}

func (b *badInput) lifecycle(ctx context.Context, action string) error {
	if action == "every_refusal_then_call" {
		r, err := pool.Call[map[string]int, addResp](ctx, b.shared, "add", map[string]int{"a": 1, "b": 2})
		if err == nil && r.Sum != 3 {
			err = fmt.Errorf("add answered %d", r.Sum)
		}
		return err
	}
	p, err := pool.Start(ctx, pool.Options{Command: []string{workerBin}})
	if err != nil {
		return err
	}
	defer p.Close(ctx)
	switch action {
	case "call_after_close", "stream_after_close", "lease_after_close":
		_ = p.Close(ctx)
		switch action {
		case "call_after_close":
			_, err = pool.Call[any, any](ctx, p, "echo", 1)
		case "stream_after_close":
			_, err = pool.Stream[any, any, any](ctx, p, "decls", map[string]int{"n": 1})
		default:
			_, err = p.Lease(ctx)
		}
		return err
	case "close_twice":
		if err := p.Close(ctx); err != nil {
			return err
		}
		return p.Close(ctx)
	case "close_concurrently":
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = p.Close(ctx) }()
		}
		wg.Wait()
		return errors.Join(errs...)
	case "lease_call_after_release":
		l, err := p.Lease(ctx)
		if err != nil {
			return err
		}
		l.Release()
		_, err = pool.Call[any, any](ctx, l, "echo", 1)
		return err
	case "stream_read_after_end":
		s, err := pool.Stream[any, any, any](ctx, p, "decls", map[string]int{"n": 2})
		if err != nil {
			return err
		}
		n := 0
		for s.Next() {
			n++
		}
		if n != 2 || s.Err() != nil || s.Next() || s.Err() != nil {
			return fmt.Errorf("a read after the end: %d rows, %v", n, s.Err())
		}
		return nil
	case "cancel_after_end":
		cctx, cancel := context.WithCancel(ctx)
		_, err := pool.Call[any, any](cctx, p, "echo", 1)
		cancel() // after the call ended: no effect
		if err != nil {
			return err
		}
		_, err = pool.Call[any, any](ctx, p, "echo", 1)
		return err
	}
	return fmt.Errorf("unknown action %q", action)
}

type badInput struct{ shared *pool.Pool }

func TestBadInput(t *testing.T) {
	rows := loadBadInput(t)
	b := &badInput{shared: start(t, pool.Options{})}
	// every_refusal_then_call runs last: the shared pool has taken every call-time row.
	slices.SortStableFunc(rows, func(x, y badRow) int {
		return boolInt(x.Action == "every_refusal_then_call") - boolInt(y.Action == "every_refusal_then_call")
	})
	for _, r := range rows {
		t.Run(r.ID, func(t *testing.T) {
			if len(r.Only) > 0 && !slices.Contains(r.Only, "go") {
				t.Skipf("the row applies to %v only", r.Only)
			}
			if why, ok := r.Inexpressible["go"]; ok {
				t.Skipf("inexpressible in Go (the table): %s", why)
			}
			if why, ok := goInexpressible[r.ID]; ok {
				t.Skipf("inexpressible in Go: %s", why)
			}
			err := b.outcome(r)
			pending, isPending := goPending[r.ID]
			if errors.Is(err, errNoForm) {
				if !isPending {
					t.Fatalf("%v: name the row in goInexpressible or goPending with why", err)
				}
				t.Skipf("pending: %s", pending)
			}
			problem := check(r, err)
			switch {
			case isPending && problem == "":
				t.Fatalf("passes now: remove it from goPending (%s)", pending)
			case isPending:
				t.Skipf("pending (%s), still failing: %s", pending, problem)
			case problem != "":
				t.Fatal(problem)
			}
		})
	}
}

// check is "" when err is the row's expected outcome, else what differs.
func check(r badRow, err error) string {
	if r.At == "ok" {
		if err != nil {
			return fmt.Sprintf("expected success, got %v", err)
		}
		return ""
	}
	if r.Code == nil {
		return "the row has neither a code nor at: ok"
	}
	var e *pool.Error
	if !errors.As(err, &e) {
		return fmt.Sprintf("expected code %d, got %v", *r.Code, err)
	}
	if int(e.Code) != *r.Code {
		return fmt.Sprintf("expected code %d, got %.300v", *r.Code, err)
	}
	if r.MessageMax > 0 && len([]rune(e.Message)) > r.MessageMax {
		return fmt.Sprintf("a message of %d characters, above %d", len([]rune(e.Message)), r.MessageMax)
	}
	if r.At == "construction" && e.Code == proto.CodeInvalidArgument && !strings.Contains(string(e.Details), `"field"`) {
		return fmt.Sprintf("INVALID_ARGUMENT without the field in its details: %v", err)
	}
	return ""
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
