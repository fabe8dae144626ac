// Package codecbench measures the Go SDK's codec functions alone on the W4 small row (one row
// per Encode / Decode, as the worker's Rows.Send and the parent's RowStream.Next call them):
//
//	cd bench/runners/go && go test -run '^$' -bench . -benchmem ./codecbench
//
// The ceiling of the "small rows >= 2 M/s msgpack into structs" target: the parent must decode
// a row in under 500 ns (and the worker encode one) for a stream to reach 2 M rows/s.
package codecbench

import (
	"strconv"
	"testing"

	"github.com/wirepool/wirepool/bench/runners/go/kit"
	"github.com/wirepool/wirepool/go/codec"
)

func row(i uint64) kit.SmallRow {
	return kit.SmallRow{I: i, Name: "decl_" + strconv.FormatUint(i, 10), Kind: "theorem"}
}

func benchEncode(b *testing.B, c codec.Codec) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := codec.Encode(c, row(uint64(i))); err != nil {
			b.Fatal(err)
		}
	}
}

func benchDecode(b *testing.B, c codec.Codec) {
	body, err := codec.Encode(c, row(40000))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		var r kit.SmallRow
		if err := codec.Decode(c, body, &r); err != nil || r.I != 40000 {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeMsgpack(b *testing.B) { benchEncode(b, codec.Msgpack) }
func BenchmarkDecodeMsgpack(b *testing.B) { benchDecode(b, codec.Msgpack) }
func BenchmarkEncodeJSON(b *testing.B)    { benchEncode(b, codec.JSON) }
func BenchmarkDecodeJSON(b *testing.B)    { benchDecode(b, codec.JSON) }
func BenchmarkEncodeCBOR(b *testing.B)    { benchEncode(b, codec.CBOR) }
func BenchmarkDecodeCBOR(b *testing.B)    { benchDecode(b, codec.CBOR) }
