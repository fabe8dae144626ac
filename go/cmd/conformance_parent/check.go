package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

// errorDetails is a *pool.Error's details as JSON (nil when none; a string when not JSON).
func errorDetails(e *pool.Error) any {
	if len(e.Details) == 0 {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(e.Details))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return string(e.Details)
	}
	return v
}

func detail(e *pool.Error, key string) (any, bool) {
	m, ok := errorDetails(e).(obj)
	if !ok {
		return nil, false
	}
	v, ok := m[key]
	return v, ok
}

// checkError fails unless err is the expected error.
func (s *suite) checkError(want obj, err error) error {
	var e *pool.Error
	if !errors.As(err, &e) {
		return failf("expected error %v, got a non-wirepool error %T: %v", want["code"], err, err)
	}
	code, cerr := s.code(want["code"])
	if cerr != nil {
		return cerr
	}
	if e.Code != code {
		return failf("expected error %v (%d), got code %d: %v", want["code"], code, e.Code, e)
	}
	if listener != nil && e.Code == proto.CodeWorkerExited {
		// PROTOCOL.md 21.6: a remote worker's end is its connection's, named in the details.
		if lost, _ := detail(e, "connection"); lost != "lost" {
			return failf("a remote worker's WORKER_EXITED must say \"connection\": \"lost\" in its details, got %s (%v)", describe(errorDetails(e)), e)
		}
	}
	if pc, ok := want["protocol_code"]; ok {
		got, _ := detail(e, "protocol_code")
		if !same(native(pc), got) {
			return failf("expected protocol code %v in the details, got %v (%v)", pc, got, e)
		}
	}
	if part, ok := want["message_contains"].(string); ok && !strings.Contains(e.Message, part) {
		msg := e.Message
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		return failf("error message %q does not contain %q", msg, part)
	}
	if d, ok := want["details"]; ok && !same(native(d), errorDetails(e)) {
		return failf("error details %s differ from the expected %s", describe(errorDetails(e)), describe(native(d)))
	}
	if w, ok := want["signal"]; ok {
		if got, _ := detail(e, "signal"); !same(native(w), got) {
			return failf("expected the worker to die by signal %v, got %v (%v)", w, got, e)
		}
	}
	if w, ok := want["exit_status"]; ok {
		if got, _ := detail(e, "exit_status"); !same(native(w), got) {
			return failf("expected the worker to exit with status %v, got %v (%v)", w, got, e)
		}
	}
	if part, ok := want["stderr_contains"].(string); ok {
		tail, _ := detail(e, "stderr_tail")
		if t, _ := tail.(string); !strings.Contains(t, part) {
			return failf("the stderr tail %q does not contain %q", tail, part)
		}
	}
	return nil
}

func checkElapsed(expect obj, elapsed time.Duration) error {
	e := elapsed.Seconds()
	if v, ok := expect["min_elapsed_s"]; ok && e+0.001 < num(v) {
		return failf("the outcome came after %.3fs, before the %vs deadline", e, v)
	}
	if v, ok := expect["max_elapsed_s"]; ok && e > num(v) {
		return failf("the outcome took %.3fs, more than %vs", e, v)
	}
	return nil
}

// checkCall fails unless a call's outcome is the expected one.
func (s *suite) checkCall(expect obj, sent, result any, err error) error {
	if expect["any"] == true {
		return nil
	}
	if want, ok := expect["error"].(obj); ok {
		if err == nil {
			return failf("expected error %v, got the result %s", want["code"], describe(result))
		}
		return s.checkError(want, err)
	}
	want, ok := expect["result"]
	if !ok {
		return failf("the expectation has neither result nor error")
	}
	if err != nil {
		return failf("expected a result, got error %v", err)
	}
	if want == "echo" {
		return sameBody(sent, result)
	}
	body, rerr := request(want)
	if rerr != nil {
		return rerr
	}
	return sameBody(body, result)
}

// shape checks row k of a stream; it returns the index the row carries.
type shape struct {
	name string
	size int
}

func shapeOf(expect obj) shape {
	rows, _ := expect["rows"].(obj)
	sh := shape{name: "any"}
	if n, ok := rows["shape"].(string); ok {
		sh.name = n
	}
	sh.size = integer(rows["size"])
	return sh
}

