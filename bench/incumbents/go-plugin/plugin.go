package main

// The plugin side and the two protocols' plumbing: one plugin ("bench") offering the same
// functions as the wirepool bench workers, served over gRPC (a hand-written grpc.ServiceDesc
// whose messages are wrapperspb.BytesValue / UInt64Value: no protoc) and over net/rpc (gob).

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/rpc"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wirepool/wirepool/bench/runners/go/kit"
)

// Handshake is the plugin's handshake (go-plugin's magic cookie).
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "WIREPOOL_BENCH_PLUGIN",
	MagicCookieValue: "bench",
}

// Batch is how many rows travel in one message (batched by hand, as the other incumbents).
const Batch = 256

// impl is what the plugin does, whatever the protocol.
type impl struct{ spinMu sync.Mutex }

func threadCPUNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

// spin burns us of CPU time, one task at a time per plugin process (as every bench worker).
func (m *impl) spin(us uint64) uint64 {
	m.spinMu.Lock()
	defer m.spinMu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	end := threadCPUNs() + int64(us)*1000
	for threadCPUNs() < end {
	}
	return us
}

var (
	gensMu sync.Mutex
	gens   = map[string]*kit.Gen{}
)

func gen(shape string, fields []string) *kit.Gen {
	gensMu.Lock()
	defer gensMu.Unlock()
	if g, ok := gens[shape]; ok {
		return g
	}
	g, err := kit.NewGen(shape, fields)
	if err != nil {
		panic(err)
	}
	gens[shape] = g
	return g
}

var largeTail = strings.Repeat("x", kit.LargeTail)

// row is row i of shape, made one at a time in the plugin.
func row(shape string, i uint64) any {
	switch shape {
	case "small_rows":
		return kit.SmallRow{I: i, Name: "decl_" + strconv.FormatUint(i, 10), Kind: "theorem"}
	case "large_rows":
		return kit.LargeRow{I: i, Name: "decl_" + strconv.FormatUint(i, 10), Kind: "theorem",
			Blob: fmt.Sprintf("%08d", i%100_000_000) + largeTail}
	case kit.FoundingSmallShape:
		return gen(shape, kit.SmallFields).Small(i)
	case kit.FoundingLargeShape:
		return gen(shape, kit.LargeFields).Large(i)
	}
	panic("unknown shape " + shape)
}

// ---- gRPC ----

const service = "wirepool.bench.Bench"

type grpcService interface{}

func unaryBytes(f func([]byte) []byte) grpc.MethodHandler {
	return func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.BytesValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		return wrapperspb.Bytes(f(in.Value)), nil
	}
}

func serviceDesc(m *impl) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: service,
		HandlerType: (*grpcService)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "Echo", Handler: unaryBytes(func(b []byte) []byte { return b })},
			{MethodName: "Oneway", Handler: unaryBytes(func(b []byte) []byte {
				return binary.LittleEndian.AppendUint64(nil, uint64(len(b)))
			})},
			{MethodName: "Spin", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.UInt64Value)
				if err := dec(in); err != nil {
					return nil, err
				}
				return wrapperspb.UInt64(m.spin(in.Value)), nil
			}},
		},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Rows",
			ServerStreams: true,
			// The request: {"shape", "n"} as JSON; each answer: a JSON array of up to Batch rows.
			Handler: func(_ any, stream grpc.ServerStream) error {
				in := new(wrapperspb.BytesValue)
				if err := stream.RecvMsg(in); err != nil {
					return err
				}
				var req kit.RowsReq
				if err := json.Unmarshal(in.Value, &req); err != nil {
					return err
				}
				batch := make([]any, 0, Batch)
				flush := func() error {
					b, err := json.Marshal(batch)
					if err != nil {
						return err
					}
					batch = batch[:0]
					return stream.SendMsg(wrapperspb.Bytes(b))
				}
				for i := range req.N {
					batch = append(batch, row(req.Shape, i))
					if len(batch) == Batch {
						if err := flush(); err != nil {
							return err
						}
					}
				}
				if len(batch) > 0 {
					return flush()
				}
				return nil
			},
		}},
	}
}

var rowsDesc = &grpc.StreamDesc{StreamName: "Rows", ServerStreams: true}

// GRPCClient is the host's handle over gRPC.
type GRPCClient struct{ cc *grpc.ClientConn }

