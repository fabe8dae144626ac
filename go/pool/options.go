package pool

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"time"

	"github.com/wirepool/wirepool/go/proto"
)

// Options configure a pool (PROTOCOL.md section 22). Every field may be left out: the zero
// value Options{Command: cmd} is a pool with the spec's defaults (section 17). A number is
// given with Set, an explicit zero included: Workers: pool.Set(0) is INVALID_ARGUMENT, and
// CancelGrace: pool.Set(time.Duration(0)) kills at once, where a field left unset takes its
// default.
type Options struct {
	Command []string // the worker program and its arguments (required)
	Env     []string // extra environment (KEY=VALUE), added to the parent's
	Dir     string   // working directory of the workers

	Workers        Optional[int]   // number of workers, 1 to 4,096 (default: the CPUs, runtime.NumCPU)
	MaxInFlight    Optional[int]   // per worker, 1 to 2^32-1 (default 64), clamped to the HELLO's max_concurrency
	MaxFrameSize   Optional[int]   // offered max_frame_size, 65,536 to 16 MiB (default 4 MiB)
	InitialCredit  Optional[int]   // stream credit per request, 1 to 2^31-1 (default 1 MiB)
	MaxMessageSize Optional[int64] // max_frame_size to 2^53-1 (default 1 GiB)

	Heartbeat      time.Duration           // PING interval and liveness clocks (8.5; 0: the default 1 s); NoHeartbeat turns them off
	StartupTimeout Optional[time.Duration] // HELLO within, 1 ms to max_timeout_ms (default 10 s)
	CancelGrace    Optional[time.Duration] // after CANCEL, the worker is killed past it (default 2 s)
	DeadlineGrace  Optional[time.Duration] // the parent's own deadline is the caller's plus this (default 500 ms)
	DrainGrace     Optional[time.Duration] // DRAIN's grace at Close and when recycling (default 10 s)
	GoodbyeGrace   Optional[time.Duration] // after GOODBYE/EOF the worker is killed past it (default 1 s)

	RestartBackoff    Optional[time.Duration] // first restart delay (default 10 ms), doubled up to RestartBackoffMax
	RestartBackoffMax Optional[time.Duration] // default 5 s
	MaxRestarts       Optional[int]           // restarts (crashes, hangs, failed starts) allowed within RestartWindow, 0 to 2^32-1; one more death closes the pool (default 10)
	RestartWindow     Optional[time.Duration] // 1 ms to max_timeout_ms (default 60 s)

	// Recycling: a worker past one of these is drained (its requests finish) while its
	// replacement starts, so recycling fails no request; each recycle is logged on Logger
	// (Debug, with its slot, pid and reason). Unset: never. A leased worker is not recycled
	// while leased.
	MaxRequests Optional[int]           // after this many requests, 1 to 2^53-1
	MaxRSSBytes Optional[int64]         // when its resident set (/proc/PID/statm) is above this many bytes, 1 to 2^53-1; read every 250 ms
	MaxIdle     Optional[time.Duration] // after this long without a request in flight, 1 ms to max_timeout_ms; a worker that never served one is kept

	// Retry sends idempotent requests again after their worker died (PROTOCOL.md 21.7);
	// nil: never.
	Retry *RetryPolicy

	Require         []Requirement // methods every worker must offer, else Start fails CODEC_MISMATCH
	StderrTailLines Optional[int] // last lines of each worker's stderr kept for Error.StderrTail, each cut to 4,096 bytes, 0 to 2^32-1 (default 20)
	Stdout          io.Writer     // the workers' stdout (default: discarded)
	Logger          *slog.Logger  // the pool's warnings and recycles (default slog.Default()): the max_in_flight clamp, once per pool (4.2)
	Remote          *Listener     // remote workers (21): each joins this listener with a single-use ticket instead of a socketpair (nil: local)
}

// Optional is an option that may be left unset: its zero value is unset (the default
// applies), Set gives it a value, zero included.
//
// Why a type of its own: Options is a plain struct literal whose zero value must work, and an
// explicit 0 must still be told apart (PROTOCOL.md 22.2 refuses Workers 0 where "unset" means
// the CPUs, and MaxRestarts 0 or CancelGrace 0 are values of their own). Pointers (the AWS and
// protobuf style, aws.Int(0)) say the same but alias the caller's variable and need a helper
// per type; a sentinel (-1 for "none") takes a number out of the range and differs per field;
// a list of field names forced to be sent (google.golang.org/api's ForceSendFields) is typed by
// strings. Optional is database/sql's Null[T] shape, made by one generic constructor:
// Options{Workers: pool.Set(4)}. Type inference takes T from the argument, so an int64 or
// Duration field wants a typed value: MaxRSSBytes: pool.Set[int64](1 << 30).
type Optional[T any] struct {
	v   T
	set bool
}