func (sh shape) check(k int64, row any) (int64, error) {
	var want any
	switch sh.name {
	case "decl":
		want = obj{"i": k, "name": fmt.Sprintf("decl_%d", k), "kind": "theorem"}
	case "int_index":
		want = k
	case "unchecked":
		return 0, nil
	case "raw_index":
		b, ok := row.([]byte)
		prefix := min(sh.size, 8)
		var idx [8]byte
		binary.LittleEndian.PutUint64(idx[:], uint64(k))
		if !ok || len(b) != sh.size || !bytes.Equal(b[:prefix], idx[:prefix]) ||
			!bytes.Equal(b[prefix:], bytes.Repeat([]byte{0xAB}, sh.size-prefix)) {
			return 0, failf("raw row %d (%s) is not %d bytes of index %d then 0xAB", k, describe(row), sh.size, k)
		}
		return k, nil
	default:
		return 0, failf("unknown row shape %q", sh.name)
	}
	if !same(want, row) {
		return 0, failf("row %d is %s, expected %s", k, describe(row), describe(want))
	}
	return k, nil
}

// reader is a stream being read: rows checked one by one, counted and summed.
type reader struct {
	s        *pool.RowStream[any, any]
	shape    shape
	count    int64
	checksum int64
	ended    bool
	err      error // the terminal error, nil at END
}

func (r *reader) read(until int64) error {
	for !r.ended && (until < 0 || r.count < until) {
		if !r.s.Next() {
			r.ended = true
			r.err = r.s.Err()
			return r.afterTerminal()
		}
		idx, err := r.shape.check(r.count, r.s.Row())
		if err != nil {
			return err
		}
		r.checksum += idx
		r.count++
	}
	return nil
}

// afterTerminal: exactly one terminal; reading again yields nothing new.
func (r *reader) afterTerminal() error {
	if r.s.Next() {
		return failf("a row (%s) arrived after the stream's terminal", describe(r.s.Row()))
	}
	if r.s.Err() != r.err {
		return failf("a second outcome (%v) after the stream's terminal (%v)", r.s.Err(), r.err)
	}
	return nil
}

func (r *reader) terminalText() string {
	switch {
	case !r.ended:
		return "not ended"
	case r.err == nil:
		return "ended normally"
	}
	return fmt.Sprintf("then error %v", r.err)
}

func (s *suite) checkStream(expect obj, r *reader) (string, error) {
	rows, _ := expect["rows"].(obj)
	n := r.count
	if v, ok := rows["count"]; ok && n != int64(integer(v)) {
		return "", failf("expected %v rows, got %d (%s)", v, n, r.terminalText())
	}
	if v, ok := rows["min"]; ok && n < int64(integer(v)) {
		return "", failf("expected at least %v rows, got %d", v, n)
	}
	if v, ok := rows["max"]; ok && n > int64(integer(v)) {
		return "", failf("expected at most %v rows, got %d", v, n)
	}
	if v, ok := rows["checksum"]; ok && !same(r.checksum, v) {
		return "", failf("row checksum %d differs from %v", r.checksum, v)
	}
	if !r.ended {
		return "", failf("the stream has not ended")
	}
	if expect["any"] == true {
		return fmt.Sprintf("%d rows, then %s", n, r.terminalText()), nil
	}
	if want, ok := expect["error"].(obj); ok {
		if r.err == nil {
			return "", failf("expected error %v after the rows, the stream ended normally after %d rows", want["code"], n)
		}
		if err := s.checkError(want, r.err); err != nil {
			return "", err
		}
		return fmt.Sprintf("%d rows, then error %v", n, r.err), nil
	}
	if r.err != nil {
		return "", failf("after %d rows the stream failed: %v", n, r.err)
	}
	switch want := expect["summary"].(type) {
	case string:
		if want == "none" && r.s.HasSummary() {
			return "", failf("expected no summary, got %s", describe(r.s.Summary()))
		}
	case obj:
		body, err := request(want)
		if err != nil {
			return "", err
		}
		if !r.s.HasSummary() || !same(body, r.s.Summary()) {
			return "", failf("expected the summary %s, got %s", describe(body), describe(r.s.Summary()))
		}
	}
	return fmt.Sprintf("%d rows, checksum %d", n, r.checksum), nil
}

// code is an error's wirepool code, 0 for another error.
func code(err error) proto.ErrorCode {
	var e *pool.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}
