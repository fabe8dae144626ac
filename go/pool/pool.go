// Package pool is the wirepool parent: it runs worker processes of any language behind the
// typed binary wire of spec/PROTOCOL.md and routes typed calls and streams to them. Every
// protocol decision is the proto core's (a proto.Connection in the Parent role per worker, and
// its liveness judge); this package moves bytes, runs clocks and goroutines.
package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wirepool/wirepool/go/proto"
)

// Pool is a set of worker processes. Safe for concurrent use.
type Pool struct {
	opts settings

	mu       sync.Mutex // guards the fields below (taken before any proc's mu)
	procs    []*proc    // by slot: the worker new requests go to; nil while a slot restarts
	all      map[*proc]struct{}
	closed   bool
	closeErr *Error // why the pool closed itself (restart intensity), else nil
	restarts int
	retries  atomic.Int64 // requests sent again (retry.go)
	m        *metrics     // metrics.go
	crashes  []time.Time  // within RestartWindow
	restart  sync.WaitGroup
	life     context.Context
	stop     context.CancelFunc

	clampOnce sync.Once // the max_in_flight clamp is said once per pool (4.2)

	wakeMu sync.Mutex
	wakeCh chan struct{} // closed and replaced when room may have appeared
}

// Start validates o (INVALID_ARGUMENT, nothing spawned), spawns o.Workers workers and completes
// their handshakes. A worker that fails to start fails Start with its error (STARTUP_TIMEOUT,
// WORKER_EXITED with its stderr tail, VERSION_MISMATCH, CODEC_MISMATCH for a missing required
// method, ...), and the others are stopped.
func Start(ctx context.Context, o Options) (*Pool, error) {
	v, err := o.validate()
	if err != nil {
		return nil, err
	}
	life, stop := context.WithCancel(context.Background())
	p := &Pool{opts: v, procs: make([]*proc, v.Workers), all: map[*proc]struct{}{}, life: life,
		stop: stop, wakeCh: make(chan struct{}), m: newMetrics(v.Workers)}
	type res struct {
		i int
		w *proc
		e error
	}
	ch := make(chan res, v.Workers)
	for i := range v.Workers {
		go func() {
			w, e := p.spawn(ctx, i)
			ch <- res{i, w, e}
		}()
	}
	var first error
	for range v.Workers {
		r := <-ch
		if r.e != nil && first == nil {
			first = r.e
		}
		p.procs[r.i] = r.w
	}
	if first != nil {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		for _, w := range p.procs {
			if w != nil {
				w.kill()
				<-w.done
			}
		}
		stop()
		p.restart.Wait()
		return nil, first
	}
	p.mu.Lock()
	for _, w := range p.procs {
		p.all[w] = struct{}{}
	}
	p.mu.Unlock()
	return p, nil
}

// WorkerStats is one live worker process.
type WorkerStats struct {
	Slot     int  // 0 to Workers-1, kept by its replacements
	Pid      int  // the process id
	InFlight int  // requests sent and not ended (by the core's accounting)
	Leased   bool // held by a Lease
	Retiring bool // recycled or closing: drained, takes no new request
}

// Stats is a snapshot of the pool.
type Stats struct {
	Workers  []WorkerStats // live worker processes, by slot
	Restarts int           // replacements started since Start (crashes, hangs, recycling)
	Retries  int           // requests sent again after their worker died (Options.Retry)
	Closed   bool
}

// Stats returns a snapshot of the pool's workers and counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stats{Restarts: p.restarts, Retries: int(p.retries.Load()), Closed: p.closed}
	for w := range p.all {
		w.mu.Lock()
		if !w.dead {
			s.Workers = append(s.Workers, WorkerStats{Slot: w.slot, Pid: w.cmd.Process.Pid,
				InFlight: w.core.InFlight(), Leased: w.leased, Retiring: w.retiring})
		}
		w.mu.Unlock()
	}
	slices.SortFunc(s.Workers, func(a, b WorkerStats) int { return a.Slot - b.Slot })
	return s
}

// InFlight is the number of requests in flight on every worker.
func (p *Pool) InFlight() int {
	n := 0
	for _, w := range p.Stats().Workers {
		n += w.InFlight
	}
	return n
}

// wake tells waiters that a request ended or a worker appeared.
func (p *Pool) wake() {
	p.wakeMu.Lock()
	close(p.wakeCh)
	p.wakeCh = make(chan struct{})
	p.wakeMu.Unlock()
}

func (p *Pool) waitCh() chan struct{} {
	p.wakeMu.Lock()
	defer p.wakeMu.Unlock()
	return p.wakeCh
}

