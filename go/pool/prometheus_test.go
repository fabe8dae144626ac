package pool_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

type metricsSpec struct {
	Prefix string `json:"prefix"`
	Labels map[string]struct {
		Pattern string   `json:"pattern"`
		Values  []string `json:"values"`
	} `json:"labels"`
	Buckets map[string][]float64 `json:"buckets"`
	Series  []struct {
		Name     string   `json:"name"`
		Type     string   `json:"type"`
		Labels   []string `json:"labels"`
		Required bool     `json:"required"`
		Buckets  string   `json:"buckets"`
		Help     string   `json:"help"`
	} `json:"series"`
}

type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// scrape parses the text format: HELP and TYPE by family, and the samples.
func scrape(t *testing.T, text string) (help, kinds map[string]string, samples []promSample) {
	t.Helper()
	help, kinds = map[string]string{}, map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "# HELP "):
			name, h, _ := strings.Cut(strings.TrimPrefix(line, "# HELP "), " ")
			if _, dup := help[name]; dup {
				t.Fatalf("HELP of %s twice", name)
			}
			help[name] = h
		case strings.HasPrefix(line, "# TYPE "):
			name, k, _ := strings.Cut(strings.TrimPrefix(line, "# TYPE "), " ")
			kinds[name] = k
		default:
			m := sampleLine.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("not a sample line: %q", line)
			}
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				t.Fatalf("value of %q: %v", line, err)
			}
			s := promSample{name: m[1], labels: map[string]string{}, value: v}
			for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
				s.labels[p[1]] = p[2]
			}
			samples = append(samples, s)
		}
	}
	return help, kinds, samples
}

