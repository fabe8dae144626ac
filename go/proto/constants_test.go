package proto

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// lookup follows a constantPaths path (a.b[1], sdk_defaults.SIDE.NAME.LANGUAGE) in constants.json.
func lookup(root map[string]any, path string) (any, bool) {
	if strings.HasPrefix(path, "sdk_defaults.") {
		parts := strings.Split(path, ".")
		for _, d := range root["sdk_defaults"].([]any) {
			m := d.(map[string]any)
			if m["side"] == parts[1] && m["name"] == parts[2] && m["language"] == parts[3] {
				return m["value"], true
			}
		}
		return nil, false
	}
	var cur any = root
	for _, part := range strings.Split(path, ".") {
		index := -1
		if i := strings.IndexByte(part, '['); i >= 0 {
			index, _ = strconv.Atoi(part[i+1 : len(part)-1])
			part = part[:i]
		}
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
		if index >= 0 {
			cur = cur.([]any)[index]
		}
	}
	return cur, true
}

func TestConstantsMatchSpec(t *testing.T) {
	c := loadJSON(t, "constants.json")
	for _, p := range constantPaths {
		want, ok := lookup(c, p.Path)
		if !ok {
			t.Errorf("%s: not in spec/constants.json", p.Path)
			continue
		}
		if fmt.Sprint(p.Value) != fmt.Sprint(want) {
			t.Errorf("%s: Go has %v, spec/constants.json %v", p.Path, p.Value, want)
		}
	}
	// Every scalar the file holds for all languages (or Go) is a Go constant.
	seen := map[string]bool{}
	for _, p := range constantPaths {
		seen[p.Path] = true
	}
	for _, section := range []string{"limits", "timing", "protocol_defaults", "caller_input"} {
		for k, v := range c[section].(map[string]any) {
			if k == "about" {
				continue
			}
			if _, isList := v.([]any); isList {
				k += "[0]"
			}
			if !seen[section+"."+k] {
				t.Errorf("%s.%s has no Go constant", section, k)
			}
		}
	}
	if Magic != c["magic"] || fmt.Sprint(HeaderSize) != fmt.Sprint(c["header"].(map[string]any)["size"]) {
		t.Error("magic or header size differ")
	}

	// Frame types and their rules.
	dirs := map[string]Direction{"worker_to_parent": WorkerToParent, "parent_to_worker": ParentToWorker, "both": BothDirections}
	ids := map[string]IDRule{"zero": IDZero, "request": IDRequest, "any": IDAny}
	checkRules := func(what string, rules []FrameRule, want []any) {
		if len(rules) != len(want) {
			t.Fatalf("%s: %d rules, spec %d", what, len(rules), len(want))
		}
		for i, x := range want {
			m := x.(map[string]any)
			r := rules[i]
			prefix, size := -1, -1
			if v, ok := m["continued_prefix"]; ok {
				prefix = int(inum(v))
			}
			if v, ok := m["payload_size"]; ok {
				size = int(inum(v))
			}
			if uint64(r.Type) != num(m["code"]) || r.Name != m["name"] || r.Direction != dirs[m["direction"].(string)] ||
				r.ID != ids[m["id"].(string)] || r.MoreAllowed != m["more_allowed"] || r.ContinuedPrefix != prefix || r.PayloadSize != size {
				t.Errorf("%s: %+v differs from %v", what, r, m)
			}
		}
	}
	checkRules("frame_types", FrameRules(), c["frame_types"].([]any))
	shm := c["extensions"].(map[string]any)["shm"].(map[string]any)
	checkRules("shm frame_types", ShmFrameRules(), shm["frame_types"].([]any))
	for _, r := range ShmFrameRules() {
		if r.Type.Rule() != nil {
			t.Errorf("%s is known to the v1 decoder", r.Name)
		}
	}

	// Error codes with class and fate, and the classes by range.
	codes := append(append([]any{}, c["error_codes"].([]any)...), shm["error_codes"].([]any)...)
	if len(codes) != len(ErrorInfos()) {
		t.Fatalf("%d error codes, spec %d", len(ErrorInfos()), len(codes))
	}
	for _, x := range codes {
		m := x.(map[string]any)
		code := ErrorCode(num(m["code"]))
		info := code.Info()
		if info == nil || info.Name != m["name"] || info.Class != m["class"] || info.Fate.String() != m["fate"] || code.String() != m["name"] {
			t.Errorf("error code %v: %+v", m, info)
		}
		if code.Class().Class != m["class"] {
			t.Errorf("error code %v: class by range %s", m, code.Class().Class)
		}
	}
	classes := c["error_classes"].([]any)
	for i, x := range classes {
		m := x.(map[string]any)
		k := ErrorClasses()[i]
		if k.Class != m["class"] || uint64(k.From) != num(m["from"]) || uint64(k.To) != num(m["to"]) || k.Sent != m["sent"] || k.Fate.String() != m["fate"] {
			t.Errorf("error class %v: %+v", m, k)
		}
	}
	if ErrorCode(50).String() != "UNKNOWN" || ErrorCode(150).String() != "PROTOCOL" || ErrorCode(5000).Class().Class != "application" {
		t.Error("codes without a name are not named by their range")
	}

	// Codecs, method kinds, goodbye reasons.
	for _, x := range c["codecs"].([]any) {
		m := x.(map[string]any)
		want := map[string]int{"raw": CodecRaw, "json": CodecJSON, "msgpack": CodecMsgpack, "cbor": CodecCBOR,
			"arrow_ipc": CodecArrowIPC, "protobuf": CodecProtobuf}[m["name"].(string)]
		if uint64(want) != num(m["id"]) {
			t.Errorf("codec %v", m)
		}
	}
	kinds := c["method_kinds"].(map[string]any)
	if num(kinds["unary"]) != uint64(KindUnary) || num(kinds["stream"]) != uint64(KindStream) {
		t.Error("method kinds")
	}
	reasons := c["goodbye_reasons"].(map[string]any)
	if num(reasons["drained"]) != GoodbyeDrained || num(reasons["parent_gone"]) != GoodbyeParentGone ||
		num(reasons["leaving"]) != GoodbyeLeaving || num(reasons["fatal"]) != GoodbyeFatal {
		t.Error("goodbye reasons")
	}
}

