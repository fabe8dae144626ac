package proto

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"testing"
)

const specDir = "../../spec"

func loadJSON(t testing.TB, name string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(specDir, name))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// normalize makes a value comparable with one loaded by loadJSON.
func normalize(v any) any {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		panic(err)
	}
	return out
}

func same(a, b any) bool { return reflect.DeepEqual(normalize(a), normalize(b)) }

var marshalled sync.Map // *[]any element (an expected list from loadJSON) -> its JSON

// sameJSON compares got with want (a list loaded by loadJSON) by their JSON text: encoding/json
// sorts map keys and writes json.Number as it was read, so equal values give equal text.
func sameJSON(got any, want []any) bool {
	g, err := json.Marshal(got)
	if err != nil {
		panic(err)
	}
	if len(want) == 0 {
		return string(g) == "[]"
	}
	w, ok := marshalled.Load(&want[0])
	if !ok {
		raw, err := json.Marshal(digested(want))
		if err != nil {
			panic(err)
		}
		w = raw
		marshalled.Store(&want[0], raw)
	}
	return bytes.Equal(g, w.([]byte))
}

func num(v any) uint64 {
	n, err := strconv.ParseUint(v.(json.Number).String(), 10, 64)
	if err != nil {
		panic(err)
	}
	return n
}

func inum(v any) int64 {
	n, err := v.(json.Number).Int64()
	if err != nil {
		panic(err)
	}
	return n
}

var unhexed sync.Map // hex text -> bytes (read only: the vectors are replayed many times)

func unhex(v any) []byte {
	if b, ok := unhexed.Load(v.(string)); ok {
		return b.([]byte)
	}
	b, err := hex.DecodeString(v.(string))
	if err != nil {
		panic(err)
	}
	unhexed.Store(v.(string), b)
	return b
}

var kindNames = map[string]MethodKind{"unary": KindUnary, "stream": KindStream}

// frameFromJSON builds a Frame from a FRAME object of spec/vectors/README.md.
func frameFromJSON(m map[string]any) Frame {
	id := num(m["id"])
	more, _ := m["more"].(bool)
	switch m["type"] {
	case "HELLO":
		h := &Hello{MinVersion: uint16(num(m["min_version"])), MaxVersion: uint16(num(m["max_version"])),
			Pid: uint32(num(m["pid"])), MaxConcurrency: uint32(num(m["max_concurrency"])),
			MaxFrameSize: uint32(num(m["max_frame_size"])), SDKName: m["sdk_name"].(string),
			SDKVersion: m["sdk_version"].(string)}
		for _, x := range m["methods"].([]any) {
			mm := x.(map[string]any)
			var codecs []uint8
			for _, c := range mm["codecs"].([]any) {
				codecs = append(codecs, uint8(num(c)))
			}
			h.Methods = append(h.Methods, Method{Name: mm["name"].(string), Kind: kindNames[mm["kind"].(string)], Codecs: codecs})
		}
		return h
	case "WELCOME":
		return &Welcome{Version: uint16(num(m["version"])), WorkerID: uint32(num(m["worker_id"])),
			MaxFrameSize: uint32(num(m["max_frame_size"])), InitialCredit: uint32(num(m["initial_credit"])),
			HeartbeatMs: uint32(num(m["heartbeat_ms"])), MaxInFlight: uint32(num(m["max_in_flight"])),
			MaxMessageSize: num(m["max_message_size"])}
	case "REQUEST":
		return &Request{ID: id, More: more, Method: uint16(num(m["method"])), Codec: uint8(num(m["codec"])),
			TimeoutUs: num(m["timeout_us"]), Body: unhex(m["body"])}
	case "CANCEL":
		return &Cancel{ID: id}
	case "RESULT":
		return &Result{ID: id, More: more, Body: unhex(m["body"])}
	case "ERROR":
		return &ErrorFrame{ID: id, Code: ErrorCode(num(m["code"])), Message: m["message"].(string), Details: m["details"].(string)}
	case "ROWS":
		var rows [][]byte
		for _, r := range m["rows"].([]any) {
			rows = append(rows, unhex(r))
		}
		return &Rows{ID: id, Rows: rows}
	case "END":
		return &End{ID: id, More: more, RowCount: num(m["row_count"]), Summary: unhex(m["summary"])}
	case "CREDIT":
		return &Credit{ID: id, Bytes: uint32(num(m["bytes"]))}
	case "EVENT":
		return &Notification{ID: id, Topic: m["topic"].(string), Data: m["data"].(string)}
	case "PING":
		f := &Ping{}
		copy(f.Nonce[:], unhex(m["nonce"]))
		return f
	case "PONG":
		f := &Pong{}
		copy(f.Nonce[:], unhex(m["nonce"]))
		return f
	case "DRAIN":
		return &Drain{GraceMs: uint32(num(m["grace_ms"]))}
	case "GOODBYE":
		return &Goodbye{Reason: uint32(num(m["reason"]))}
	case "CONTINUATION":
		return &Continuation{ID: id, More: more, Body: unhex(m["body"])}
	}
	panic(fmt.Sprintf("unknown frame type %v", m["type"]))
}

// hx is bytes as the comparisons see them: hex, or for more than 256 bytes a digest (a large
// body hex-encoded on every replay of every split would dominate the tests' time).
func hx(b []byte) string {
	if len(b) > 256 {
		sum := sha256.Sum256(b)
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	return hex.EncodeToString(b)
}

// digested is a deep copy of an expected value with its long hex bytes as hx writes them.
func digested(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = digested(x)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			switch k {
			case "body", "summary", "nonce":
				out[k] = hx(unhex(x))
			case "rows":
				rows := make([]any, 0)
				for _, r := range x.([]any) {
					rows = append(rows, hx(unhex(r)))
				}
				out[k] = rows
			default:
				out[k] = digested(x)
			}
		}
		return out
	}
	return v
}

