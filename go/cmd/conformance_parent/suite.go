package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/wirepool/wirepool/go/pool"
	"github.com/wirepool/wirepool/go/proto"
)

// obj is a JSON object of the scenario file, numbers kept as json.Number.
type obj = map[string]any

func str(o obj, k string) string { s, _ := o[k].(string); return s }

type suite struct {
	codes    map[string]int
	defaults obj
	health   obj
}

func loadSuite(raw []byte) (*suite, []obj, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var doc struct {
		ErrorCodes map[string]int `json:"error_codes"`
		Defaults   obj            `json:"defaults"`
		Health     obj            `json:"health_check"`
		Scenarios  []obj          `json:"scenarios"`
	}
	if err := d.Decode(&doc); err != nil {
		return nil, nil, err
	}
	return &suite{codes: doc.ErrorCodes, defaults: doc.Defaults, health: doc.Health}, doc.Scenarios, nil
}

// setting is the scenario's key, else the file's default.
func (s *suite) setting(sc obj, key string) any {
	if v, ok := sc[key]; ok {
		return v
	}
	return s.defaults[key]
}

// poolConfig is defaults.pool overridden by the scenario's pool.
func (s *suite) poolConfig(sc obj) obj {
	cfg := obj{}
	if d, ok := s.defaults["pool"].(obj); ok {
		for k, v := range d {
			cfg[k] = v
		}
	}
	if p, ok := sc["pool"].(obj); ok {
		for k, v := range p {
			cfg[k] = v
		}
	}
	return cfg
}

func (s *suite) code(name any) (proto.ErrorCode, error) {
	switch v := name.(type) {
	case json.Number:
		n, err := v.Int64()
		return proto.ErrorCode(n), err
	case string:
		if c, ok := s.codes[v]; ok {
			return proto.ErrorCode(c), nil
		}
	}
	return 0, failf("unknown error code name %v", name)
}

func num(v any) float64 {
	if n, ok := v.(json.Number); ok {
		f, _ := n.Float64()
		return f
	}
	return 0
}

func integer(v any) int { return int(num(v)) }

func dur(v any) time.Duration { return time.Duration(num(v) * float64(time.Second)) }

// ms is a duration in milliseconds; 0 stays 0 (the caller decides what it means).
func ms(v any) time.Duration { return time.Duration(num(v) * float64(time.Millisecond)) }

// opt is a setting given as a number (a JSON number of the file, in unit), else unset: the
// pool's default.
func opt[T int | int64 | time.Duration](v any, unit float64) pool.Optional[T] {
	if _, ok := v.(json.Number); !ok {
		return pool.Optional[T]{}
	}
	return pool.Set(T(num(v) * unit))
}

// options maps a scenario's pool settings onto pool.Options.
func options(cfg obj, worker []string, env []string) pool.Options {
	s, one := float64(time.Second), 1.0
	o := pool.Options{
		Command:        worker,
		Env:            env,
		Workers:        opt[int](cfg["workers"], one),
		MaxInFlight:    opt[int](cfg["max_in_flight"], one),
		StartupTimeout: opt[time.Duration](cfg["startup_timeout_s"], s),
		Heartbeat:      ms(cfg["heartbeat_ms"]),
		CancelGrace:    opt[time.Duration](cfg["cancel_grace_s"], s),
		DeadlineGrace:  opt[time.Duration](cfg["deadline_grace_s"], s),
		DrainGrace:     opt[time.Duration](cfg["drain_grace_s"], s),
		MaxFrameSize:   opt[int](cfg["max_frame_size"], one),
		InitialCredit:  opt[int](cfg["window"], one),
		MaxRequests:    opt[int](cfg["max_requests"], one),
		Remote:         listener,
	}
	if v, ok := cfg["heartbeat_ms"]; ok && num(v) == 0 {
		o.Heartbeat = pool.NoHeartbeat
	}
	if v, ok := cfg["max_message_size"].(json.Number); ok {
		n, _ := v.Int64()
		o.MaxMessageSize = pool.Set(n)
	}
	return o
}

// workerEnv is the scenario's worker_env, "{tmp}" replaced by its fresh directory.
func workerEnv(sc obj, tmp string) []string {
	extra, _ := sc["worker_env"].(obj)
	var env []string
	for k, v := range extra {
		text := fmt.Sprint(v)
		env = append(env, k+"="+strings.ReplaceAll(text, "{tmp}", tmp))
	}
	return env
}

// codecOf is a scenario's codec by name (json when absent).
func codecOf(name string) (pool.Codec, error) {
	switch name {
	case "", "json":
		return pool.JSON, nil
	case "raw":
		return pool.Raw, nil
	case "msgpack":
		return pool.Msgpack, nil
	case "cbor":
		return pool.CBOR, nil
	}
	return 0, failf("unknown codec %q", name)
}

// pattern is the body of {"bytes": {"size": N}}: byte i is (31 i + 17) mod 251.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((31*i + 17) % 251)
	}
	return b
}

// patternString is the text of {"string": {"size": N}}: character i is 'a' + (31 i + 17) mod 26.
func patternString(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + (31*i+17)%26)
	}
	return string(b)
}

// request is the body of a request form, as the value to encode (raw forms as []byte).
func request(form any) (any, error) {
	f, _ := form.(obj)
	switch {
	case f == nil:
	case f["value"] != nil || hasKey(f, "value"):
		return native(f["value"]), nil
	case f["bytes"] != nil:
		return pattern(integer(f["bytes"].(obj)["size"])), nil
	case f["string"] != nil:
		return patternString(integer(f["string"].(obj)["size"])), nil
	case f["text"] != nil:
		return []byte(str(f, "text")), nil
	}
	return nil, failf("unknown request form %v", form)
}

func hasKey(o obj, k string) bool { _, ok := o[k]; return ok }

// native turns the file's json.Numbers into Go numbers the codecs encode as numbers: int64,
// uint64 above it, else float64.
func native(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i
		}
		if u, err := strconv.ParseUint(string(x), 10, 64); err == nil {
			return u
		}
		f, _ := x.Float64()
		return f
	case obj:
		m := make(obj, len(x))
		for k, e := range x {
			m[k] = native(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = native(e)
		}
		return l
	}
	return v
}

// canon is a value in one form whatever codec decoded it, for equality as JSON has it: every
// number as its exact decimal (1 == 1.0, true != 1), maps with string keys, bytes as bytes.
func canon(v any) any {
	switch x := v.(type) {
	case nil, bool, string:
		return x
	case []byte:
		return "bytes:" + string(x)
	case json.Number:
		if i, ok := new(big.Int).SetString(string(x), 10); ok {
			return "n:" + i.String()
		}
		f, _ := x.Float64()
		return canonFloat(f)
	case float32:
		return canonFloat(float64(x))
	case float64:
		return canonFloat(x)
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = canon(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = canon(e)
		}
		return l
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "n:" + strconv.FormatInt(r.Int(), 10)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "n:" + strconv.FormatUint(r.Uint(), 10)
	case reflect.Map:
		m := map[string]any{}
		for _, k := range r.MapKeys() {
			m[fmt.Sprint(k.Interface())] = canon(r.MapIndex(k).Interface())
		}
		return m
	case reflect.Slice:
		l := make([]any, r.Len())
		for i := range l {
			l[i] = canon(r.Index(i).Interface())
		}
		return l
	}
	return fmt.Sprintf("%T:%v", v, v)
}

func canonFloat(f float64) any {
	if f == math.Trunc(f) && !math.IsInf(f, 0) {
		if i, acc := new(big.Float).SetFloat64(f).Int(nil); acc == big.Exact {
			return "n:" + i.String()
		}
	}
	return "n:" + strconv.FormatFloat(f, 'g', -1, 64)
}

func same(a, b any) bool { return reflect.DeepEqual(canon(a), canon(b)) }

// describe is a short text for a value in a failure's detail.
func describe(v any) string {
	switch x := v.(type) {
	case []byte:
		return fmt.Sprintf("%d bytes", len(x))
	case string:
		if len(x) > 64 {
			return fmt.Sprintf("a string of %d characters", len(x))
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// sameBody fails unless got is the body want.
func sameBody(want, got any) error {
	if w, ok := want.([]byte); ok {
		g, ok := got.([]byte)
		if !ok {
			return failf("expected %d bytes, got %s", len(w), describe(got))
		}
		if !bytes.Equal(w, g) {
			i := 0
			for i < len(w) && i < len(g) && w[i] == g[i] {
				i++
			}
			return failf("expected %d bytes, got %d bytes differing from offset %d", len(w), len(g), i)
		}
		return nil
	}
	if !same(want, got) {
		return failf("expected %s, got %s", describe(want), describe(got))
	}
	return nil
}

// liveChildren is our child processes that have not exited (zombies excluded): the workers.
func liveChildren() []int {
	me := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+2:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(me) && fields[0] != "Z" {
			found = append(found, pid)
		}
	}
	return found
}