func (c *GRPCClient) Echo(b []byte) ([]byte, error) {
	out := new(wrapperspb.BytesValue)
	err := c.cc.Invoke(context.Background(), "/"+service+"/Echo", wrapperspb.Bytes(b), out)
	return out.Value, err
}

func (c *GRPCClient) Oneway(b []byte) (uint64, error) {
	out := new(wrapperspb.BytesValue)
	if err := c.cc.Invoke(context.Background(), "/"+service+"/Oneway", wrapperspb.Bytes(b), out); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(out.Value), nil
}

func (c *GRPCClient) Spin(us uint64) (uint64, error) {
	out := new(wrapperspb.UInt64Value)
	err := c.cc.Invoke(context.Background(), "/"+service+"/Spin", wrapperspb.UInt64(us), out)
	return out.Value, err
}

// ---- net/rpc ----

// RPCServer is the plugin's net/rpc receiver (go-plugin registers it as "Plugin").
type RPCServer struct{ m *impl }

// Page asks net/rpc for rows [Start, Start+Count) of a shape (net/rpc has no streams).
type Page struct {
	Shape        string
	Start, Count uint64
}

func (s *RPCServer) Echo(b []byte, out *[]byte) error { *out = b; return nil }
func (s *RPCServer) Oneway(b []byte, out *uint64) error {
	*out = uint64(len(b))
	return nil
}
func (s *RPCServer) Spin(us uint64, out *uint64) error { *out = s.m.spin(us); return nil }

func page[T any](p Page, out *[]T) error {
	rows := make([]T, 0, p.Count)
	for i := p.Start; i < p.Start+p.Count; i++ {
		rows = append(rows, row(p.Shape, i).(T))
	}
	*out = rows
	return nil
}

func (s *RPCServer) RowsSmall(p Page, out *[]kit.SmallRow) error          { return page(p, out) }
func (s *RPCServer) RowsLarge(p Page, out *[]kit.LargeRow) error          { return page(p, out) }
func (s *RPCServer) FoundingSmall(p Page, out *[]kit.FoundingSmall) error { return page(p, out) }
func (s *RPCServer) FoundingLarge(p Page, out *[]kit.FoundingLarge) error { return page(p, out) }

// RPCClient is the host's handle over net/rpc.
type RPCClient struct{ c *rpc.Client }

func (c *RPCClient) Echo(b []byte) ([]byte, error) {
	var out []byte
	err := c.c.Call("Plugin.Echo", b, &out)
	return out, err
}

func (c *RPCClient) Oneway(b []byte) (uint64, error) {
	var out uint64
	err := c.c.Call("Plugin.Oneway", b, &out)
	return out, err
}

func (c *RPCClient) Spin(us uint64) (uint64, error) {
	var out uint64
	err := c.c.Call("Plugin.Spin", us, &out)
	return out, err
}

// ---- the plugin ----

// BenchPlugin serves impl over both protocols; the host picks one (AllowedProtocols).
type BenchPlugin struct{ m *impl }

func (p *BenchPlugin) Server(*plugin.MuxBroker) (any, error) { return &RPCServer{m: p.m}, nil }
func (p *BenchPlugin) Client(_ *plugin.MuxBroker, c *rpc.Client) (any, error) {
	return &RPCClient{c: c}, nil
}
func (p *BenchPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(serviceDesc(p.m), nil)
	return nil
}
func (p *BenchPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return &GRPCClient{cc: cc}, nil
}

// Bench is the unary functions, whatever the protocol.
type Bench interface {
	Echo([]byte) ([]byte, error)
	Oneway([]byte) (uint64, error)
	Spin(uint64) (uint64, error)
}

// servePlugin serves the plugin over gRPC or net/rpc: go-plugin's server picks gRPC whenever
// GRPCServer is set and the plugin is a GRPCPlugin, so net/rpc is served without one.
func servePlugin(overGRPC bool) {
	cfg := &plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         map[string]plugin.Plugin{"bench": &BenchPlugin{m: &impl{}}},
	}
	if overGRPC {
		// 1 GiB messages (W3's largest payload is 256 MiB); go-plugin's client already allows
		// math.MaxInt32 both ways.
		cfg.GRPCServer = func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(1<<30), grpc.MaxSendMsgSize(1<<30))...)
		}
	}
	plugin.Serve(cfg)
}
