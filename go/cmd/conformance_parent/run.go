package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

// scenario is one scenario being run: its settings, pool options and context.
type scenario struct {
	s       *suite
	sc      obj
	cfg     obj
	opts    pool.Options
	ctx     context.Context // ends at the scenario's timeout_s
	notices notices         // the pools' warnings, clamp notices counted
}

func (x *scenario) settle() time.Duration { return dur(x.s.setting(x.sc, "settle_s")) }

// callCtx is a context for one call: cancelled (not expired) when the scenario times out, so
// a request's deadline is only its own call_timeout_s.
func (x *scenario) callCtx(timeout any) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(x.ctx))
	stop := context.AfterFunc(x.ctx, cancel)
	if timeout != nil {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeout(ctx, dur(timeout))
		return ctx, func() { c2(); stop(); cancel() }
	}
	return ctx, func() { stop(); cancel() }
}

// sleep waits d, or less when the scenario times out.
func (x *scenario) sleep(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-x.ctx.Done():
		return x.ctx.Err()
	}
}

// waitFor polls done (the pool's own accounting) up to bound.
func (x *scenario) waitFor(bound time.Duration, done func() bool) bool {
	deadline := time.Now().Add(bound)
	for !done() {
		if time.Now().After(deadline) || x.ctx.Err() != nil {
			return false
		}
		time.Sleep(2 * time.Millisecond) // polling the pool's counters, bounded by the deadline
	}
	return true
}

func (x *scenario) method() (string, pool.Codec, any, error) {
	c, err := codecOf(str(x.sc, "codec"))
	if err != nil {
		return "", 0, nil, err
	}
	body, err := request(x.sc["request"])
	return str(x.sc, "method"), c, body, err
}

func (x *scenario) call(t pool.Target, method string, c pool.Codec, body any, timeout any) (any, error) {
	ctx, cancel := x.callCtx(timeout)
	defer cancel()
	return pool.Call[any, any](ctx, t, method, body, pool.WithCodec(c))
}

func (x *scenario) stream(t pool.Target, method string, c pool.Codec, body any, timeout any) (*reader, func(), error) {
	ctx, cancel := x.callCtx(timeout)
	st, err := pool.Stream[any, any, any](ctx, t, method, body, pool.WithCodec(c))
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return &reader{s: st, shape: shapeOf(x.expect())}, func() { st.Close(); cancel() }, nil
}

func (x *scenario) expect() obj { e, _ := x.sc["expect"].(obj); return e }

func (x *scenario) start(opts pool.Options) (*pool.Pool, error) {
	startup, _ := opts.StartupTimeout.Get()
	ctx, cancel := context.WithTimeout(x.ctx, startup+30*time.Second)
	defer cancel()
	return pool.Start(ctx, opts)
}

func closePool(p *pool.Pool, grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace+15*time.Second)
	defer cancel()
	_ = p.Close(ctx)
}

type snap struct {
	pids     []int
	restarts int
}

func snapshot(p *pool.Pool) snap {
	st := p.Stats()
	var pids []int
	for _, w := range st.Workers {
		pids = append(pids, w.Pid)
	}
	slices.Sort(pids)
	return snap{pids, st.Restarts}
}

// run runs one scenario in a fresh directory of its own.
func (s *suite) run(ctx context.Context, sc obj, worker []string) (string, error) {
	tmp, err := os.MkdirTemp("", "wirepool-scenario-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cfg := s.poolConfig(sc)
	x := &scenario{s: s, sc: sc, cfg: cfg, ctx: ctx, opts: options(cfg, worker, workerEnv(sc, tmp)), notices: newNotices()}
	x.opts.Logger = slog.New(x.notices)
	switch str(sc, "kind") {
	case "startup":
		return x.startup()
	case "shutdown_in_flight":
		return x.shutdownInFlight()
	}
	procs := map[string]func(*pool.Pool) (string, error){
		"call": x.callScenario, "stream": x.streamScenario, "cancel_stream": x.cancelStream,
		"cancel_call": x.cancelCall, "slow_consumer": x.slowConsumer, "concurrent": x.concurrent,
		"parallel_calls": x.parallelCalls, "lease": x.lease, "any_outcome": x.anyOutcome,
	}
	proc, ok := procs[str(sc, "kind")]
	if !ok {
		return "", failf("unknown scenario kind %q", str(sc, "kind"))
	}
	p, err := x.start(x.opts)
	if err != nil {
		return "", failf("the pool did not start: %v", err)
	}
	defer closePool(p, time.Second)
	before := snapshot(p)
	d, err := proc(p)
	if err != nil {
		return d, err
	}
	if err := x.after(p, before); err != nil {
		return d, err
	}
	return d, x.checkClampNotices()
}

// after is what every scenario checks once its outcome is in.
func (x *scenario) after(p *pool.Pool, before snap) error {
	settle := x.settle()
	if !x.waitFor(settle, func() bool { return p.InFlight() == 0 }) {
		return failf("%d request(s) still in flight at the pool %vs after the outcome: no terminal from the worker", p.InFlight(), settle.Seconds())
	}
	h := x.s.health
	c, err := codecOf(str(h, "codec"))
	if err != nil {
		return err
	}
	body, err := request(h["request"])
	if err != nil {
		return err
	}
	retryUntil := time.Now()
	if str(x.sc, "kind") == "any_outcome" {
		retryUntil = retryUntil.Add(settle)
	}
	hexp, _ := h["expect"].(obj)
	for {
		result, cerr := x.call(p, str(h, "method"), c, body, nil)
		err := x.s.checkCall(hexp, body, result, cerr)
		if err == nil {
			break
		}
		if time.Now().After(retryUntil) {
			return failf("the pool no longer serves: %s: %v", str(h, "method"), err)
		}
		if x.sleep(50*time.Millisecond) != nil {
			return failf("the pool no longer serves: %s: %v", str(h, "method"), err)
		}
	}
	now := snapshot(p)
	switch x.s.setting(x.sc, "restarted") {
	case false:
		if !slices.Equal(now.pids, before.pids) || now.restarts != before.restarts {
			return failf("the worker was replaced (pids %v -> %v, restarts %d -> %d)", before.pids, now.pids, before.restarts, now.restarts)
		}
	case true:
		for _, pid := range now.pids {
			if slices.Contains(before.pids, pid) {
				return failf("expected the worker to be replaced, pids %v -> %v", before.pids, now.pids)
			}
		}
	}
	return x.checkLiveWorkers(integer(x.cfg["workers"]))
}

const liveHold = 500 * time.Millisecond // live_workers: the count must hold this long

// checkLiveWorkers: with live_workers (true, or a count overriding want), within settle_s our
// live children number exactly want and keep that number for liveHold.
func (x *scenario) checkLiveWorkers(want int) error {
	setting := x.s.setting(x.sc, "live_workers")
	switch v := setting.(type) {
	case nil:
		return nil
	case bool:
		if !v {
			return nil
		}
	default:
		want = integer(v)
	}
	settle := x.settle()
	var since time.Time
	held := func() bool {
		if len(liveChildren()) != want {
			since = time.Time{}
			return false
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) >= liveHold
	}
	deadline := time.Now().Add(settle + liveHold)
	for !held() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // polling /proc, bounded by the deadline
	}
	if !held() {
		live := liveChildren()
		return failf("%d live worker processes %v %vs after the outcome, expected %d (for %v)", len(live), live, settle.Seconds(), want, liveHold)
	}
	return nil
}

func (x *scenario) callScenario(p *pool.Pool) (string, error) {
	method, c, body, err := x.method()
	if err != nil {
		return "", err
	}
	expect := x.expect()
	started := time.Now()
	result, cerr := x.call(p, method, c, body, x.sc["call_timeout_s"])
	elapsed := time.Since(started)
	if err := x.s.checkCall(expect, body, result, cerr); err != nil {
		return "", err
	}
	if err := checkElapsed(expect, elapsed); err != nil {
		return "", err
	}
	if lim, ok := expect["max_rss_after_mb"]; ok {
		if err := x.checkRSSAfter(num(lim)); err != nil {
			return "", err
		}
		runtime.KeepAlive(cerr)
		runtime.KeepAlive(result)
	}
	if cerr != nil {
		return fmt.Sprintf("error %v in %.3fs", cerr, elapsed.Seconds()), nil
	}
	return fmt.Sprintf("result %s in %.3fs", describe(result), elapsed.Seconds()), nil
}

// checkRSSAfter: while the outcome is still held, the runner's RSS comes back under limit
// within settle_s (garbage collected first): an error must not pin the dead worker's buffers.
func (x *scenario) checkRSSAfter(limit float64) error {
	settle := x.settle()
	deadline := time.Now().Add(settle)
	for {
		runtime.GC()
		debugFree()
		if rss("VmRSS") <= limit {
			return nil
		}
		if time.Now().After(deadline) {
			return failf("the runner still holds %.0f MB %vs after the outcome (bound %v MB): the outcome keeps buffers alive", rss("VmRSS"), settle.Seconds(), limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (x *scenario) streamScenario(p *pool.Pool) (string, error) {
	method, c, body, err := x.method()
	if err != nil {
		return "", err
	}
	expect := x.expect()
	started := time.Now()
	r, done, err := x.stream(p, method, c, body, x.sc["call_timeout_s"])
	if err != nil {
		return "", failf("the stream could not start: %v", err)
	}
	defer done()
	if pause, ok := x.sc["pause"].([]any); ok && len(pause) == 2 {
		if err := r.read(int64(integer(pause[0]))); err != nil {
			return "", err
		}
		if err := x.sleep(dur(pause[1])); err != nil {
			return "", err
		}
	}
	if err := r.read(-1); err != nil {
		return "", err
	}
	elapsed := time.Since(started)
	d, err := x.s.checkStream(expect, r)
	if err != nil {
		return "", err
	}
	if err := checkElapsed(expect, elapsed); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s in %.3fs", d, elapsed.Seconds()), nil
}

func (x *scenario) cancelStream(p *pool.Pool) (string, error) {
	method, c, body, err := x.method()
	if err != nil {
		return "", err
	}
	want := int64(integer(x.sc["read_rows"]))
	r, done, err := x.stream(p, method, c, body, nil)
	if err != nil {
		return "", failf("the stream could not start: %v", err)
	}
	defer done()
	if err := r.read(want); err != nil {
		return "", err
	}
	if r.ended {
		return "", failf("the endless stream ended after %d rows (%s)", r.count, r.terminalText())
	}
	if err := x.sleep(dur(x.sc["pause_s"])); err != nil {
		return "", err
	}
	r.s.Close() // how a Go caller cancels a stream
	return fmt.Sprintf("cancelled after %d rows", want), nil
}

func (x *scenario) cancelCall(p *pool.Pool) (string, error) {
	method, c, body, err := x.method()
	if err != nil {
		return "", err
	}
	ctx, cancel := x.callCtx(nil)
	defer cancel()
	type outcome struct {
		v   any
		err error
	}
	ch := make(chan outcome, 1)
	go func() {
		v, err := pool.Call[any, any](ctx, p, method, body, pool.WithCodec(c))
		ch <- outcome{v, err}
	}()
	var early *outcome
	x.waitFor(x.settle(), func() bool {
		if p.InFlight() >= 1 {
			return true
		}
		select {
		case o := <-ch:
			early = &o
			return true
		default:
			return false
		}
	})
	if early != nil {
		if early.err != nil {
			return "", failf("the call ended with %v before it was cancelled", early.err)
		}
		return "", failf("the call returned %s instead of being cancelled", describe(early.v))
	}
	if p.InFlight() < 1 {
		cancel()
		<-ch
		return "", failf("the call was not in flight within %vs", x.settle().Seconds())
	}
	cancel() // how a Go caller cancels a call
	o := <-ch
	if code(o.err) != proto.CodeCancelled {
		if o.err != nil {
			return "", failf("the call ended with %v instead of CANCELLED", o.err)
		}
		return "", failf("the call returned %s instead of being cancelled", describe(o.v))
	}
	return "cancelled while in flight", nil
}

func (x *scenario) slowConsumer(p *pool.Pool) (string, error) {
	method, c, body, err := x.method()
	if err != nil {
		return "", err
	}
	bound := int64(integer(x.sc["max_ahead_rows"]))
	r, done, err := x.stream(p, method, c, body, nil)
	if err != nil {
		return "", failf("the stream could not start: %v", err)
	}
	defer done()
	var worst int64
	checkpoints, _ := x.sc["checkpoints"].([]any)
	for _, cp := range checkpoints {
		pair, _ := cp.([]any)
		if len(pair) != 2 {
			return "", failf("a checkpoint is [row, seconds]: %v", cp)
		}
		until := int64(integer(pair[0]))
		if err := r.read(until); err != nil {
			return "", err
		}
		if r.ended {
			return "", failf("the stream ended after %d rows, before checkpoint %d (%s)", r.count, until, r.terminalText())
		}
		if err := x.sleep(dur(pair[1])); err != nil {
			return "", err
		}
		v, err := x.call(p, "raw_rows_produced", pool.JSON, nil, nil)
		if err != nil {
			return "", failf("raw_rows_produced: %v", err)
		}
		produced := int64(num(v))
		ahead := max(0, produced-r.count)
		worst = max(worst, ahead)
		if ahead > bound {
			return "", failf("the worker produced %d rows while the consumer had read %d: %d ahead, more than the %d flow control allows", produced, r.count, ahead, bound)
		}
	}
	if err := r.read(-1); err != nil {
		return "", err
	}
	d, err := x.s.checkStream(x.expect(), r)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s; producer at most %d rows ahead (bound %d)", d, worst, bound), nil
}

// all runs fns at once and returns the first failure with the count.
func all(fns []func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, f := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f()
		}()
	}
	wg.Wait()
	var bad []error
	for _, e := range errs {
		if e != nil {
			bad = append(bad, e)
		}
	}
	if len(bad) > 0 {
		return failf("%d of %d failed; first: %v", len(bad), len(fns), bad[0])
	}
	return nil
}

func (x *scenario) concurrent(p *pool.Pool) (string, error) {
	calls, streams, rows := integer(x.sc["calls"]), integer(x.sc["streams"]), integer(x.sc["stream_rows"])
	var fns []func() error
	for i := range calls {
		fns = append(fns, func() error {
			got, err := x.call(p, "add", pool.JSON, obj{"a": i, "b": 2 * i}, nil)
			if err != nil {
				return fmt.Errorf("add #%d: %w", i, err)
			}
			if !same(obj{"sum": 3 * i}, got) {
				return fmt.Errorf("add #%d returned %s", i, describe(got))
			}
			return nil
		})
	}
	for k := range streams {
		fns = append(fns, func() error {
			n := int64(rows + k)
			ctx, cancel := x.callCtx(nil)
			defer cancel()
			st, err := pool.Stream[any, any, any](ctx, p, "decls", obj{"n": n}, pool.WithCodec(pool.JSON))
			if err != nil {
				return fmt.Errorf("stream #%d: %w", k, err)
			}
			r := &reader{s: st, shape: shape{name: "decl"}}
			if err := r.read(-1); err != nil {
				return fmt.Errorf("stream #%d: %w", k, err)
			}
			if r.count != n || r.err != nil || !same(obj{"rows": n}, st.Summary()) {
				return fmt.Errorf("stream #%d: %d of %d rows, %s", k, r.count, n, r.terminalText())
			}
			return nil
		})
	}
	if err := all(fns); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d calls and %d streams at once, all correct", calls, streams), nil
}

func (x *scenario) parallelCalls(p *pool.Pool) (string, error) {
	method, c, body, err := x.method()
	if err != nil {
		return "", err
	}
	n := integer(x.sc["count"])
	var fns []func() error
	for k := range n {
		fns = append(fns, func() error {
			v, err := x.call(p, method, c, body, x.sc["call_timeout_s"])
			if cerr := x.s.checkCall(x.expect(), body, v, err); cerr != nil {
				return fmt.Errorf("call #%d: %w", k, cerr)
			}
			return nil
		})
	}
	if err := all(fns); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d calls at once, all as expected", n), nil
}

func (x *scenario) lease(p *pool.Pool) (string, error) {
	calls := integer(x.sc["calls"])
	var allowed []proto.ErrorCode
	codes, _ := x.sc["crash_codes"].([]any)
	for _, c := range codes {
		code, err := x.s.code(c)
		if err != nil {
			return "", err
		}
		allowed = append(allowed, code)
	}
	ctx, cancel := x.callCtx(nil)
	defer cancel()
	held, err := p.Lease(ctx)
	if err != nil {
		return "", failf("lease: %v", err)
	}
	defer held.Release()
	pid := held.Pid()
	for k := range calls {
		got, err := x.call(held, "whoami", pool.JSON, nil, nil)
		if err != nil {
			return "", failf("call #%d on the lease: %v", k, err)
		}
		if !same(pid, got) {
			return "", failf("call #%d on the lease of pid %d was served by pid %s", k, pid, describe(got))
		}
	}
	other, err := x.call(p, "whoami", pool.JSON, nil, nil)
	if err != nil {
		return "", failf("a pool call beside the lease: %v", err)
	}
	if same(pid, other) {
		return "", failf("a pool call was served by the leased worker %d", pid)
	}
	_, crashed := x.call(held, "crash", pool.JSON, nil, nil)
	if !slices.Contains(allowed, code(crashed)) {
		return "", failf("crash on the lease ended with %v, expected one of %v", crashed, codes)
	}
	v, lost := x.call(held, "add", pool.JSON, obj{"a": 1, "b": 2}, nil)
	if lost == nil {
		return "", failf("a call on the lost lease returned %s", describe(v))
	}
	if code(lost) != proto.CodeLeaseLost {
		return "", failf("a call on the lost lease failed with %v, expected LEASE_LOST", lost)
	}
	var le, ce *pool.Error
	errors.As(lost, &le)
	errors.As(crashed, &ce)
	for _, k := range []string{"signal", "exit_status", "stderr_tail"} {
		a, _ := detail(le, k)
		b, _ := detail(ce, k)
		if !same(a, b) {
			return "", failf("LEASE_LOST %s %s differs from the crash's %s", k, describe(a), describe(b))
		}
	}
	return fmt.Sprintf("%d calls on pid %d; crash -> %d; then LEASE_LOST", calls, pid, code(crashed)), nil
}

func (x *scenario) anyOutcome(p *pool.Pool) (string, error) {
	method, c, body, err := x.method()
	if err != nil {
		return "", err
	}
	timeout := x.sc["call_timeout_s"]
	started := time.Now()
	calls, streams := integer(x.sc["calls"]), integer(x.sc["streams"])
	outcomes := make([]string, calls+streams)
	var fns []func() error
	for i := range calls {
		fns = append(fns, func() error {
			_, err := x.call(p, method, c, body, timeout)
			outcomes[i] = "a result"
			if err != nil {
				var e *pool.Error
				if !errors.As(err, &e) {
					return fmt.Errorf("call #%d: not a wirepool error: %v", i, err)
				}
				outcomes[i] = fmt.Sprintf("error %d", e.Code)
			}
			return nil
		})
	}
	for k := range streams {
		fns = append(fns, func() error {
			ctx, cancel := x.callCtx(timeout)
			defer cancel()
			st, err := pool.Stream[any, any, any](ctx, p, str(x.sc, "stream_method"), body, pool.WithCodec(c))
			if err != nil {
				outcomes[calls+k] = fmt.Sprintf("error %d at the start", code(err))
				return nil
			}
			r := &reader{s: st, shape: shape{name: "unchecked"}}
			if err := r.read(-1); err != nil {
				return fmt.Errorf("stream #%d: %w", k, err)
			}
			text := r.terminalText()
			if len(text) > 80 {
				text = text[:80]
			}
			outcomes[calls+k] = fmt.Sprintf("%d rows, %s", r.count, text)
			return nil
		})
	}
	if err := all(fns); err != nil {
		return "", err
	}
	if err := checkElapsed(x.expect(), time.Since(started)); err != nil {
		return "", err
	}
	return fmt.Sprint(outcomes), nil
}

func (x *scenario) startup() (string, error) {
	opts := x.opts
	reqs, _ := x.sc["require"].([]any)
	for _, r := range reqs {
		m, _ := r.(obj)
		c, err := codecOf(str(m, "codec"))
		if err != nil {
			return "", err
		}
		kind := proto.KindUnary
		if str(m, "kind") == "stream" {
			kind = proto.KindStream
		}
		opts.Require = append(opts.Require, pool.Requirement{Method: str(m, "method"), Kind: kind, Codec: c})
	}
	expect := x.expect()
	started := time.Now()
	p, err := x.start(opts)
	if err != nil {
		elapsed := time.Since(started)
		want, ok := expect["error"].(obj)
		if !ok {
			return "", failf("the pool did not start: %v", err)
		}
		if err := x.s.checkError(want, err); err != nil {
			return "", err
		}
		if err := checkElapsed(expect, elapsed); err != nil {
			return "", err
		}
		if err := x.checkLiveWorkers(0); err != nil {
			return "", err
		}
		if x.sc["then_start"] == true {
			again, err2 := x.start(x.opts)
			if err2 != nil {
				return "", failf("refused at start-up as expected (%v), but the next pool failed: %v", err, err2)
			}
			defer closePool(again, time.Second)
			if err := x.after(again, snapshot(again)); err != nil {
				return "", err
			}
			return fmt.Sprintf("refused at start-up in %.3fs: %v; the next pool served", elapsed.Seconds(), err), nil
		}
		return fmt.Sprintf("refused at start-up in %.3fs: %v", elapsed.Seconds(), err), nil
	}
	defer closePool(p, time.Second)
	if want, ok := expect["error"].(obj); ok {
		return "", failf("expected start-up to fail with %v, the pool started", want["code"])
	}
	if err := x.after(p, snapshot(p)); err != nil {
		return "", err
	}
	return "started and served", nil
}

func (x *scenario) shutdownInFlight() (string, error) {
	method, c, body, err := x.method()
	if err != nil {
		return "", err
	}
	expect := x.expect()
	p, err := x.start(x.opts)
	if err != nil {
		return "", failf("the pool did not start: %v", err)
	}
	defer closePool(p, 0)
	type outcome struct {
		v   any
		err error
	}
	ch := make(chan outcome, 1)
	go func() {
		v, err := x.call(p, method, c, body, nil)
		ch <- outcome{v, err}
	}()
	if !x.waitFor(x.settle(), func() bool { return p.InFlight() >= 1 }) {
		return "", failf("the call was not in flight within %vs", x.settle().Seconds())
	}
	started := time.Now()
	grace, _ := x.opts.DrainGrace.Get()
	closePool(p, grace)
	shut := time.Since(started)
	o := <-ch
	if err := x.s.checkCall(expect, body, o.v, o.err); err != nil {
		return "", err
	}
	if err := checkElapsed(expect, shut); err != nil {
		return "", err
	}
	_, late := x.call(p, "add", pool.JSON, obj{"a": 1, "b": 2}, nil)
	if code(late) != proto.CodePoolClosed {
		return "", failf("a call after shutdown ended with %v instead of POOL_CLOSED", late)
	}
	ended := describe(o.v)
	if o.err != nil {
		ended = o.err.Error()
	}
	return fmt.Sprintf("shut down in %.3fs; the call ended with %s", shut.Seconds(), ended), nil
}
