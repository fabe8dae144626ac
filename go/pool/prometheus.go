package pool

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The exporter writes the Prometheus text format 0.0.4 itself rather than through
// github.com/prometheus/client_golang: spec/metrics.json wants every required family's HELP and
// TYPE lines while the pool is open, samples or not (wirepool_errors_total before the first
// error), and client_golang's registry only writes the families that have samples. It is
// what the Rust parent's exporter does too, and it costs the module no dependency.

// family is one series of spec/metrics.json: name, type, help (word for word).
type family struct{ name, kind, help string }

var (
	famWorkers        = family{"wirepool_workers", "gauge", "Workers the pool keeps (its size)."}
	famWorkersAlive   = family{"wirepool_workers_alive", "gauge", "Workers whose process runs and finished its handshake (ready, leased or draining)."}
	famCalls          = family{"wirepool_calls_total", "counter", "Unary calls sent to a worker (a retry counts again)."}
	famStreams        = family{"wirepool_streams_total", "counter", "Streams sent to a worker (a retry counts again)."}
	famErrors         = family{"wirepool_errors_total", "counter", "Calls and streams that ended in an error, by error code name."}
	famRestarts       = family{"wirepool_restarts_total", "counter", "Workers replaced after an unexpected death, by cause."}
	famRecycles       = family{"wirepool_recycles_total", "counter", "Healthy workers retired and replaced by a recycling limit, by limit."}
	famRetries        = family{"wirepool_retries_total", "counter", "Requests sent again under the pool's retry policy after their worker died."}
	famQueueWait      = family{"wirepool_queue_wait_seconds", "histogram", "Time a call or stream waited for a worker with room before it was sent (0 when one had room)."}
	famMethodDuration = family{"wirepool_method_duration_seconds", "histogram", "Latency of completed calls and streams, from sending to the outcome, by method."}
	famState          = family{"wirepool_worker_state", "gauge", "1 for the worker's current state, 0 for the others."}
	famPid            = family{"wirepool_worker_pid", "gauge", "Process id of the worker (a remote worker's on its own machine); absent while none runs."}
	famInFlight       = family{"wirepool_worker_in_flight", "gauge", "Requests in flight on the worker now."}
	famRequests       = family{"wirepool_worker_requests_total", "counter", "Requests (calls and streams) sent to the worker."}
	famRows           = family{"wirepool_worker_rows_total", "counter", "Stream rows received from the worker."}
	famSentBytes      = family{"wirepool_worker_sent_bytes_total", "counter", "Bytes sent to the worker (frames, headers included)."}
	famReceivedBytes  = family{"wirepool_worker_received_bytes_total", "counter", "Bytes received from the worker (frames, headers included)."}
	famRSS            = family{"wirepool_worker_rss_bytes", "gauge", "Resident set size of the worker process; absent when it is not a child of this process or the OS does not say."}
	famRTT            = family{"wirepool_worker_heartbeat_rtt_seconds", "gauge", "Round trip of the worker's last answered heartbeat PING; absent before the first PONG."}
)

// workerStates are spec/metrics.json's labels.state values, one sample each per worker.
var workerStates = []string{"starting", "ready", "leased", "draining", "dead"}

