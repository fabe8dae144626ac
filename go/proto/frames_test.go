package proto

import (
	"bytes"
	"testing"
)

func decodeChunks(max uint32, chunks [][]byte) ([]any, error) {
	d := NewDecoder(max)
	frames := []any{}
	for _, ch := range chunks {
		_, _ = d.Write(ch)
		for {
			f, _, err := d.Next()
			if err != nil {
				return frames, err
			}
			if f == nil {
				break
			}
			frames = append(frames, eventJSON(f, true))
		}
	}
	return frames, d.End()
}

func TestFrameVectors(t *testing.T) {
	cases := loadJSON(t, "vectors/frames.json")["cases"].([]any)
	passed := 0
	for _, x := range cases {
		c := x.(map[string]any)
		name := c["name"].(string)
		data := unhex(c["hex"])
		max := uint32(num(c["max_frame_size"]))
		want := c["frames"].([]any)
		wantErr := c["error"]
		ok := true
		for _, chunks := range chunkings(data) {
			frames, err := decodeChunks(max, chunks)
			if !sameJSON(frames, want) || !sameErr(err, wantErr) {
				t.Errorf("%s (%d chunks): got %v, error %v; want %v, error %v", name, len(chunks), frames, errJSON(err), want, wantErr)
				ok = false
				break
			}
		}
		if wantErr == nil && c["decode_only"] != true {
			var out []byte
			for _, fr := range want {
				var err error
				if out, err = AppendFrame(out, frameFromJSON(fr.(map[string]any))); err != nil {
					t.Errorf("%s: encode: %v", name, err)
				}
			}
			if !bytes.Equal(out, data) {
				t.Errorf("%s: encoded %x, want %x", name, out, data)
				ok = false
			}
		}
		if ok {
			passed++
		}
	}
	t.Logf("frames.json: %d of %d cases pass", passed, len(cases))
}

// A large frame fed in small pieces (TLS records) is given its room once its header is in,
// not copied whole at every piece: a 10 MB request in 16 KiB writes replaces the buffer at most
// a few times (it was ~600, each copying everything unread: the Go worker stalled on it).
func TestDecoderWriteReservesTheWholeFrame(t *testing.T) {
	body := bytes.Repeat([]byte{7}, 10_000_000)
	frame, err := AppendFrame(nil, &Request{ID: 1, Method: 0, Codec: 0, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	d := NewDecoder(16 << 20)
	replaced := 0
	for at := 0; at < len(frame); at += 16 << 10 {
		before := cap(d.buf)
		_, _ = d.Write(frame[at:min(at+16<<10, len(frame))])
		if cap(d.buf) != before {
			replaced++
		}
	}
	if replaced > 3 {
		t.Fatalf("the buffer was replaced %d times for one frame", replaced)
	}
	f, _, err := d.Next()
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := f.(*Request); !ok || !bytes.Equal(r.Body, body) {
		t.Fatalf("got %T, body changed", f)
	}
}
