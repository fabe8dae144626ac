package pool

import (
	"encoding/json"
	"fmt"

	"github.com/wirepool/wirepool/go/proto"
)

// Error is every error the pool returns for a call: a section 3 code, its message and the
// details JSON the worker or the parent attached (nil when none).
//
// When a worker process ended (WORKER_EXITED, WORKER_HUNG, STARTUP_TIMEOUT, a failed start,
// LEASE_LOST for a dead leased worker), StderrTail holds the last Options.StderrTailLines
// lines it wrote to stderr, oldest first, each cut to 4,096 bytes (marked " [...truncated]");
// Message quotes the tail's end, at most one cut line's worth (4,111 bytes), and Details'
// "stderr_tail" the whole tail joined by newlines. It is nil otherwise.
type Error struct {
	Code       proto.ErrorCode
	Message    string
	Details    json.RawMessage
	StderrTail []string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("wirepool: %s", e.Code)
	}
	return fmt.Sprintf("wirepool: %s: %s", e.Code, e.Message)
}

// Is matches another *Error with the same Code: errors.Is(err, &pool.Error{Code: proto.CodeCancelled}).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

func errorf(code proto.ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func withDetails(e *Error, d map[string]any) *Error {
	if b, err := json.Marshal(d); err == nil {
		e.Details = b
	}
	return e
}

// quote is a caller's string in an error message: quoted, cut to proto.QuotedMaxChars
// characters, saying how long it was when cut (22.4).
func quote(s string) string {
	r := []rune(s)
	if len(r) <= proto.QuotedMaxChars {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d characters)", string(r[:proto.QuotedMaxChars]), len(r))
}
