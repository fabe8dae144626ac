package pool

import (
	"time"

	"github.com/wirepool/wirepool/go/proto"
)

// Options configure a pool (PROTOCOL.md section 22). Zero values take the spec's defaults.
type Options struct {
	Command           []string      // the worker program and its arguments (required)
	Env               []string      // extra environment (KEY=VALUE), added to the parent's
	Dir               string        // working directory of the workers
	Workers           int           // number of workers (default 1)
	MaxInFlight       int           // per worker (default 64), clamped to the HELLO's max_concurrency
	MaxFrameSize      int           // offered max_frame_size (default 4 MiB)
	InitialCredit     int           // stream credit per request (default 1 MiB)
	MaxMessageSize    int64         // default 1 GiB
	StartupTimeout    time.Duration // HELLO within (default 10 s)
	CancelGrace       time.Duration // after CANCEL, the worker is killed past it (default 2 s)
	DrainGrace        time.Duration // DRAIN's grace at Close (default 10 s)
	GoodbyeGrace      time.Duration // after GOODBYE/EOF the worker is killed past it (default 1 s)
	RestartBackoff    time.Duration // first restart delay (default 10 ms), doubled up to RestartBackoffMax
	RestartBackoffMax time.Duration
}

func (o *Options) validate() (Options, error) {
	v := *o
	bad := func(field, why string) (Options, error) {
		return v, withDetails(errorf(proto.CodeInvalidArgument, "%s %s", field, why), map[string]any{"field": field})
	}
	if len(v.Command) == 0 || v.Command[0] == "" {
		return bad("command", "must name a program")
	}
	if v.Workers < 0 || v.Workers > proto.MaxCount {
		return bad("workers", "out of range")
	}
	if v.Workers == 0 {
		v.Workers = 1
	}
	if v.MaxInFlight < 0 || v.MaxInFlight > proto.MaxCount {
		return bad("max_in_flight", "out of range")
	}
	if v.MaxInFlight == 0 {
		v.MaxInFlight = proto.ParentDefaultMaxInFlight
	}
	if v.MaxFrameSize == 0 {
		v.MaxFrameSize = proto.ParentDefaultMaxFrameSize
	}
	if v.MaxFrameSize < proto.MinMaxFrameSize || v.MaxFrameSize > proto.MaxMaxFrameSize {
		return bad("max_frame_size", "out of range")
	}
	if v.InitialCredit == 0 {
		v.InitialCredit = proto.ParentDefaultInitialCredit
	}
	if v.InitialCredit < 1 || v.InitialCredit > proto.MaxCredit {
		return bad("initial_credit", "out of range")
	}
	if v.MaxMessageSize == 0 {
		v.MaxMessageSize = proto.ParentDefaultMaxMessageSize
	}
	if v.MaxMessageSize < int64(v.MaxFrameSize) || v.MaxMessageSize > proto.MaxSize {
		return bad("max_message_size", "out of range")
	}
	durs := []struct {
		name string
		d    *time.Duration
		def  int
	}{
		{"startup_timeout", &v.StartupTimeout, proto.ParentDefaultStartupTimeoutMs},
		{"cancel_grace", &v.CancelGrace, proto.ParentDefaultCancelGraceMs},
		{"drain_grace", &v.DrainGrace, proto.ParentDefaultDrainGraceMs},
		{"goodbye_grace", &v.GoodbyeGrace, proto.ParentDefaultGoodbyeGraceMs},
		{"restart_backoff", &v.RestartBackoff, proto.ParentDefaultRestartBackoffMs},
		{"restart_backoff_max", &v.RestartBackoffMax, proto.ParentDefaultRestartBackoffMaxMs},
	}
	for _, d := range durs {
		if *d.d < 0 || *d.d > time.Duration(proto.MaxTimeoutMs)*time.Millisecond {
			return bad(d.name, "out of range")
		}
		if *d.d == 0 {
			*d.d = time.Duration(d.def) * time.Millisecond
		}
	}
	return v, nil
}