// WritePrometheus writes the metrics of the named pools in the Prometheus text format 0.0.4,
// the series of spec/metrics.json (PROTOCOL.md 23) with the names, labels, help texts and
// buckets every wirepool parent exports (label pool: the map's key, e.g. "default"; worker:
// the slot). Each family's HELP and TYPE once; a closed pool adds no samples. The error is
// w's.
func WritePrometheus(w io.Writer, pools map[string]*Pool) error {
	names := slices.Sorted(maps.Keys(pools))
	snaps := make([]Metrics, len(names))
	for i, n := range names {
		snaps[i] = pools[n].Metrics()
	}
	b := bufio.NewWriter(w)
	each := func(f family, fn func(pool string, m *Metrics)) {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.kind)
		for i := range snaps {
			if !snaps[i].Closed {
				fn(names[i], &snaps[i])
			}
		}
	}
	sample := func(name string, labels []string, v string) {
		b.WriteString(name)
		if len(labels) > 0 {
			b.WriteByte('{')
			for i := 0; i < len(labels); i += 2 {
				if i > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(b, "%s=\"%s\"", labels[i], escapeLabel(labels[i+1]))
			}
			b.WriteByte('}')
		}
		b.WriteByte(' ')
		b.WriteString(v)
		b.WriteByte('\n')
	}
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	byKey := func(fam family, label string, get func(m *Metrics) map[string]int64) {
		each(fam, func(pool string, m *Metrics) {
			vals := get(m)
			for _, k := range slices.Sorted(maps.Keys(vals)) {
				sample(fam.name, []string{"pool", pool, label, k}, n(vals[k]))
			}
		})
	}
	histogram := func(name string, labels []string, h Histogram) {
		for i, le := range h.Bounds {
			sample(name+"_bucket", append(slices.Clone(labels), "le", f(le)), strconv.FormatUint(h.Counts[i], 10))
		}
		sample(name+"_bucket", append(slices.Clone(labels), "le", "+Inf"), strconv.FormatUint(h.Count, 10))
		sample(name+"_sum", labels, f(h.Sum))
		sample(name+"_count", labels, strconv.FormatUint(h.Count, 10))
	}
	each(famWorkers, func(pool string, m *Metrics) { sample(famWorkers.name, []string{"pool", pool}, n(int64(m.Workers))) })
	each(famWorkersAlive, func(pool string, m *Metrics) {
		sample(famWorkersAlive.name, []string{"pool", pool}, n(int64(m.WorkersAlive)))
	})
	each(famCalls, func(pool string, m *Metrics) { sample(famCalls.name, []string{"pool", pool}, n(m.Calls)) })
	each(famStreams, func(pool string, m *Metrics) { sample(famStreams.name, []string{"pool", pool}, n(m.Streams)) })
	byKey(famErrors, "code", func(m *Metrics) map[string]int64 { return m.Errors })
	byKey(famRestarts, "cause", func(m *Metrics) map[string]int64 { return m.Restarts })
	byKey(famRecycles, "reason", func(m *Metrics) map[string]int64 { return m.Recycles })
	each(famRetries, func(pool string, m *Metrics) { sample(famRetries.name, []string{"pool", pool}, n(m.Retries)) })
	each(famQueueWait, func(pool string, m *Metrics) { histogram(famQueueWait.name, []string{"pool", pool}, m.QueueWait) })
	each(famMethodDuration, func(pool string, m *Metrics) {
		for _, k := range slices.Sorted(maps.Keys(m.MethodDuration)) {
			histogram(famMethodDuration.name, []string{"pool", pool, "method", k}, m.MethodDuration[k])
		}
	})
	perSlot := func(fam family, fn func(s *SlotMetrics) (string, bool)) {
		each(fam, func(pool string, m *Metrics) {
			for i := range m.Slots {
				if v, ok := fn(&m.Slots[i]); ok {
					sample(fam.name, []string{"pool", pool, "worker", strconv.Itoa(m.Slots[i].Slot)}, v)
				}
			}
		})
	}
	each(famState, func(pool string, m *Metrics) {
		for _, s := range m.Slots {
			for _, st := range workerStates {
				v := "0"
				if st == s.State {
					v = "1"
				}
				sample(famState.name, []string{"pool", pool, "worker", strconv.Itoa(s.Slot), "state", st}, v)
			}
		}
	})
	perSlot(famPid, func(s *SlotMetrics) (string, bool) { v, ok := s.Pid.Get(); return n(int64(v)), ok })
	perSlot(famInFlight, func(s *SlotMetrics) (string, bool) { return n(int64(s.InFlight)), true })
	perSlot(famRequests, func(s *SlotMetrics) (string, bool) { return n(s.Requests), true })
	perSlot(famRows, func(s *SlotMetrics) (string, bool) { return n(s.Rows), true })
	perSlot(famSentBytes, func(s *SlotMetrics) (string, bool) { return n(s.SentBytes), true })
	perSlot(famReceivedBytes, func(s *SlotMetrics) (string, bool) { return n(s.ReceivedBytes), true })
	perSlot(famRSS, func(s *SlotMetrics) (string, bool) { v, ok := s.RSSBytes.Get(); return n(v), ok })
	perSlot(famRTT, func(s *SlotMetrics) (string, bool) { v, ok := s.HeartbeatRTT.Get(); return f(v.Seconds()), ok })
	return b.Flush()
}

// escapeLabel escapes a label value for the text format: backslash, double quote, newline.
func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// PrometheusHandler serves WritePrometheus for the named pools: mount it at /metrics.
func PrometheusHandler(pools map[string]*Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_ = WritePrometheus(w, pools)
	})
}
