package pool

import (
	"io"
	"log/slog"
	"runtime"
	"time"

	"github.com/wirepool/wirepool/go/proto"
)

// Options configure a pool (PROTOCOL.md section 22). Zero values take the spec's defaults
// (section 17).
type Options struct {
	Command           []string      // the worker program and its arguments (required)
	Env               []string      // extra environment (KEY=VALUE), added to the parent's
	Dir               string        // working directory of the workers
	Workers           int           // number of workers, 1 to 4,096 (default: the CPUs, runtime.NumCPU)
	MaxInFlight       int           // per worker (default 64), clamped to the HELLO's max_concurrency
	MaxFrameSize      int           // offered max_frame_size (default 4 MiB)
	InitialCredit     int           // stream credit per request (default 1 MiB)
	MaxMessageSize    int64         // default 1 GiB
	Heartbeat         time.Duration // PING interval and liveness clocks (8.5; default 1 s); NoHeartbeat turns them off
	StartupTimeout    time.Duration // HELLO within (default 10 s)
	CancelGrace       time.Duration // after CANCEL, the worker is killed past it (default 2 s)
	DeadlineGrace     time.Duration // the parent's own deadline is the caller's plus this (default 500 ms)
	DrainGrace        time.Duration // DRAIN's grace at Close and when recycling (default 10 s)
	GoodbyeGrace      time.Duration // after GOODBYE/EOF the worker is killed past it (default 1 s)
	RestartBackoff    time.Duration // first restart delay (default 10 ms), doubled up to RestartBackoffMax
	RestartBackoffMax time.Duration // default 5 s
	MaxRestarts       int           // restarts (crashes, hangs, failed starts) allowed within RestartWindow; one more death closes the pool (default 10)
	RestartWindow     time.Duration // default 60 s
	MaxRequests       int           // recycle a worker after this many requests (0: never)
	Require           []Requirement // methods every worker must offer, else Start fails CODEC_MISMATCH
	StderrTailLines   int           // last lines of each worker's stderr kept for Error.StderrTail, each cut to 4,096 bytes (default 20)
	Stdout            io.Writer     // the workers' stdout (default: discarded)
	Logger            *slog.Logger  // the pool's warnings (default slog.Default()): the max_in_flight clamp, once per pool (4.2)
	Remote            *Listener     // remote workers (21): each joins this listener with a single-use ticket instead of a socketpair (nil: local)
}

// NoHeartbeat, as Options.Heartbeat, turns PINGs and both liveness clocks off (heartbeat_ms 0):
// deadlines and the cancel grace still bound each request.
const NoHeartbeat time.Duration = -1

// Requirement is one method a pool requires of its workers: its name, kind and a codec it
// must accept.
type Requirement struct {
	Method string
	Kind   proto.MethodKind
	Codec  Codec
}

func (o *Options) validate() (Options, error) {
	v := *o
	bad := func(field, why string) (Options, error) {
		return v, withDetails(errorf(proto.CodeInvalidArgument, "%s %s", field, why), map[string]any{"field": field})
	}
	if len(v.Command) == 0 || v.Command[0] == "" {
		return bad("command", "must name a program")
	}
	ints := []struct {
		name   string
		v      *int
		def    int
		lo, hi int
	}{
		{"workers", &v.Workers, runtime.NumCPU(), 1, proto.MaxWorkers},
		{"max_in_flight", &v.MaxInFlight, proto.ParentDefaultMaxInFlight, 1, proto.MaxCount},
		{"max_frame_size", &v.MaxFrameSize, proto.ParentDefaultMaxFrameSize, proto.MinMaxFrameSize, proto.MaxMaxFrameSize},
		{"initial_credit", &v.InitialCredit, proto.ParentDefaultInitialCredit, 1, proto.MaxCredit},
		{"max_restarts", &v.MaxRestarts, proto.ParentDefaultMaxRestarts, 1, proto.MaxCount},
		{"max_requests", &v.MaxRequests, 0, 0, proto.MaxCount},
		{"stderr_tail_lines", &v.StderrTailLines, proto.ParentDefaultStderrTailLines, 1, proto.MaxCount},
	}
	for _, f := range ints {
		if *f.v < 0 || *f.v > f.hi {
			return bad(f.name, "out of range")
		}
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < f.lo {
			return bad(f.name, "out of range")
		}
	}
	if v.MaxMessageSize == 0 {
		v.MaxMessageSize = proto.ParentDefaultMaxMessageSize
	}
	if v.MaxMessageSize < int64(v.MaxFrameSize) || v.MaxMessageSize > proto.MaxSize {
		return bad("max_message_size", "out of range")
	}
	if v.Heartbeat == NoHeartbeat {
		v.Heartbeat = 0
	} else if v.Heartbeat == 0 {
		v.Heartbeat = time.Duration(proto.ParentDefaultHeartbeatMs) * time.Millisecond
	} else if v.Heartbeat < time.Millisecond {
		return bad("heartbeat", "out of range")
	}
	if v.Heartbeat > time.Duration(proto.MaxTimeoutMs)*time.Millisecond {
		return bad("heartbeat", "out of range")
	}
	durs := []struct {
		name string
		d    *time.Duration
		def  int
	}{
		{"startup_timeout", &v.StartupTimeout, proto.ParentDefaultStartupTimeoutMs},
		{"cancel_grace", &v.CancelGrace, proto.ParentDefaultCancelGraceMs},
		{"deadline_grace", &v.DeadlineGrace, proto.ParentDefaultDeadlineGraceMs},
		{"drain_grace", &v.DrainGrace, proto.ParentDefaultDrainGraceMs},
		{"goodbye_grace", &v.GoodbyeGrace, proto.ParentDefaultGoodbyeGraceMs},
		{"restart_backoff", &v.RestartBackoff, proto.ParentDefaultRestartBackoffMs},
		{"restart_backoff_max", &v.RestartBackoffMax, proto.ParentDefaultRestartBackoffMaxMs},
		{"restart_window", &v.RestartWindow, proto.ParentDefaultRestartWindowMs},
	}
	for _, d := range durs {
		if *d.d < 0 || *d.d > time.Duration(proto.MaxTimeoutMs)*time.Millisecond {
			return bad(d.name, "out of range")
		}
		if *d.d == 0 {
			*d.d = time.Duration(d.def) * time.Millisecond
		}
	}
	if v.RestartBackoff > v.RestartBackoffMax {
		return bad("restart_backoff", "is above restart_backoff_max")
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
