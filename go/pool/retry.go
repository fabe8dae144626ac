package pool

import (
	"encoding/json"

	"github.com/wirepool/wirepool/go/proto"
)

// Idempotent marks this call or stream safe to run twice (true: retried as a method of
// Options.Retry is; false: never sent again, even for a listed method). Idempotent(true) on a
// pool without Options.Retry is INVALID_ARGUMENT (as the Python and Node parents): the policy
// says how many tries. Calls through a Lease are never sent again.
func Idempotent(yes bool) CallOption {
	return func(o *callOpts) { o.idempotent, o.hasIdempotent = yes, true }
}

// testHookRetrying, set by the tests alone, runs before a retry's request is sent (before its
// wait for a worker).
var testHookRetrying func()

// retryLimit is the tries in all a call of method through t gets (1: never sent again,
// PROTOCOL.md 21.7), and the pool that counts them.
func retryLimit(t Target, method string, o *callOpts) (int, *Pool, error) {
	s := t.options()
	if o.hasIdempotent && o.idempotent && s.RetryAttempts == 0 {
		return 0, nil, withDetails(errorf(proto.CodeInvalidArgument,
			"idempotent: Idempotent(true) needs the pool's retry policy (Options.Retry)"), map[string]any{"field": "idempotent"})
	}
	p, ok := t.(*Pool)
	switch {
	case !ok, o.hasIdempotent && !o.idempotent:
		return 1, nil, nil
	case o.hasIdempotent, s.RetryMethods[method]:
		return s.RetryAttempts, p, nil
	}
	return 1, nil, nil
}

// retryable: the request ended with its worker's death as seen by this parent (WORKER_EXITED
// or WORKER_HUNG), not an ERROR the worker sent with one of those codes: nothing else is
// retried (21.7; a handler's error, a deadline, a cancel or a violation is the answer).
func retryable(r reply) bool {
	return r.died && r.err != nil && (r.err.Code == proto.CodeWorkerExited || r.err.Code == proto.CodeWorkerHung)
}

// withAttempts is e with the number of tries in its details ("attempts"), when they are a JSON
// object or empty; a copy, since a dead worker's error is shared by all its requests.
func withAttempts(e *Error, tries int) *Error {
	d := map[string]any{}
	if len(e.Details) > 0 && json.Unmarshal(e.Details, &d) != nil {
		return e
	}
	d["attempts"] = tries
	c := *e
	c.Details = nil
	return withDetails(&c, d)
}