// The core offers every operation of core_api under its Go name (14).
func TestCoreAPINames(t *testing.T) {
	c := loadJSON(t, "constants.json")["core_api"].(map[string]any)
	goName := func(snake string) string {
		var b strings.Builder
		for _, p := range strings.Split(snake, "_") {
			switch p {
			case "id":
				b.WriteString("ID")
			case "ids":
				b.WriteString("IDs")
			default:
				b.WriteString(strings.ToUpper(p[:1]) + p[1:])
			}
		}
		return b.String()
	}
	conn := reflect.TypeOf(&Connection{})
	builder := reflect.TypeOf(&RowsBuilder{})
	policies := map[string]any{"Negotiate": Negotiate, "RowsBatchBytes": RowsBatchBytes, "Grant": Grant, "FitError": FitError,
		"StreamWindow": StreamWindow}
	for _, list := range CoreAPI {
		want := c[list.List].([]any)
		if len(want) != len(list.Names) {
			t.Errorf("core_api %s: %d names, spec %d", list.List, len(list.Names), len(want))
		}
		for i, n := range want {
			name := goName(n.(string))
			if list.Names[i] != name {
				t.Errorf("core_api %s: generated %s, spec %s", list.List, list.Names[i], name)
			}
			var ok bool
			switch list.List {
			case "rows_builder":
				_, ok = builder.MethodByName(name)
			case "policies":
				ok = policies[name] != nil
			case "batch":
				_, ok = conn.MethodByName(name)
				if !ok {
					_, ok = builder.MethodByName(name)
				}
				if !ok && (name == "TakeResults" || name == "TakeRequests") {
					t.Logf("core_api batch %s: not offered (optional, 14.4)", name)
					continue
				}
			default:
				_, ok = conn.MethodByName(name)
			}
			if !ok {
				t.Errorf("core_api %s: the core has no %s", list.List, name)
			}
		}
	}
}

func TestProtocolErrorIsAs(t *testing.T) {
	var err error = fmt.Errorf("wrapped: %w", errf(CodeUnknownID, "id 7"))
	var pe *ProtocolError
	if !errors.As(err, &pe) || pe.Code != CodeUnknownID || pe.Name() != "UNKNOWN_ID" {
		t.Fatalf("errors.As: %v", err)
	}
	if !errors.Is(err, ErrUnknownID) || errors.Is(err, ErrDuplicateID) {
		t.Fatal("errors.Is compares codes")
	}
}
