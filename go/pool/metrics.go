package pool

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wirepool/wirepool/go/proto"
)

// latencyBounds are the latency histograms' upper bounds in seconds, spec/metrics.json's
// buckets.latency_seconds (the exporter test keeps them equal).
var latencyBounds = []float64{5e-06, 1e-05, 2.5e-05, 5e-05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// hist is a latency histogram over latencyBounds; guarded by metrics.mu.
type hist struct {
	counts []uint64 // per bucket (not cumulative), the last one +Inf
	sum    float64
	n      uint64
}

func (h *hist) observe(d time.Duration) {
	if h.counts == nil {
		h.counts = make([]uint64, len(latencyBounds)+1)
	}
	s := d.Seconds()
	i, _ := slices.BinarySearch(latencyBounds, s) // the first bound >= s: never an earlier bucket
	h.counts[i]++
	h.sum += s
	h.n++
}

func (h *hist) snapshot() Histogram {
	out := Histogram{Bounds: latencyBounds, Counts: make([]uint64, len(latencyBounds)), Count: h.n, Sum: h.sum}
	var c uint64
	for i := range latencyBounds {
		if h.counts != nil {
			c += h.counts[i]
		}
		out.Counts[i] = c
	}
	return out
}

// slotCounters are one slot's counters, kept across its replacements.
type slotCounters struct {
	requests, rows, sent, received atomic.Int64
}

// metrics are a pool's counters (spec/metrics.json); the gauges are read at the snapshot.
type metrics struct {
	calls, streams atomic.Int64
	slots          []slotCounters
	spare          slotCounters

	mu        sync.Mutex
	errors    map[string]int64
	restarts  map[string]int64
	recycles  map[string]int64
	queueWait hist
	methods   map[string]*hist
}

// slot is slot i's counters. The slots are made at Start, one per worker; a slot beyond them
// (none today) counts in a spare rather than index out of range.
func (m *metrics) slot(i int) *slotCounters {
	if i >= 0 && i < len(m.slots) {
		return &m.slots[i]
	}
	return &m.spare
}

func newMetrics(workers int) *metrics {
	return &metrics{slots: make([]slotCounters, workers), errors: map[string]int64{},
		restarts: map[string]int64{}, recycles: map[string]int64{}, methods: map[string]*hist{}}
}

func (m *metrics) count(into map[string]int64, key string) {
	m.mu.Lock()
	into[key]++
	m.mu.Unlock()
}

// sent counts a request that left for worker w after waiting queued for a worker with room.
func (m *metrics) sent(w *proc, kind proto.MethodKind, queued time.Duration) {
	if kind == proto.KindStream {
		m.streams.Add(1)
	} else {
		m.calls.Add(1)
	}
	m.slot(w.slot).requests.Add(1)
	m.mu.Lock()
	m.queueWait.observe(queued)
	m.mu.Unlock()
}

// ended counts a call's or stream's outcome: its latency from sending (when it was sent) and
// its error's code.
func (m *metrics) ended(method string, since time.Time, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !since.IsZero() {
		h := m.methods[method]
		if h == nil {
			h = &hist{}
			m.methods[method] = h
		}
		h.observe(time.Since(since))
	}
	if e, ok := err.(*Error); ok && e != nil {
		m.errors[e.Code.String()]++
	} else if err != nil {
		m.errors[proto.CodeHandlerError.String()]++
	}
}

// deathCause is the restart cause label of a worker that died unexpectedly.
func deathCause(w *proc) string {
	e := w.exitErr
	switch {
	case w.cancelKilled.Load():
		return "cancel_timeout"
	case e == nil:
		return "crashed"
	case e.Code == proto.CodeWorkerHung:
		return "hung"
	case e.Code == proto.CodeProtocolViolation:
		return "protocol_violation"
	}
	if st := w.cmd.ProcessState; st != nil && st.Exited() && st.ExitCode() == 0 {
		return "left_by_itself"
	}
	return "crashed"
}

// Histogram is a latency histogram's snapshot: Counts[i] observations at or below Bounds[i]
// seconds (cumulative, as Prometheus counts them; +Inf is Count).
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64 // seconds
}

// SlotMetrics is one slot of the pool: its current worker's gauges and the slot's counters,
// which its replacements keep counting.
type SlotMetrics struct {
	Slot          int
	State         string        // starting, ready, leased, draining, dead (spec/metrics.json's states)
	Pid           Optional[int] // unset while no process runs in the slot
	InFlight      int
	Requests      int64                   // requests sent to the slot's workers
	Rows          int64                   // stream rows received from them
	SentBytes     int64                   // bytes written to them, frame headers included
	ReceivedBytes int64                   // bytes read from them
	RSSBytes      Optional[int64]         // the current worker's resident set; unset when unknown
	HeartbeatRTT  Optional[time.Duration] // the last answered PING's round trip; unset before the first PONG
}

// Metrics is a snapshot of a pool's metrics: the series of spec/metrics.json (PROTOCOL.md 23)
// before they are named (WritePrometheus names them).
type Metrics struct {
	Workers        int              // the pool's size
	WorkersAlive   int              // processes that finished their handshake and have not ended
	Calls, Streams int64            // sent to a worker (a retry counts again)
	Retries        int64            // requests sent again (Options.Retry)
	Errors         map[string]int64 // calls and streams that ended in an error, by code name
	Restarts       map[string]int64 // replacements after an unexpected death, by cause
	Recycles       map[string]int64 // healthy workers replaced, by limit: requests, rss, idle
	QueueWait      Histogram        // the wait for a worker with room
	MethodDuration map[string]Histogram
	Slots          []SlotMetrics
	Closed         bool
}

// Metrics returns a snapshot of the pool's metrics.
func (p *Pool) Metrics() Metrics {
	m := p.m
	out := Metrics{Workers: len(p.procs), Calls: m.calls.Load(), Streams: m.streams.Load(), Retries: p.retries.Load()}
	m.mu.Lock()
	out.Errors, out.Restarts, out.Recycles = maps.Clone(m.errors), maps.Clone(m.restarts), maps.Clone(m.recycles)
	out.QueueWait = m.queueWait.snapshot()
	out.MethodDuration = make(map[string]Histogram, len(m.methods))
	for k, h := range m.methods {
		out.MethodDuration[k] = h.snapshot()
	}
	m.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	out.Closed = p.closed
	inFlight := make([]int, len(p.procs))
	for w := range p.all {
		w.mu.Lock()
		if !w.dead {
			out.WorkersAlive++
			if w.slot < len(inFlight) {
				inFlight[w.slot] += w.core.InFlight()
			}
		}
		w.mu.Unlock()
	}
	for slot, w := range p.procs {
		c := m.slot(slot)
		s := SlotMetrics{Slot: slot, State: "starting", InFlight: inFlight[slot], Requests: c.requests.Load(),
			Rows: c.rows.Load(), SentBytes: c.sent.Load(), ReceivedBytes: c.received.Load()}
		if w != nil {
			w.mu.Lock()
			switch {
			case w.dead:
				s.State = "dead"
			case w.retiring:
				s.State = "draining"
			case w.leased:
				s.State = "leased"
			default:
				s.State = "ready"
			}
			alive := !w.dead
			w.mu.Unlock()
			if alive {
				pid := w.cmd.Process.Pid
				s.Pid = Set(pid)
				if rss, ok := rssBytes(pid); ok {
					s.RSSBytes = Set(rss)
				}
				if rtt := w.rtt.Load(); rtt > 0 {
					s.HeartbeatRTT = Set(time.Duration(rtt))
				}
			}
		}
		out.Slots = append(out.Slots, s)
	}
	return out
}
