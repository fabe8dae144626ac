// Package kit holds what the Go bench programs share: the scenario of the runner contract
// (bench/README.md), its result line, the W4 row shapes, the founding workload's generator
// (bench/shapes/founding.json), peak RSS and the payload bytes. It does not import the SDK.
package kit

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Scenario is the runner contract's scenario (every field any kind uses).
type Scenario struct {
	ID           string  `json:"id"`
	Workload     string  `json:"workload"`
	Kind         string  `json:"kind"`
	Repeats      int     `json:"repeats"`
	Payload      int     `json:"payload"`
	Inflight     int     `json:"inflight"`
	DurationS    float64 `json:"duration_s"`
	MinCalls     int     `json:"min_calls"`
	WarmupS      float64 `json:"warmup_s"`
	MaxFrameSize int     `json:"max_frame_size"`
	Shape        string  `json:"shape"`
	N            int     `json:"n"`
	Codec        string  `json:"codec"`
	Every        int     `json:"every"`
	PauseMs      float64 `json:"pause_ms"`
	Workers      int     `json:"workers"`
	TaskUs       uint64  `json:"task_us"`
	Tasks        int     `json:"tasks"`
	Founding     bool    `json:"founding"`
}

// LoadScenario reads the scenario from the last argument that is a JSON object, else stdin.
func LoadScenario() Scenario {
	var text string
	for i := len(os.Args) - 1; i >= 1; i-- {
		if strings.HasPrefix(strings.TrimSpace(os.Args[i]), "{") {
			text = os.Args[i]
			break
		}
	}
	if text == "" {
		b, _ := io.ReadAll(os.Stdin)
		text = string(b)
	}
	var sc Scenario
	if err := json.Unmarshal([]byte(text), &sc); err != nil {
		Fatalf("scenario JSON: %v", err)
	}
	if sc.Repeats == 0 {
		sc.Repeats = 3
	}
	if sc.Codec == "" {
		sc.Codec = "json"
	}
	return sc
}

// Flag is the value after --name in the arguments ("" when absent).
func Flag(name string) string {
	for i, a := range os.Args {
		if a == name && i+1 < len(os.Args) {
			return os.Args[i+1]
		}
	}
	return ""
}

// Has reports whether --name is among the arguments.
func Has(name string) bool {
	for _, a := range os.Args {
		if a == name {
			return true
		}
	}
	return false
}

// Figure is one figure of the result line.
type Figure struct {
	Name   string    `json:"name"`
	Unit   string    `json:"unit"`
	Better string    `json:"better"`
	Values []float64 `json:"values"`
}

// Fig makes a figure; better is "higher" or "lower".
func Fig(name, unit string, values []float64, better string) Figure {
	return Figure{name, unit, better, values}
}

// OK prints the ok result line.
func OK(runner string, sc Scenario, figs []Figure, children *int64, notes string) {
	emit(map[string]any{"runner": runner, "scenario": sc.ID, "status": "ok", "figures": figs,
		"rss_kib": map[string]any{"parent": PeakRSSKiB(0), "children": children}, "notes": notes})
}

// Unsupported prints the unsupported result line.
func Unsupported(runner string, sc Scenario, reason string) {
	emit(map[string]any{"runner": runner, "scenario": sc.ID, "status": "unsupported", "reason": reason})
}

func emit(v any) {
	b, _ := json.Marshal(v)
	os.Stdout.Write(append(b, '\n'))
}

// Fatalf says why on stderr and exits 1 (the harness reports it as an error with the text).
func Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

// PeakRSSKiB is VmHWM of pid (0: this process) in KiB, nil when unreadable.
func PeakRSSKiB(pid int) *int64 {
	path := "/proc/self/status"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return &v
				}
			}
		}
	}
	return nil
}

// MaxPeak is the largest VmHWM of pids.
func MaxPeak(pids []int) *int64 {
	var best *int64
	for _, pid := range pids {
		if v := PeakRSSKiB(pid); v != nil && (best == nil || *v > *best) {
			best = v
		}
	}
	return best
}

// Payload is "wirepool" repeated to size bytes.
func Payload(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = "wirepool"[i%8]
	}
	return b
}

// PercentileUs is the nearest-rank percentile of sorted nanoseconds, in microseconds (floor.c's rule).
func PercentileUs(ns []int64, q float64) float64 {
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	n := len(ns)
	rank := int(q/100*float64(n) + 0.5)
	rank = max(1, min(rank, n))
	return float64(ns[rank-1]) / 1000
}

// RowsReq is the rows method's request.
type RowsReq struct {
	Shape string `json:"shape" msgpack:"shape" cbor:"shape"`
	N     uint64 `json:"n" msgpack:"n" cbor:"n"`
}

// SmallRow is W4's {"i", "name", "kind"}.
type SmallRow struct {
	I    uint64 `json:"i" msgpack:"i" cbor:"i"`
	Name string `json:"name" msgpack:"name" cbor:"name"`
	Kind string `json:"kind" msgpack:"kind" cbor:"kind"`
}

