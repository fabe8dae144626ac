// Package pool is the wirepool parent: it runs worker processes of any language behind the
// typed binary wire of spec/PROTOCOL.md and routes typed calls and streams to them. Every
// protocol decision is the proto core's (a proto.Connection in the Parent role per worker); this
// package moves bytes, runs clocks and goroutines.
package pool

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/wirepool/wirepool/go/proto"
)

// Pool is a set of worker processes. Safe for concurrent use.
type Pool struct {
	opts Options

	mu      sync.Mutex // guards procs, closed (taken before any proc's mu)
	procs   []*proc    // by slot; nil while a slot restarts
	closed  bool
	restart sync.WaitGroup
	life    context.Context
	stop    context.CancelFunc

	wakeMu sync.Mutex
	wakeCh chan struct{} // closed and replaced when room may have appeared
}

// Start validates o (INVALID_ARGUMENT, nothing spawned), spawns o.Workers workers and completes
// their handshakes. A worker that fails to start fails Start with its error (STARTUP_TIMEOUT,
// WORKER_EXITED with its stderr tail, VERSION_MISMATCH, ...), and the others are stopped.
func Start(ctx context.Context, o Options) (*Pool, error) {
	v, err := o.validate()
	if err != nil {
		return nil, err
	}
	life, stop := context.WithCancel(context.Background())
	p := &Pool{opts: v, procs: make([]*proc, v.Workers), life: life, stop: stop, wakeCh: make(chan struct{})}
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
		return nil, first
	}
	return p, nil
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

// workerDied replaces a worker that ended (restart with backoff) unless the pool is closing.
func (p *Pool) workerDied(w *proc) {
	p.mu.Lock()
	defer p.wake()
	defer p.mu.Unlock()
	if p.procs[w.slot] == w {
		p.procs[w.slot] = nil
	}
	if p.closed {
		return
	}
	p.restart.Add(1)
	go p.respawn(w.slot)
}

func (p *Pool) respawn(slot int) {
	defer p.restart.Done()
	delay := p.opts.RestartBackoff
	for {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-p.life.Done():
			t.Stop()
			return
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
			p.mu.Unlock()
			p.wake()
			return
		}
		delay = min(delay*2, p.opts.RestartBackoffMax)
	}
}

// send picks the least-loaded worker with room (the core's CanSendRequest) and sends the
// request, waiting for room until ctx ends.
func (p *Pool) send(ctx context.Context, method string, codec uint8, kind proto.MethodKind, timeoutUs uint64, body []byte) (*proc, uint64, *pending, error) {
	for {
		wake := p.waitCh()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, 0, nil, errorf(proto.CodePoolClosed, "the pool is closed")
		}
		var best *proc
		bestLoad := 0
		for _, w := range p.procs {
			if w == nil {
				continue
			}
			w.mu.Lock()
			if !w.dead && w.core.CanSendRequest() && (best == nil || w.core.InFlight() < bestLoad) {
				best, bestLoad = w, w.core.InFlight()
			}
			w.mu.Unlock()
		}
		if best != nil {
			w := best
			w.mu.Lock()
			p.mu.Unlock()
			idx, ok := w.methods[method]
			if !ok {
				w.mu.Unlock()
				return nil, 0, nil, errorf(proto.CodeUnknownMethod, "the worker has no method %q", method)
			}
			m := w.core.Hello().Methods[idx]
			if m.Kind != kind {
				w.mu.Unlock()
				return nil, 0, nil, errorf(proto.CodeKindMismatch, "method %q is a %s method", method, m.Kind)
			}
			if !slices.Contains(m.Codecs, codec) {
				w.mu.Unlock()
				return nil, 0, nil, errorf(proto.CodeCodecUnsupported, "method %q does not accept codec %d", method, codec)
			}
			id, err := w.core.SendRequest(uint16(idx), codec, timeoutUs, body)
			if err != nil {
				w.mu.Unlock()
				return nil, 0, nil, errorf(protoCode(err), "%v", err)
			}
			pr := newPending()
			w.reqs[id] = pr
			w.mu.Unlock()
			w.flush()
			return w, id, pr, nil
		}
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, 0, nil, ctxError(ctx)
		}
	}
}

func ctxError(ctx context.Context) *Error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errorf(proto.CodeDeadlineExceeded, "the deadline passed")
	}
	return errorf(proto.CodeCancelled, "cancelled: %v", context.Cause(ctx))
}

// abandon stops request id after ctx ended: CANCEL, and the worker is killed if the request is
// still in flight after the cancel grace.
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
			w.kill()
		}
	})
}

// Close drains every worker (DRAIN with the drain grace), waits for each GOODBYE and exit, and
// kills what is left when ctx ends or the goodbye grace passes. Calls after Close are
// POOL_CLOSED.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	procs := slices.Clone(p.procs)
	p.mu.Unlock()
	p.stop()
	p.wake()
	for _, w := range procs {
		if w == nil {
			continue
		}
		w.mu.Lock()
		if !w.dead && w.core.SendDrain(uint32(p.opts.DrainGrace/time.Millisecond)) == nil {
			w.flush()
		}
		w.mu.Unlock()
	}
	dctx, cancel := context.WithTimeout(ctx, p.opts.DrainGrace+p.opts.GoodbyeGrace)
	defer cancel()
	for _, w := range procs {
		if w == nil {
			continue
		}
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