// Set is an Optional holding v.
func Set[T any](v T) Optional[T] { return Optional[T]{v: v, set: true} }

// Get is the value and whether one was set.
func (o Optional[T]) Get() (T, bool) { return o.v, o.set }

// NoHeartbeat, as Options.Heartbeat, turns PINGs and both liveness clocks off (heartbeat_ms 0):
// deadlines and the cancel grace still bound each request.
const NoHeartbeat time.Duration = -1

// RetryPolicy names the methods that are safe to run twice (PROTOCOL.md 21.7). A call or
// stream of one of them (or made with Idempotent(true)) that ends WORKER_EXITED or
// WORKER_HUNG, and no other code (a handler's error, a deadline, a cancel, a protocol
// violation is the answer), is sent again as a new request, to another worker when one has
// room (else the replacement, which comes after the restart backoff: there is no backoff of
// its own, as in the Rust, Python and Node parents), up to Attempts tries in all, within what
// is left of the call's deadline, the wait for a worker included. A stream is sent again only
// while none of its rows has reached the caller. The caller sees the last attempt's outcome,
// its details holding "attempts" (when they are a JSON object or empty), or CANCELLED when it
// cancelled ctx while a retry waited for a worker; Stats.Retries counts the requests sent
// again. Calls through a Lease are never sent again (their worker is the point).
type RetryPolicy struct {
	Methods  []string      // the idempotent methods
	Attempts Optional[int] // tries in all, the first included: 1 to 100 (default 3)
}

// DefaultRetryAttempts is RetryPolicy.Attempts when unset (as the other parents').
const DefaultRetryAttempts = 3

// MaxRetryAttempts is the most RetryPolicy.Attempts takes (22.2 retry_attempts).
const MaxRetryAttempts = 100

// Requirement is one method a pool requires of its workers: its name, kind and a codec it
// must accept.
type Requirement struct {
	Method string
	Kind   proto.MethodKind
	Codec  Codec
}

// settings is Options validated, every default applied: what a pool reads. The fields below
// shadow Options' Optionals of the same names with their resolved values, so the pool reads
// p.opts.Workers as an int; the embedded Options keeps every other field (Command, Env, ...)
// reachable by its own name.
type settings struct {
	Options
	Workers           int
	MaxInFlight       int
	MaxFrameSize      int
	InitialCredit     int
	MaxMessageSize    int64
	StartupTimeout    time.Duration
	CancelGrace       time.Duration
	DeadlineGrace     time.Duration
	DrainGrace        time.Duration
	GoodbyeGrace      time.Duration
	RestartBackoff    time.Duration
	RestartBackoffMax time.Duration
	MaxRestarts       int
	RestartWindow     time.Duration
	MaxRequests       int           // 0: never
	MaxRSSBytes       int64         // 0: never
	MaxIdle           time.Duration // 0: never
	StderrTailLines   int
	RetryMethods      map[string]bool
	RetryAttempts     int // 0: no retry policy
}