// LargeRow is a small row plus a 4 KiB blob: 8 digits of i, then LargeTail "x".
type LargeRow struct {
	I    uint64 `json:"i" msgpack:"i" cbor:"i"`
	Name string `json:"name" msgpack:"name" cbor:"name"`
	Kind string `json:"kind" msgpack:"kind" cbor:"kind"`
	Blob string `json:"blob" msgpack:"blob" cbor:"blob"`
}

// LargeTail is how many "x" follow the blob's 8 digits.
const LargeTail = 4088

// FoundingSmall is a row of small_rows_8192.
type FoundingSmall struct {
	ID     uint64 `json:"id" msgpack:"id" cbor:"id"`
	Name   string `json:"name" msgpack:"name" cbor:"name"`
	Kind   string `json:"kind" msgpack:"kind" cbor:"kind"`
	Module string `json:"module" msgpack:"module" cbor:"module"`
	Line   uint64 `json:"line" msgpack:"line" cbor:"line"`
}

// FoundingLarge is a row of large_rows_512.
type FoundingLarge struct {
	ID      uint64 `json:"id" msgpack:"id" cbor:"id"`
	Name    string `json:"name" msgpack:"name" cbor:"name"`
	Kind    string `json:"kind" msgpack:"kind" cbor:"kind"`
	Payload string `json:"payload" msgpack:"payload" cbor:"payload"`
}

// The founding shapes' names.
const (
	FoundingSmallShape = "small_rows_8192"
	FoundingLargeShape = "large_rows_512"
)

// RepoRoot is $WIREPOOL_REPO, else four levels above this executable
// (<repo>/bench/.build/go/<exe>).
func RepoRoot() string {
	if r := os.Getenv("WIREPOOL_REPO"); r != "" {
		return r
	}
	exe, err := os.Executable()
	if err != nil {
		Fatalf("own path: %v", err)
	}
	return filepath.Join(filepath.Dir(exe), "..", "..", "..")
}

type field struct {
	Name        string `json:"name"`
	Kind        string `json:"kind"`
	Prefix      string `json:"prefix"`
	IndexSuffix bool   `json:"index_suffix"`
	Add         uint64 `json:"add"`
	Mod         uint64 `json:"mod"`
	Len         int    `json:"len"`
	Fill        string `json:"fill"`
}

// Gen makes the rows of one founding shape from bench/shapes/founding.json.
type Gen struct {
	fields []field
	tail   string
}

// NewGen reads the shape's field list; an error when its names differ from want.
func NewGen(shape string, want []string) (*Gen, error) {
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "bench", "shapes", "founding.json"))
	if err != nil {
		return nil, err
	}
	var spec struct {
		Shapes map[string]struct {
			Fields []field `json:"fields"`
		} `json:"shapes"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, err
	}
	s, ok := spec.Shapes[shape]
	if !ok {
		return nil, fmt.Errorf("no shape %q in founding.json", shape)
	}
	g := &Gen{fields: s.Fields}
	if len(s.Fields) != len(want) {
		return nil, fmt.Errorf("shape %s: %d fields, the struct has %d", shape, len(s.Fields), len(want))
	}
	for k, f := range s.Fields {
		if f.Name != want[k] {
			return nil, fmt.Errorf("shape %s: field %d is %q, the struct's is %q", shape, k, f.Name, want[k])
		}
		switch f.Kind {
		case "index", "int", "str":
		case "payload":
			fill := []rune(f.Fill)
			if len(fill) == 0 {
				fill = []rune("x")
			}
			var sb strings.Builder
			for i := 0; i < f.Len-8; i++ {
				sb.WriteRune(fill[i%len(fill)])
			}
			g.tail = sb.String()
		default:
			return nil, fmt.Errorf("unknown field kind %q", f.Kind)
		}
	}
	return g, nil
}

// Int is integer field k of row i.
func (g *Gen) Int(k int, i uint64) uint64 {
	f := g.fields[k]
	if f.Kind == "int" {
		m := f.Mod
		if m == 0 {
			m = ^uint64(0)
		}
		return f.Add + i%m
	}
	return i
}

// Text is string field k of row i.
func (g *Gen) Text(k int, i uint64) string {
	f := g.fields[k]
	if f.Kind == "payload" {
		return fmt.Sprintf("%08d", i%100_000_000) + g.tail
	}
	if f.IndexSuffix {
		return f.Prefix + strconv.FormatUint(i, 10)
	}
	return f.Prefix
}

// SmallFields and LargeFields are the founding structs' field names, in order.
var (
	SmallFields = []string{"id", "name", "kind", "module", "line"}
	LargeFields = []string{"id", "name", "kind", "payload"}
)

// Small is row i of small_rows_8192.
func (g *Gen) Small(i uint64) FoundingSmall {
	return FoundingSmall{ID: g.Int(0, i), Name: g.Text(1, i), Kind: g.Text(2, i), Module: g.Text(3, i), Line: g.Int(4, i)}
}

// Large is row i of large_rows_512.
func (g *Gen) Large(i uint64) FoundingLarge {
	return FoundingLarge{ID: g.Int(0, i), Name: g.Text(1, i), Kind: g.Text(2, i), Payload: g.Text(3, i)}
}