// The exporter writes exactly spec/metrics.json: every required family with its help and
// type, only those, each sample with the family's labels (and their allowed values), the
// histograms with the file's buckets; and the counters count what the pool did.
func TestPrometheusFollowsTheContract(t *testing.T) {
	raw, err := os.ReadFile("../../spec/metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	var spec metricsSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	o := testWorker(t)
	o.Workers = pool.Set(1) // so the calls after the crash wait for its replacement: the death is counted
	o.MaxRequests = pool.Set(2)
	p := start(t, o)
	ctx := bounded(t)
	if _, err := pool.Call[firstTries, int](ctx, p, "crash_first", firstTries{Dir: t.TempDir(), N: 1}); code(err) != proto.CodeWorkerExited {
		t.Fatalf("crash_first: %v", err)
	}
	for range 3 {
		if _, err := pool.Call[any, int](ctx, p, "whoami", nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Call[any, any](ctx, p, "fail", nil); code(err) != proto.CodeHandlerError {
		t.Fatalf("fail: %v", err)
	}
	s, err := pool.Stream[firstTries, int, any](ctx, p, "crash_first_stream", firstTries{Dir: t.TempDir(), Rows: 5})
	if err != nil {
		t.Fatal(err)
	}
	for s.Next() {
	}
	if s.Err() != nil {
		t.Fatal(s.Err())
	}

	rec := httptest.NewRecorder()
	pool.PrometheusHandler(map[string]*pool.Pool{"default": p}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("Content-Type %q", ct)
	}
	help, kinds, samples := scrape(t, rec.Body.String())

	codes := map[string]bool{}
	for _, c := range proto.ErrorInfos() {
		codes[c.Name] = true
	}
	byName := map[string]int{}
	for i, f := range spec.Series {
		byName[f.Name] = i
		if !f.Required {
			continue
		}
		if help[f.Name] != f.Help || kinds[f.Name] != f.Type {
			t.Errorf("%s: HELP %q TYPE %q, expected %q %q", f.Name, help[f.Name], kinds[f.Name], f.Help, f.Type)
		}
	}
	for name := range help {
		if i, ok := byName[name]; !ok || !spec.Series[i].Required {
			t.Errorf("%s is exported and is not a required series of spec/metrics.json", name)
		}
	}
	value := map[string]float64{}
	for _, smp := range samples {
		family, suffix := smp.name, ""
		for _, sfx := range []string{"_bucket", "_sum", "_count"} {
			if base := strings.TrimSuffix(smp.name, sfx); base != smp.name && kinds[base] == "histogram" {
				family, suffix = base, sfx
			}
		}
		i, ok := byName[family]
		if !ok {
			t.Fatalf("sample %s of no family", smp.name)
		}
		f := spec.Series[i]
		want := slices.Clone(f.Labels)
		if suffix == "_bucket" {
			want = append(want, "le")
		}
		var got []string
		for k := range smp.labels {
			got = append(got, k)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s labels %v, expected %v", smp.name, got, want)
		}
		for k, v := range smp.labels {
			l := spec.Labels[k]
			switch {
			case k == "le":
			case k == "code" && !codes[v]:
				t.Errorf("%s code=%q is not an error code name", smp.name, v)
			case len(l.Values) > 0 && !slices.Contains(l.Values, v):
				t.Errorf("%s %s=%q is not one of %v", smp.name, k, v, l.Values)
			case l.Pattern != "" && !regexp.MustCompile(l.Pattern).MatchString(v):
				t.Errorf("%s %s=%q does not match %s", smp.name, k, v, l.Pattern)
			}
		}
		key := smp.name
		for _, k := range []string{"code", "cause", "reason", "worker", "state", "method", "le"} {
			if v, ok := smp.labels[k]; ok {
				key += "," + k + "=" + v
			}
		}
		value[key] = smp.value
	}
	// The buckets: exactly the file's, then +Inf.
	var les []string
	for _, smp := range samples {
		if smp.name == "wirepool_queue_wait_seconds_bucket" {
			les = append(les, smp.labels["le"])
		}
	}
	var wantLe []string
	for _, b := range spec.Buckets["latency_seconds"] {
		wantLe = append(wantLe, strconv.FormatFloat(b, 'g', -1, 64))
	}
	wantLe = append(wantLe, "+Inf")
	if !slices.Equal(les, wantLe) {
		t.Errorf("queue wait buckets %v, expected %v", les, wantLe)
	}
	for k, want := range map[string]float64{
		"wirepool_workers":                                     1,
		"wirepool_calls_total":                                 5, // 3 whoami, fail, crash_first
		"wirepool_streams_total":                               1,
		"wirepool_errors_total,code=HANDLER_ERROR":             1,
		"wirepool_errors_total,code=WORKER_EXITED":             1,
		"wirepool_restarts_total,cause=crashed":                1,
		"wirepool_queue_wait_seconds_count":                    6,
		"wirepool_method_duration_seconds_count,method=whoami": 3,
		"wirepool_retries_total":                               0,
	} {
		if value[k] != want {
			t.Errorf("%s = %v, expected %v", k, value[k], want)
		}
	}
	if value["wirepool_recycles_total,reason=requests"] < 1 {
		t.Errorf("no recycle by requests counted (max_requests 2, 6 requests)")
	}
	if r := value["wirepool_worker_rows_total,worker=0"]; r != 5 {
		t.Errorf("%v rows counted, expected 5", r)
	}
	if value["wirepool_worker_sent_bytes_total,worker=0"] == 0 || value["wirepool_worker_received_bytes_total,worker=0"] == 0 {
		t.Errorf("no bytes counted for worker 0")
	}

	// A closed pool: the families, no samples.
	p.Close(ctx)
	var out bytes.Buffer
	if err := pool.WritePrometheus(&out, map[string]*pool.Pool{"default": p}); err != nil {
		t.Fatal(err)
	}
	if help, _, samples := scrape(t, out.String()); len(samples) != 0 || len(help) == 0 {
		t.Fatalf("a closed pool: %d samples, %d families", len(samples), len(help))
	}
}

// The heartbeat round trip is the last answered PING's: absent before the first PONG, then a
// positive duration below the liveness bound.
func TestMetricsHeartbeatRTT(t *testing.T) {
	o := testWorker(t)
	o.Heartbeat = 20 * time.Millisecond
	p := start(t, o)
	ctx := bounded(t)
	for {
		if rtt, ok := p.Metrics().Slots[0].HeartbeatRTT.Get(); ok {
			if rtt <= 0 || rtt > 3*o.Heartbeat+time.Second {
				t.Fatalf("heartbeat round trip %v", rtt)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("no heartbeat round trip after PINGs every 20 ms")
		case <-time.After(5 * time.Millisecond): // polls the gauge itself, the thing under test
		}
	}
}
