package codec_test

import (
	"encoding/json"
	"math"
	"testing"

	"go.uber.org/goleak"

	"github.com/wirepool/wirepool/go/codec"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRoundTrips(t *testing.T) {
	value := map[string]any{"s": "h\u00e9llo", "u": uint64(math.MaxUint64), "i": int64(math.MinInt64), "f": 1.5, "l": []any{true, nil}}
	for _, c := range []codec.Codec{codec.JSON, codec.Msgpack, codec.CBOR} {
		b, err := codec.Encode(c, value)
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		var back any
		if err := codec.Decode(c, b, &back); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		m, ok := back.(map[string]any)
		if !ok || m["s"] != "h\u00e9llo" {
			t.Fatalf("%s: %#v", c, back)
		}
		switch u := m["u"].(type) {
		case json.Number:
			if u.String() != "18446744073709551615" {
				t.Fatalf("%s: %v", c, u)
			}
		case uint64:
			if u != math.MaxUint64 {
				t.Fatalf("%s: %v", c, u)
			}
		default:
			t.Fatalf("%s: u64 max decoded as %T", c, u)
		}
	}
}

func TestRawAndBytes(t *testing.T) {
	if b, err := codec.Encode(codec.Raw, "text"); err != nil || string(b) != "text" {
		t.Fatalf("%q %v", b, err)
	}
	if _, err := codec.Encode(codec.Raw, 12); err == nil {
		t.Fatal("an int under raw")
	}
	// Bytes pass through whatever the codec; []byte only under Raw.
	if b, _ := codec.Encode(codec.JSON, codec.Bytes("{}")); string(b) != "{}" {
		t.Fatalf("Bytes under JSON: %q", b)
	}
	if b, _ := codec.Encode(codec.JSON, []byte("{}")); string(b) != `"e30="` {
		t.Fatalf("[]byte under JSON: %q", b)
	}
	var v any
	if err := codec.Decode(codec.Raw, []byte{1, 2}, &v); err != nil || len(v.([]byte)) != 2 {
		t.Fatalf("raw into any: %v %v", v, err)
	}
	var s string
	if err := codec.Decode(codec.JSON, []byte(`"a" "b"`), &s); err == nil {
		t.Fatal("trailing JSON accepted")
	}
	if err := codec.Decode(codec.Codec(9), []byte("x"), &s); err == nil || codec.Codec(9).String() != "codec 9" {
		t.Fatalf("codec 9: %v", err)
	}
	if !codec.IsBytes[codec.Bytes]() || codec.IsBytes[string]() {
		t.Fatal("IsBytes")
	}
}
