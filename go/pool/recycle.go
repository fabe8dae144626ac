package pool

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// rssEvery is how often a worker's resident set is read for MaxRSSBytes (as the Rust parent).
const rssEvery = 250 * time.Millisecond

// housekeep recycles w by memory (MaxRSSBytes) or idleness (MaxIdle), as the Rust, Python and
// Node parents: checked on a tick (the idle bound's half, 10 ms to 1 s; rssEvery for memory),
// so an idle worker goes at most one tick late, never early. It runs only when one of them is
// set, and ends with the worker or once it is retiring.
func (w *proc) housekeep() {
	o := &w.p.opts
	tick := time.Second
	if o.MaxIdle > 0 {
		tick = min(time.Second, max(10*time.Millisecond, o.MaxIdle/2))
	}
	if o.MaxRSSBytes > 0 {
		tick = min(tick, rssEvery)
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	var idleFrom, nextRSS time.Time
	lastSent := -1
	for {
		select {
		case <-t.C:
		case <-w.done:
			return
		}
		now := time.Now()
		w.mu.Lock()
		leaving := w.dead || w.eof || w.retiring
		leased := w.leased
		busy := w.core.InFlight() > 0 || w.sent != lastSent
		served := w.sent > 0
		lastSent = w.sent
		w.mu.Unlock()
		switch {
		case leaving:
			return
		case leased:
			idleFrom = time.Time{} // a lease holder's worker is theirs; idle counts from its release
			continue
		}
		if o.MaxRSSBytes > 0 && !now.Before(nextRSS) {
			nextRSS = now.Add(rssEvery)
			if rss, ok := rssBytes(w.cmd.Process.Pid); ok && rss > o.MaxRSSBytes {
				w.p.recycle(w, "rss", fmt.Sprintf("its resident set, %d bytes, is above max_rss_bytes %d", rss, o.MaxRSSBytes))
				return
			}
		}
		if o.MaxIdle > 0 {
			switch {
			case busy:
				idleFrom = time.Time{}
			case idleFrom.IsZero():
				idleFrom = now
			case served && now.Sub(idleFrom) >= o.MaxIdle:
				// A worker that never served a request has nothing to shed: it is kept.
				w.p.recycle(w, "idle", fmt.Sprintf("no request for %v (max_idle %v)", now.Sub(idleFrom).Round(time.Millisecond), o.MaxIdle))
				return
			}
		}
	}
}

// recycle drains w while its replacement starts (retire), and says so on the pool's logger at
// Debug: a routine event (one per MaxRequests requests) that slog's default handler, which
// shows Info, would print on every program's stderr. reason is the limit: "requests", "rss"
// or "idle".
func (p *Pool) recycle(w *proc, reason, why string) {
	if p.retire(w) {
		p.m.count(p.m.recycles, reason)
		p.opts.Logger.Debug(fmt.Sprintf("wirepool: recycling worker %d (pid %d): %s", w.slot, w.cmd.Process.Pid, why),
			"slot", w.slot, "pid", w.cmd.Process.Pid, "reason", reason)
	}
}

// rssBytes is the resident set of process pid (/proc/PID/statm's second field, in pages);
// false once it is gone.
func rssBytes(pid int) (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * int64(os.Getpagesize()), true
}