func (o *Options) validate() (settings, error) {
	v := settings{Options: *o}
	bad := func(field, why string) (settings, error) {
		return v, withDetails(errorf(proto.CodeInvalidArgument, "%s %s", field, why), map[string]any{"field": field})
	}
	if len(o.Command) == 0 || o.Command[0] == "" {
		return bad("command", "must name a program")
	}
	ints := []struct {
		name   string
		opt    Optional[int]
		out    *int
		def    int
		lo, hi int
	}{
		{"workers", o.Workers, &v.Workers, runtime.NumCPU(), 1, proto.MaxWorkers},
		{"max_in_flight", o.MaxInFlight, &v.MaxInFlight, proto.ParentDefaultMaxInFlight, 1, proto.MaxCount},
		{"max_frame_size", o.MaxFrameSize, &v.MaxFrameSize, proto.ParentDefaultMaxFrameSize, proto.MinMaxFrameSize, proto.MaxMaxFrameSize},
		{"initial_credit", o.InitialCredit, &v.InitialCredit, proto.ParentDefaultInitialCredit, 1, proto.MaxCredit},
		{"max_restarts", o.MaxRestarts, &v.MaxRestarts, proto.ParentDefaultMaxRestarts, 0, proto.MaxCount},
		{"max_requests", o.MaxRequests, &v.MaxRequests, 0, 1, proto.MaxSize},
		{"stderr_tail_lines", o.StderrTailLines, &v.StderrTailLines, proto.ParentDefaultStderrTailLines, 0, proto.MaxCount},
	}
	for _, f := range ints {
		n, set := f.opt.Get()
		if !set {
			*f.out = f.def
			continue
		}
		if n < f.lo || n > f.hi {
			return bad(f.name, fmt.Sprintf("%d out of range %d-%d", n, f.lo, f.hi))
		}
		*f.out = n
	}
	v.MaxMessageSize = proto.ParentDefaultMaxMessageSize
	if n, set := o.MaxMessageSize.Get(); set {
		v.MaxMessageSize = n
	}
	if v.MaxMessageSize < int64(v.MaxFrameSize) || v.MaxMessageSize > proto.MaxSize {
		return bad("max_message_size", fmt.Sprintf("%d out of range max_frame_size (%d)-%d", v.MaxMessageSize, v.MaxFrameSize, proto.MaxSize))
	}
	if n, set := o.MaxRSSBytes.Get(); set {
		if n < 1 || n > proto.MaxSize {
			return bad("max_rss_bytes", fmt.Sprintf("%d out of range 1-%d", n, proto.MaxSize))
		}
		v.MaxRSSBytes = n
	}
	maxDur := time.Duration(proto.MaxTimeoutMs) * time.Millisecond
	if v.Heartbeat == NoHeartbeat {
		v.Heartbeat = 0
	} else if v.Heartbeat == 0 {
		v.Heartbeat = time.Duration(proto.ParentDefaultHeartbeatMs) * time.Millisecond
	} else if v.Heartbeat < time.Millisecond || v.Heartbeat > maxDur {
		return bad("heartbeat", fmt.Sprintf("%v out of range 1 ms-%d ms (NoHeartbeat: off)", v.Heartbeat, proto.MaxTimeoutMs))
	}
	durs := []struct {
		name string
		opt  Optional[time.Duration]
		out  *time.Duration
		def  time.Duration
		lo   time.Duration
	}{
		{"startup_timeout", o.StartupTimeout, &v.StartupTimeout, ms(proto.ParentDefaultStartupTimeoutMs), time.Millisecond},
		{"cancel_grace", o.CancelGrace, &v.CancelGrace, ms(proto.ParentDefaultCancelGraceMs), 0},
		{"deadline_grace", o.DeadlineGrace, &v.DeadlineGrace, ms(proto.ParentDefaultDeadlineGraceMs), 0},
		{"drain_grace", o.DrainGrace, &v.DrainGrace, ms(proto.ParentDefaultDrainGraceMs), 0},
		{"goodbye_grace", o.GoodbyeGrace, &v.GoodbyeGrace, ms(proto.ParentDefaultGoodbyeGraceMs), 0},
		{"restart_backoff", o.RestartBackoff, &v.RestartBackoff, ms(proto.ParentDefaultRestartBackoffMs), 0},
		{"restart_backoff_max", o.RestartBackoffMax, &v.RestartBackoffMax, ms(proto.ParentDefaultRestartBackoffMaxMs), 0},
		{"restart_window", o.RestartWindow, &v.RestartWindow, ms(proto.ParentDefaultRestartWindowMs), time.Millisecond},
		{"max_idle", o.MaxIdle, &v.MaxIdle, 0, time.Millisecond},
	}
	for _, d := range durs {
		n, set := d.opt.Get()
		if !set {
			*d.out = d.def
			continue
		}
		if n < d.lo || n > maxDur {
			return bad(d.name, fmt.Sprintf("%v out of range %v-%d ms", n, d.lo, proto.MaxTimeoutMs))
		}
		*d.out = n
	}
	if v.RestartBackoff > v.RestartBackoffMax {
		return bad("restart_backoff", "is above restart_backoff_max")
	}
	if r := o.Retry; r != nil {
		v.RetryAttempts = DefaultRetryAttempts
		if n, set := r.Attempts.Get(); set {
			if n < 1 || n > MaxRetryAttempts {
				return bad("retry_attempts", fmt.Sprintf("%d out of range 1-%d (tries in all, the first included)", n, MaxRetryAttempts))
			}
			v.RetryAttempts = n
		}
		v.RetryMethods = make(map[string]bool, len(r.Methods))
		for _, m := range r.Methods {
			v.RetryMethods[m] = true
		}
	}
	if v.Logger == nil {
		v.Logger = slog.Default()
	}
	for _, r := range v.Require {
		if r.Method == "" || (r.Kind != proto.KindUnary && r.Kind != proto.KindStream) {
			return bad("require", "names a method with its kind, unary or stream")
		}
	}
	return v, nil
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }
