package pool

import (
	"context"
	"sync"

	"github.com/wirepool/wirepool/go/proto"
)

// Lease holds one worker for its holder alone: calls and streams through it (pool.Call(ctx,
// lease, ...)) all reach that worker, and the pool routes nothing else to it. Once the worker
// is gone, every call through the lease fails LEASE_LOST, saying how it died; the pool
// replaces the worker as usual. Release gives it back.
type Lease struct {
	p    *Pool
	w    *proc
	once sync.Once
	gone bool // released
	mu   sync.Mutex
}

// Lease waits until a worker has no request in flight and no other lease, and holds it.
func (p *Pool) Lease(ctx context.Context) (*Lease, error) {
	for {
		wake := p.waitCh()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, p.closedError()
		}
		for _, w := range p.procs {
			if w == nil {
				continue
			}
			w.mu.Lock()
			if !w.leased && w.routable() && w.core.InFlight() == 0 {
				w.leased = true
				w.mu.Unlock()
				p.mu.Unlock()
				return &Lease{p: p, w: w}, nil
			}
			w.mu.Unlock()
		}
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctxError(ctx)
		}
	}
}

// Pid is the leased worker's process id.
func (l *Lease) Pid() int { return l.w.cmd.Process.Pid }

// Release gives the worker back to the pool; calls through the lease then fail LEASE_LOST.
func (l *Lease) Release() {
	l.once.Do(func() {
		l.mu.Lock()
		l.gone = true
		l.mu.Unlock()
		l.w.mu.Lock()
		l.w.leased = false
		l.w.mu.Unlock()
		l.p.wake()
	})
}

func (l *Lease) options() *settings { return &l.p.opts }

func (l *Lease) send(ctx context.Context, m call) (*proc, uint64, *pending, error) {
	for {
		wake := l.p.waitCh()
		l.mu.Lock()
		released := l.gone
		l.mu.Unlock()
		if released {
			return nil, 0, nil, errorf(proto.CodeLeaseLost, "the lease was released")
		}
		w := l.w
		w.mu.Lock()
		if w.dead {
			e := &Error{Code: proto.CodeLeaseLost, Message: "the leased worker is gone: " + w.exitErr.Message,
				Details: w.exitErr.Details, StderrTail: w.exitErr.StderrTail}
			w.mu.Unlock()
			return nil, 0, nil, e
		}
		if w.routable() {
			return w.sendLocked(m)
		}
		if w.retiring || w.core.IsGoodbye() || !w.core.IsOpen() {
			w.mu.Unlock()
			return nil, 0, nil, errorf(proto.CodeLeaseLost, "the leased worker is leaving")
		}
		w.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, 0, nil, ctxError(ctx)
		}
	}
}
