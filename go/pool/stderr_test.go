package pool_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

// startFails starts a pool of one worker running script under sh (it never sends HELLO) and
// returns the start's error.
func startFails(t *testing.T, script string, tailLines pool.Optional[int]) *pool.Error {
	t.Helper()
	_, err := pool.Start(bounded(t), pool.Options{Command: []string{"sh", "-c", script}, Workers: pool.Set(1),
		StderrTailLines: tailLines})
	var e *pool.Error
	if !errors.As(err, &e) || e.Code != proto.CodeWorkerExited {
		t.Fatalf("a worker exiting before HELLO: %v, expected WORKER_EXITED", err)
	}
	return e
}

func numbered(from, to int) []string {
	var l []string
	for i := from; i <= to; i++ {
		l = append(l, fmt.Sprintf("line %d", i))
	}
	return l
}

func detailTail(t *testing.T, e *pool.Error) string {
	t.Helper()
	var d struct {
		Tail *string `json:"stderr_tail"`
	}
	if err := json.Unmarshal(e.Details, &d); err != nil || d.Tail == nil {
		t.Fatalf("details %s carry no stderr_tail (%v)", e.Details, err)
	}
	return *d.Tail
}

// A worker writing 30 lines and exiting before HELLO: the error keeps the last N, not earlier ones.
func TestStderrTailKeepsLastLines(t *testing.T) {
	const script = `i=1; while [ $i -le 30 ]; do echo "line $i" >&2; i=$((i+1)); done; exit 3`
	// Unset keeps the default; an explicit 0 keeps none.
	for _, c := range []struct {
		lines pool.Optional[int]
		want  int
	}{{pool.Set(5), 5}, {pool.Optional[int]{}, proto.ParentDefaultStderrTailLines}, {pool.Set(0), 0}, {pool.Set(100), 30}} {
		e := startFails(t, script, c.lines)
		want := numbered(31-c.want, 30)
		if !slices.Equal(e.StderrTail, want) {
			t.Fatalf("StderrTailLines %v: StderrTail %q, expected %q", c.lines, e.StderrTail, want)
		}
		if !strings.Contains(e.Message, strings.Join(want, "\n")) {
			t.Fatalf("StderrTailLines %v: the message %q does not carry the tail", c.lines, e.Message)
		}
		if c.want < 30 && strings.Contains(e.Message, fmt.Sprintf("line %d\n", 30-c.want)) {
			t.Fatalf("StderrTailLines %v: the message %q carries a line before the tail", c.lines, e.Message)
		}
		if got := detailTail(t, e); got != strings.Join(want, "\n") {
			t.Fatalf("StderrTailLines %v: details' stderr_tail %q", c.lines, got)
		}
	}
}

// A line longer than 4,096 bytes is cut there and marked; the next line is whole. A last line
// without its newline is kept too.
func TestStderrTailCutsLongLines(t *testing.T) {
	e := startFails(t, `head -c 10000 /dev/zero | tr '\0' x >&2; printf '\nafter\nno newline' >&2; exit 1`, pool.Set(5))
	want := []string{strings.Repeat("x", 4096) + " [...truncated]", "after", "no newline"}
	if !slices.Equal(e.StderrTail, want) {
		t.Fatalf("StderrTail %d lines, first %d bytes: %.80q, expected %q (first cut to 4,096 bytes)",
			len(e.StderrTail), len(e.StderrTail[0]), e.StderrTail, want[1:])
	}
}

// The message quotes at most the tail's last 4,111 bytes (one cut line); StderrTail keeps all of it.
func TestStderrTailMessageBounded(t *testing.T) {
	e := startFails(t, `for c in a b c d; do head -c 3000 /dev/zero | tr '\0' $c >&2; echo >&2; done; exit 1`, pool.Set(20))
	if len(e.StderrTail) != 4 || e.StderrTail[3] != strings.Repeat("d", 3000) {
		t.Fatalf("StderrTail %d lines, expected 4", len(e.StderrTail))
	}
	if len(e.Message) > 4111+200 {
		t.Fatalf("the message is %d bytes: the tail in it is not bounded", len(e.Message))
	}
	if !strings.Contains(e.Message, strings.Repeat("d", 3000)) || strings.Contains(e.Message, "aaa") {
		t.Fatalf("the message does not end with the tail's last bytes: %.200q", e.Message)
	}
}

// A worker that dies serving carries its tail on the WORKER_EXITED of its request.
func TestStderrTailOnWorkerExit(t *testing.T) {
	p := start(t, pool.Options{StderrTailLines: pool.Set(3)})
	if n, err := pool.Call[map[string]any, int](bounded(t), p, "print", map[string]any{"stream": "stderr", "n": 5000}); err != nil || n != 5000 {
		t.Fatalf("print: %v %v", n, err)
	}
	_, err := pool.Call[map[string]int, any](bounded(t), p, "exit", map[string]int{"status": 7})
	var e *pool.Error
	if !errors.As(err, &e) || e.Code != proto.CodeWorkerExited {
		t.Fatalf("exit: %v, expected WORKER_EXITED", err)
	}
	want := []string{strings.Repeat("x", 4096) + " [...truncated]"}
	if !slices.Equal(e.StderrTail, want) {
		t.Fatalf("StderrTail %d lines: %.80q, expected one line of 4,096 x, marked", len(e.StderrTail), e.StderrTail)
	}
	if !strings.Contains(e.Message, want[0]) {
		t.Fatalf("the message %.200q does not carry the tail", e.Message)
	}
}

func TestStderrTailLinesNegativeRefused(t *testing.T) {
	_, err := pool.Start(bounded(t), pool.Options{Command: []string{workerBin}, StderrTailLines: pool.Set(-1)})
	var e *pool.Error
	if !errors.As(err, &e) || e.Code != proto.CodeInvalidArgument || !strings.Contains(string(e.Details), `"stderr_tail_lines"`) {
		t.Fatalf("StderrTailLines -1: %v, expected INVALID_ARGUMENT naming stderr_tail_lines", err)
	}
}