// workerDied replaces a worker that ended (restart with backoff) unless the pool is closing or
// the worker had been retired (its replacement is already on its way). More than MaxRestarts
// crashes within RestartWindow close the pool (POOL_CLOSED): the program cannot stay up.
func (p *Pool) workerDied(w *proc) {
	p.mu.Lock()
	defer p.wake()
	defer p.mu.Unlock()
	delete(p.all, w)
	current := p.procs[w.slot] == w
	if current {
		p.procs[w.slot] = nil
	}
	if p.closed || !current || p.gaveUp(w.exitErr) {
		return
	}
	p.m.count(p.m.restarts, deathCause(w))
	p.restart.Add(1)
	go p.respawn(w.slot, p.opts.RestartBackoff)
}

// gaveUp counts a death (a crash, a hang, a replacement that failed to start) against the
// restart intensity: with MaxRestarts restarts already made within RestartWindow, the pool
// closes itself (POOL_CLOSED, "restart intensity exceeded", the last death's details) and
// gaveUp is true. p.mu is held.
func (p *Pool) gaveUp(why *Error) bool {
	now := time.Now()
	p.crashes = slices.DeleteFunc(p.crashes, func(t time.Time) bool { return now.Sub(t) > p.opts.RestartWindow })
	if len(p.crashes) < p.opts.MaxRestarts {
		p.crashes = append(p.crashes, now)
		return false
	}
	p.closeErr = errorf(proto.CodePoolClosed, "restart intensity exceeded: %d restarts within %v (max_restarts %d), then: %s",
		len(p.crashes), p.opts.RestartWindow, p.opts.MaxRestarts, why.Message)
	p.closeErr.Details = why.Details
	p.closeLocked()
	return true
}

// closeLocked marks the pool closed and drains every worker; p.mu is held.
func (p *Pool) closeLocked() {
	p.closed = true
	p.stop()
	for w := range p.all {
		w.drain(p.opts.DrainGrace)
	}
}

// retire takes a worker out of routing (recycling, recycle.go): DRAIN, and a replacement
// starts in its slot at once; false when it was not the slot's worker or the pool is closed.
func (p *Pool) retire(w *proc) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.procs[w.slot] != w {
		return false
	}
	p.procs[w.slot] = nil
	w.drain(p.opts.DrainGrace)
	p.restart.Add(1)
	go p.respawn(w.slot, 0)
	return true
}

func (p *Pool) respawn(slot int, delay time.Duration) {
	defer p.restart.Done()
	for {
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-p.life.Done():
				t.Stop()
				return
			}
		}
		w, err := p.spawn(p.life, slot)
		if err == nil {
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				w.kill()
				<-w.done
				return
			}
			p.procs[slot] = w
			p.all[w] = struct{}{}
			p.restarts++
			p.mu.Unlock()
			p.wake()
			return
		}
		if p.life.Err() != nil {
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			e = errorf(proto.CodeSpawnFailed, "%v", err)
		}
		p.mu.Lock()
		stop := p.closed || p.gaveUp(e)
		p.mu.Unlock()
		if !stop {
			p.m.count(p.m.restarts, "start_failed")
		}
		if stop {
			p.wake()
			return
		}
		delay = min(max(2*delay, p.opts.RestartBackoff), p.opts.RestartBackoffMax)
	}
}

// closedError is the error of a call on a closed pool.
func (p *Pool) closedError() *Error {
	if p.closeErr != nil {
		return p.closeErr
	}
	return errorf(proto.CodePoolClosed, "the pool is closed")
}

// routable reports whether w may take a new request now: alive, its connection not ended
// (a worker whose input ended cannot answer; it is reaped and replaced), not retiring, with
// room. w.mu is held.
func (w *proc) routable() bool {
	return !w.dead && !w.eof && !w.retiring && w.core.CanSendRequest()
}

// testHookRouted, set by the tests alone, runs when send has picked a worker, before it locks
// it to send.
var testHookRouted func(w *proc)

// send picks the least-loaded worker with room (the core's CanSendRequest) that no lease holds
// and sends the request, waiting for room until ctx ends.
func (p *Pool) send(ctx context.Context, m call) (*proc, uint64, *pending, error) {
	for {
		wake := p.waitCh()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, 0, nil, p.closedError()
		}
		var best *proc
		bestLoad := 0
		for _, w := range p.procs {
			if w == nil {
				continue
			}
			w.mu.Lock()
			if !w.leased && w.routable() && (best == nil || w.core.InFlight() < bestLoad) {
				best, bestLoad = w, w.core.InFlight()
			}
			w.mu.Unlock()
		}
		if best != nil {
			if testHookRouted != nil {
				testHookRouted(best)
			}
			best.mu.Lock()
			if !best.routable() || best.leased {
				// It died (or was leased) between the scan and this lock: a request added to a
				// dead worker's table would never end. Pick again.
				best.mu.Unlock()
				p.mu.Unlock()
				continue
			}
			p.mu.Unlock()
			return best.sendLocked(m)
		}
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, 0, nil, ctxError(ctx)
		}
	}
}