// eventJSON is an Event (or, with more, a Frame) as the vectors write it.
func eventJSON(ev any, withMore bool) map[string]any {
	m := map[string]any{}
	var more bool
	switch f := ev.(type) {
	case *Hello:
		methods := []any{}
		for _, x := range f.Methods {
			codecs := []any{}
			for _, c := range x.Codecs {
				codecs = append(codecs, c)
			}
			methods = append(methods, map[string]any{"name": x.Name, "kind": x.Kind.String(), "codecs": codecs})
		}
		m = map[string]any{"min_version": f.MinVersion, "max_version": f.MaxVersion, "pid": f.Pid,
			"max_concurrency": f.MaxConcurrency, "max_frame_size": f.MaxFrameSize, "sdk_name": f.SDKName,
			"sdk_version": f.SDKVersion, "methods": methods}
	case *Welcome:
		m = map[string]any{"version": f.Version, "worker_id": f.WorkerID, "max_frame_size": f.MaxFrameSize,
			"initial_credit": f.InitialCredit, "heartbeat_ms": f.HeartbeatMs, "max_in_flight": f.MaxInFlight,
			"max_message_size": f.MaxMessageSize}
	case *Request:
		m = map[string]any{"method": f.Method, "codec": f.Codec, "timeout_us": f.TimeoutUs, "body": hx(f.Body)}
		more = f.More
	case *Cancel:
	case *Result:
		m = map[string]any{"body": hx(f.Body)}
		more = f.More
	case *ErrorFrame:
		m = map[string]any{"code": uint32(f.Code), "message": f.Message, "details": f.Details}
	case *Rows:
		rows := []any{}
		for _, r := range f.Rows {
			rows = append(rows, hx(r))
		}
		m = map[string]any{"rows": rows}
	case *End:
		m = map[string]any{"row_count": f.RowCount, "summary": hx(f.Summary)}
		more = f.More
	case *Credit:
		m = map[string]any{"bytes": f.Bytes}
	case *Notification:
		m = map[string]any{"topic": f.Topic, "data": f.Data}
	case *Ping:
		m = map[string]any{"nonce": hx(f.Nonce[:])}
	case *Pong:
		m = map[string]any{"nonce": hx(f.Nonce[:])}
	case *Drain:
		m = map[string]any{"grace_ms": f.GraceMs}
	case *Goodbye:
		m = map[string]any{"reason": f.Reason}
	case *Continuation:
		m = map[string]any{"body": hx(f.Body)}
		more = f.More
	case *Late:
		return map[string]any{"type": "LATE", "id": f.ID, "frame": f.Frame.String()}
	case *Reject:
		return map[string]any{"type": "REJECT", "id": f.ID, "code": uint32(f.Code), "name": f.Code.String()}
	default:
		panic(fmt.Sprintf("unexpected %T", ev))
	}
	fr := ev.(Frame)
	m["type"] = fr.Type().String()
	m["id"] = fr.RequestID()
	if withMore {
		m["more"] = more
	}
	return m
}

// errJSON is an error as the vectors write it: null or {"code", "name"}.
func errJSON(err error) any {
	if err == nil {
		return nil
	}
	pe, ok := err.(*ProtocolError)
	if !ok {
		return map[string]any{"code": -1, "name": err.Error()}
	}
	return map[string]any{"code": uint32(pe.Code), "name": pe.Name()}
}

// sameErr compares an error with a vector's "error" (null or {"code", "name"}).
func sameErr(err error, want any) bool {
	if want == nil || err == nil {
		return want == nil && err == nil
	}
	pe, ok := err.(*ProtocolError)
	w := want.(map[string]any)
	return ok && uint64(pe.Code) == num(w["code"]) && pe.Name() == w["name"]
}

// positions are the split points the split rule asks for (section 16): every one up to 4,096
// bytes; above, every position within 32 bytes of a frame boundary and a sample in between.
func positions(data []byte) []int {
	if len(data) <= 4096 {
		out := make([]int, 0, len(data))
		for k := 1; k < len(data); k++ {
			out = append(out, k)
		}
		return out
	}
	set := map[int]bool{}
	add := func(k int) {
		if k > 0 && k < len(data) {
			set[k] = true
		}
	}
	for _, b := range boundaries(data) {
		for d := -32; d <= 32; d++ {
			add(b + d)
		}
	}
	for k := 1; k < len(data); k += 997 {
		add(k)
	}
	out := make([]int, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	return out
}

// boundaries are the frame boundaries of data, as far as its headers can be read.
func boundaries(data []byte) []int {
	out := []int{0}
	pos := 0
	for pos+HeaderSize <= len(data) {
		n := int(uint32(data[pos]) | uint32(data[pos+1])<<8 | uint32(data[pos+2])<<16 | uint32(data[pos+3])<<24)
		pos += HeaderSize
		out = append(out, pos)
		if n > len(data)-pos {
			break
		}
		pos += n
		out = append(out, pos)
	}
	return out
}

// chunkings: whole, split in two at every position (sampled above 4 KiB), one byte at a time.
func chunkings(data []byte) [][][]byte {
	out := [][][]byte{{data}}
	for _, k := range positions(data) {
		out = append(out, [][]byte{data[:k], data[k:]})
	}
	if len(data) > 1 {
		bytesAtATime := make([][]byte, len(data))
		for i := range data {
			bytesAtATime[i] = data[i : i+1]
		}
		out = append(out, bytesAtATime)
	}
	return out
}