// call is one request to send.
type call struct {
	method    string
	codec     uint8
	kind      proto.MethodKind
	timeoutUs uint64
	body      []byte
}

// sendLocked checks the method against the worker's HELLO and sends the request; w.mu is held
// and released here.
func (w *proc) sendLocked(m call) (*proc, uint64, *pending, error) {
	fail := func(e *Error) (*proc, uint64, *pending, error) {
		w.mu.Unlock()
		return nil, 0, nil, e
	}
	idx, ok := w.methods[m.method]
	if !ok {
		return fail(errorf(proto.CodeUnknownMethod, "the worker has no method %s", quote(m.method)))
	}
	hm := w.core.Hello().Methods[idx]
	if hm.Kind != m.kind {
		// 22.4: not a method of this kind (a stream method through Call, or the reverse).
		return fail(errorf(proto.CodeUnknownMethod, "the worker has no %s method %s (it is a %s method)", m.kind, quote(m.method), hm.Kind))
	}
	if !slices.Contains(hm.Codecs, m.codec) {
		return fail(errorf(proto.CodeCodecUnsupported, "method %s does not accept %s", quote(m.method), Codec(m.codec)))
	}
	id, err := w.core.SendRequest(uint16(idx), m.codec, m.timeoutUs, m.body)
	if err != nil {
		return fail(errorf(protoCode(err), "%v", err))
	}
	pr := newPending()
	w.reqs[id] = pr
	w.sent++
	retire := w.p.opts.MaxRequests > 0 && w.sent >= w.p.opts.MaxRequests && !w.leased
	if retire {
		w.retiring = true
	}
	w.mu.Unlock()
	w.flush()
	if retire {
		w.p.recycle(w, "requests", fmt.Sprintf("it was sent max_requests (%d) requests", w.p.opts.MaxRequests))
	}
	return w, id, pr, nil
}

func ctxError(ctx context.Context) *Error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errorf(proto.CodeDeadlineExceeded, "the deadline passed")
	}
	return errorf(proto.CodeCancelled, "cancelled: %v", context.Cause(ctx))
}

// abandon stops request id after its caller stopped waiting: CANCEL, and the worker is killed
// if the request is still in flight after the cancel grace.
func (w *proc) abandon(id uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.reqs, id)
	if w.dead || !w.core.IsInFlight(id) {
		return
	}
	if w.core.SendCancel(id) == nil {
		w.flush()
	}
	time.AfterFunc(w.p.opts.CancelGrace, func() {
		w.mu.Lock()
		hung := !w.dead && w.core.IsInFlight(id)
		w.mu.Unlock()
		if hung {
			w.cancelKilled.Store(true)
			w.kill()
		}
	})
}

// drain sends DRAIN (no new request; the worker ends what it has within grace, then GOODBYE).
// Callers may hold p.mu.
func (w *proc) drain(grace time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.retiring = true
	if !w.dead && !w.core.IsDraining() && w.core.SendDrain(uint32(grace/time.Millisecond)) == nil {
		w.flush()
	}
}

// Close drains every worker (DRAIN with the drain grace), waits for each GOODBYE and exit, and
// kills what is left when ctx ends or the drain and goodbye graces pass. Calls after Close are
// POOL_CLOSED.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if !p.closed {
		p.closeLocked()
	}
	procs := make([]*proc, 0, len(p.all))
	for w := range p.all {
		procs = append(procs, w)
	}
	p.mu.Unlock()
	p.wake()
	dctx, cancel := context.WithTimeout(ctx, p.opts.DrainGrace+p.opts.GoodbyeGrace)
	defer cancel()
	for _, w := range procs {
		select {
		case <-w.done:
		case <-dctx.Done():
			w.kill()
			<-w.done
		}
	}
	p.restart.Wait()
	return nil
}

// clamped says, once per pool, that max_in_flight is above a worker's max_concurrency and the
// worker's offer is used (PROTOCOL.md 4.2).
func (p *Pool) clamped(offer int, hello uint32) {
	p.clampOnce.Do(func() {
		p.opts.Logger.Warn(fmt.Sprintf("wirepool: max_in_flight %d is above the worker's max_concurrency %d: "+
			"each worker takes at most %d requests at once (said once per pool)", offer, hello, hello),
			"max_in_flight", offer, "max_concurrency", hello)
	})
}
