// Package worker is the wirepool worker driver for Go (PROTOCOL.md sections 1, 6, 8): a child
// process started by a wirepool parent (Rust, Python, Node) exposes typed methods over the
// connection it inherits in WIREPOOL_FD, or, on another machine, over the TLS connection it
// makes to its parent with the join ticket in WIREPOOL_TICKET (PROTOCOL.md 21).
//
//	w := worker.New()
//	worker.Method(w, "add", func(ctx context.Context, req AddReq) (AddResp, error) { ... })
//	worker.Stream(w, "decls", func(ctx context.Context, req DeclsReq, rows *worker.Rows[Decl]) (Summary, error) { ... })
//	if err := w.Serve(context.Background()); err != nil { os.Exit(1) }
//
// Handlers run on goroutines of their own, up to the parent's max_in_flight at once; the I/O
// goroutine answers PING, REJECTs, CANCEL and CREDIT meanwhile. A handler's context is
// cancelled by CANCEL, by its deadline (timeout_us) and by DRAIN past its grace; its cause is
// an Error with the code the request ends with.
package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/wirepool/wirepool/go/codec"
	"github.com/wirepool/wirepool/go/proto"
)

// SDKName and SDKVersion are what HELLO says this SDK is.
const (
	SDKName    = "wirepool-go"
	SDKVersion = "0.1.0"
)

// maxHandedAhead is driver.max_handed_ahead_bytes of spec/constants.json (8.5): the output
// handed to the writer goroutine at once (whole frames, the one reaching it included).
const maxHandedAhead = 4_194_304

// readChunk is the size of one socket read.
const readChunk = 256 << 10

// Option configures a Worker.
type Option func(*Worker)

// WithMaxConcurrency sets HELLO's max_concurrency (default 64, section 17).
func WithMaxConcurrency(n uint32) Option { return func(w *Worker) { w.maxConcurrency = n } }

// WithMaxFrameSize sets HELLO's max_frame_size (default 16 MiB, section 17).
func WithMaxFrameSize(n uint32) Option { return func(w *Worker) { w.maxFrameSize = n } }

// WithRowsBatchBytes sets the preferred ROWS batch size (default 64 KiB, section 17); the core's
// RowsBatchBytes fits it to the connection.
func WithRowsBatchBytes(n int) Option { return func(w *Worker) { w.rowsBatch = n } }

// WithRowsFlushInterval sets how long a row may wait for a fuller batch (default 2 ms, under
// the flush bound of 10 ms, section 6).
func WithRowsFlushInterval(d time.Duration) Option { return func(w *Worker) { w.flushEvery = d } }

// WithConn serves on conn instead of the connection inherited in WIREPOOL_FD (tests, or a
// launcher that made the connection itself). No parent-death signal is asked for.
func WithConn(conn net.Conn) Option { return func(w *Worker) { w.conn = conn } }

// WithTicket joins a remote pool with the ticket's text form (PROTOCOL.md 21) instead of the
// connection inherited in WIREPOOL_FD or a ticket in WIREPOOL_TICKET / WIREPOOL_TICKET_FILE.
func WithTicket(text string) Option { return func(w *Worker) { w.ticketText = &text } }

// WithName sets HELLO's sdk_name (default "wirepool-go").
func WithName(name string) Option { return func(w *Worker) { w.name = name } }

// MethodOption configures one method.
type MethodOption func(*method)

// Codecs sets the codecs a method accepts (default: Raw for Bytes or []byte requests, JSON
// otherwise).
func Codecs(codecs ...Codec) MethodOption {
	return func(m *method) { m.codecs = append([]Codec(nil), codecs...) }
}

// runFunc runs one request on its own goroutine and reports its outcome.
type runFunc func(ctx context.Context, c *call, body []byte) outcome

type method struct {
	name   string
	kind   proto.MethodKind
	codecs []Codec
	run    runFunc
}

// Worker is a set of methods and the driver that serves them on one connection.
type Worker struct {
	name           string
	maxConcurrency uint32
	maxFrameSize   uint32
	rowsBatch      int
	flushEvery     time.Duration
	conn           net.Conn
	ticketText     *string
	welcomeWithin  time.Duration
	stderr         io.Writer
	methods        []*method
	byName         map[string]bool
	served         bool
}

// New returns a Worker with no methods; add them with Method and Stream, then Serve.
func New(opts ...Option) *Worker {
	w := &Worker{
		name:           SDKName,
		maxConcurrency: proto.WorkerDefaultMaxConcurrency,
		maxFrameSize:   proto.WorkerDefaultMaxFrameSize,
		rowsBatch:      proto.WorkerDefaultRowsBatchBytes,
		flushEvery:     proto.WorkerDefaultRowsFlushIntervalMs * time.Millisecond,
		welcomeWithin:  welcomeTimeout,
		stderr:         os.Stderr,
		byName:         map[string]bool{},
	}
	for _, o := range opts {
		o(w)
	}
	return w
}

func (w *Worker) add(m *method, opts []MethodOption) {
	if w.byName[m.name] {
		panic(fmt.Sprintf("wirepool/worker: method %q added twice", m.name))
	}
	if m.name == "" || len(m.name) > 255 {
		panic(fmt.Sprintf("wirepool/worker: method name %q must be 1-255 bytes", m.name))
	}
	for _, o := range opts {
		o(m)
	}
	if len(m.codecs) == 0 || len(m.codecs) > 16 {
		panic(fmt.Sprintf("wirepool/worker: method %q needs 1-16 codecs", m.name))
	}
	w.byName[m.name] = true
	w.methods = append(w.methods, m)
}

// Method adds a unary method: its request decoded with the request's codec into Req, its
// result encoded from Resp. An error ends the request with ERROR (see Error).
func Method[Req, Resp any](w *Worker, name string, h func(ctx context.Context, req Req) (Resp, error), opts ...MethodOption) {
	m := &method{name: name, kind: proto.KindUnary, codecs: defaultCodecs[Req]()}
	m.run = func(ctx context.Context, c *call, body []byte) (o outcome) {
		var req Req
		if err := codec.Decode(c.codec, body, &req); err != nil {
			return badRequest(c, err)
		}
		defer recoverPanic(&o)
		resp, err := h(ctx, req)
		if err != nil {
			return outcome{err: err}
		}
		b, err := codec.Encode(c.codec, resp)
		if err != nil {
			return outcome{err: Errorf(CodeHandlerError, "the result could not be encoded as %s: %v", c.codec, err)}
		}
		return outcome{body: b}
	}
	w.add(m, opts)
}

// NoSummary is the summary type of a stream whose END carries no summary (an empty one).
type NoSummary struct{}

// Stream adds a stream method: the handler sends rows with rows.Send and returns the summary
// (NoSummary for none). Every row sent goes out before END.
func Stream[Req, Row, Sum any](w *Worker, name string, h func(ctx context.Context, req Req, rows *Rows[Row]) (Sum, error), opts ...MethodOption) {
	m := &method{name: name, kind: proto.KindStream, codecs: defaultCodecs[Req]()}
	noSummary := reflect.TypeFor[Sum]() == reflect.TypeFor[NoSummary]()
	m.run = func(ctx context.Context, c *call, body []byte) (o outcome) {
		var req Req
		if err := codec.Decode(c.codec, body, &req); err != nil {
			return badRequest(c, err)
		}
		rows := &Rows[Row]{ctx: ctx, s: c.stream, codec: c.codec}
		defer recoverPanic(&o)
		sum, err := h(ctx, req, rows)
		if err != nil {
			return outcome{err: err}
		}
		if noSummary {
			return outcome{body: []byte{}}
		}
		b, err := codec.Encode(c.codec, sum)
		if err != nil {
			return outcome{err: Errorf(CodeHandlerError, "the summary could not be encoded as %s: %v", c.codec, err)}
		}
		return outcome{body: b}
	}
	w.add(m, opts)
}

func defaultCodecs[T any]() []Codec {
	if codec.IsBytes[T]() {
		return []Codec{Raw}
	}
	return []Codec{JSON}
}

func badRequest(c *call, err error) outcome {
	return outcome{err: Errorf(uint32(proto.CodeBadRequest), "the request could not be decoded as %s: %v", c.codec, err)}
}

func recoverPanic(o *outcome) {
	if r := recover(); r != nil {
		*o = outcome{err: Error{Code: CodeHandlerPanic, Message: fmt.Sprintf("the handler panicked: %v", r)}}
	}
}

// outcome is what a handler's goroutine hands the I/O goroutine: the encoded result or
// summary, or an error.
type outcome struct {
	body []byte
	err  error
}

// call is one request in flight at this worker; the I/O goroutine owns every field but stream's
// own locked state.
type call struct {
	id       uint64
	kind     proto.MethodKind
	codec    Codec
	flag     proto.ErrorCode // the cancellation flag (8.3): 0, CANCELLED or DEADLINE_EXCEEDED
	cancel   context.CancelCauseFunc
	deadline time.Time
	timer    *time.Timer
	stream   *stream
	// finished: a stream's handler returned normally; END waits for its rows to go out.
	finished bool
	summary  []byte
}

type done struct {
	c *call
	o outcome
}

// ErrNoConnection is returned by Serve when neither WithConn, WithTicket, WIREPOOL_FD nor a
// ticket in WIREPOOL_TICKET / WIREPOOL_TICKET_FILE gives it one.
var ErrNoConnection = errors.New("wirepool worker: neither WIREPOOL_FD nor WIREPOOL_TICKET is set: a worker is started by a wirepool parent, or joins one with a ticket")

// FatalError is what Serve returns after a fatal error of the connection (8.4: exit status 1).
type FatalError struct {
	Code    proto.ErrorCode
	Message string
	// Received: the parent sent ERROR id 0 (this worker detected nothing).
	Received bool
	// Refused: that ERROR came before WELCOME on a remote connection: the parent refused the
	// join or the HELLO (21.3).
	Refused bool
}

func (e *FatalError) Error() string {
	if e.Refused {
		return fmt.Sprintf("wirepool worker: the parent refused this worker (%v): %s", e.Code, e.Message)
	}
	if e.Received {
		return fmt.Sprintf("wirepool worker: the parent closed the connection with %v: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("wirepool worker: protocol violation %v: %s", e.Code, e.Message)
}

// Serve sends HELLO and serves requests until DRAIN (GOODBYE sent), end of file, ctx's end
// (GOODBYE 2 sent) or a fatal error. It returns nil in the first three cases (exit status 0,
// section 8.4) and a *FatalError otherwise (exit status 1). It does not wait for handlers that
// are still running: the program should exit when it returns (Run does).
func (w *Worker) Serve(ctx context.Context) error {
	if w.served {
		return errors.New("wirepool/worker: Serve called twice")
	}
	w.served = true
	conn := w.conn
	var remote *Ticket
	var connected time.Time
	if conn == nil {
		var err error
		if w.ticketText == nil {
			_, local := os.LookupEnv("WIREPOOL_FD")
			if !local {
				remote, err = ticketFromEnv()
				if err != nil {
					return err
				}
			}
		} else if remote, err = ParseTicket(*w.ticketText); err != nil {
			return err
		}
		if remote != nil {
			// A remote worker asks for no parent-death signal (21.1): heartbeats and end of
			// file are its notices.
			if conn, connected, err = join(ctx, remote); err != nil {
				return err
			}
		} else {
			if conn, err = inheritConn(); err != nil {
				return err
			}
			stop := parentDeathSignal()
			defer stop()
		}
	}
	d := newDriver(w, conn)
	if remote != nil {
		d.remote = true
		d.welcomeT = time.NewTimer(time.Until(connected.Add(w.welcomeWithin)))
	}
	return d.serve(ctx)
}

// Run is Serve with context.Background, then the exit of section 8.4: status 0 after a drain
// or end of file, 1 (with one line on stderr) after a fatal error.
func (w *Worker) Run() {
	if err := w.Serve(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// driver is one connection's I/O loop and the channels into it.
type driver struct {
	w        *Worker
	conn     net.Conn
	core     *proto.Connection
	calls    map[uint64]*call
	batch    int
	quit     chan struct{} // closed when serve returns
	reads    chan readChunkMsg
	free     chan []byte
	writes   chan []byte
	written  chan error
	writing  bool
	outcomes chan done
	expired  chan *call
	rowsNote chan rowsNote
	dirty    map[*stream]bool
	flushT   *time.Timer
	flushOn  bool
	drainT   *time.Timer
	// goodbyeDue: DRAIN came and the last request in flight has ended.
	goodbyeDue bool
	// A remote connection (21.5): the welcome timer, then PINGs every heartbeat and the PONG
	// clock over the ones not answered yet, oldest first.
	remote   bool
	welcomed bool
	welcomeT *time.Timer
	hb       time.Duration
	hbT      *time.Ticker
	pings    []pingSent
	nonce    uint64
	wg       sync.WaitGroup // the reader and writer goroutines
}

type pingSent struct {
	nonce [8]byte
	at    time.Time
}

type readChunkMsg struct {
	buf []byte
	n   int
	err error
}

func newDriver(w *Worker, conn net.Conn) *driver {
	d := &driver{
		w:        w,
		conn:     conn,
		core:     proto.NewConnection(proto.Worker),
		calls:    map[uint64]*call{},
		quit:     make(chan struct{}),
		reads:    make(chan readChunkMsg, 2),
		free:     make(chan []byte, 3),
		writes:   make(chan []byte, 1),
		written:  make(chan error, 1),
		outcomes: make(chan done, 64),
		expired:  make(chan *call, 16),
		rowsNote: make(chan rowsNote, 256),
		dirty:    map[*stream]bool{},
	}
	for range 3 {
		d.free <- make([]byte, readChunk)
	}
	return d
}

func (d *driver) hello() *proto.Hello {
	h := &proto.Hello{
		MinVersion:     1,
		MaxVersion:     1,
		Pid:            uint32(os.Getpid()),
		MaxConcurrency: d.w.maxConcurrency,
		MaxFrameSize:   d.w.maxFrameSize,
		SDKName:        d.w.name,
		SDKVersion:     SDKVersion,
	}
	for _, m := range d.w.methods {
		cs := make([]uint8, len(m.codecs))
		for i, c := range m.codecs {
			cs[i] = uint8(c)
		}
		h.Methods = append(h.Methods, proto.Method{Name: m.name, Kind: m.kind, Codecs: cs})
	}
	return h
}

func (d *driver) reader() {
	defer d.wg.Done()
	for {
		var buf []byte
		select {
		case buf = <-d.free:
		case <-d.quit:
			return
		}
		n, err := d.conn.Read(buf)
		select {
		case d.reads <- readChunkMsg{buf: buf, n: n, err: err}:
		case <-d.quit:
			return
		}
		if err != nil {
			return
		}
	}
}

func (d *driver) writer() {
	defer d.wg.Done()
	for {
		select {
		case b := <-d.writes:
			_, err := d.conn.Write(b)
			d.written <- err
			if err != nil {
				return
			}
		case <-d.quit:
			return
		}
	}
}

// errClosed ends the loop without an error (end of file, drain, the parent gone).
var errClosed = errors.New("closed")

func (d *driver) serve(ctx context.Context) (err error) {
	defer func() {
		for _, c := range d.calls {
			d.setFlag(c, proto.CodeCancelled)
			d.endCall(c)
		}
		close(d.quit)
		_ = d.conn.Close()
		d.wg.Wait()
		if d.flushT != nil {
			d.flushT.Stop()
		}
		if d.drainT != nil {
			d.drainT.Stop()
		}
		if d.welcomeT != nil {
			d.welcomeT.Stop()
		}
		if d.hbT != nil {
			d.hbT.Stop()
		}
		if errors.Is(err, errClosed) {
			err = nil
		}
	}()
	if err := d.core.SendHello(d.hello()); err != nil {
		return fmt.Errorf("wirepool/worker: HELLO refused by the core: %w", err)
	}
	d.wg.Add(2)
	go d.reader()
	go d.writer()
	d.flushT = time.NewTimer(time.Hour)
	d.flushT.Stop()
	var drainC, welcomeC, hbC <-chan time.Time
	for {
		if !d.writing && d.core.OutputLen() > 0 {
			d.writes <- d.core.TakeOutput(maxHandedAhead)
			d.writing = true
		}
		if d.drainT != nil {
			drainC = d.drainT.C
		}
		welcomeC, hbC = nil, nil
		if d.welcomeT != nil && !d.welcomed {
			welcomeC = d.welcomeT.C
		}
		if d.hbT != nil {
			hbC = d.hbT.C
		}
		var err error
		select {
		case r := <-d.reads:
			err = d.onRead(r)
		case werr := <-d.written:
			d.writing = false
			if werr != nil {
				return errClosed // the parent is gone: as end of file (8.4)
			}
		case dn := <-d.outcomes:
			err = d.onOutcome(dn.c, dn.o)
		case c := <-d.expired:
			err = d.onDeadline(c)
		case n := <-d.rowsNote:
			d.onRowsNote(n)
		case <-d.flushT.C:
			d.flushOn = false
			err = d.flushDirty(false)
		case <-drainC:
			err = d.drainNow()
		case <-welcomeC:
			d.say("no WELCOME within %v of connecting: the parent is gone; exiting", d.w.welcomeWithin)
			return errClosed
		case now := <-hbC:
			err = d.heartbeat(now)
		case <-ctx.Done():
			for _, c := range d.calls {
				d.setFlag(c, proto.CodeCancelled)
				_ = d.core.SendError(c.id, proto.CodeCancelled, "the worker is leaving", "")
				d.endCall(c)
			}
			_ = d.core.SendGoodbye(proto.GoodbyeLeaving)
			return d.closeOut(errClosed)
		}
		if err != nil {
			return err
		}
	}
}

func (d *driver) onRead(r readChunkMsg) error {
	if r.n > 0 {
		d.core.Receive(r.buf[:r.n])
	}
	d.free <- r.buf
	if r.n > 0 {
		if err := d.events(); err != nil {
			return err
		}
	}
	if r.err != nil {
		// End of file or a broken connection: every flag set, exit 0 (8.4). A frame cut short
		// is TRUNCATED, yet the parent is gone: nothing to report it to.
		_ = d.core.EndOfInput()
		if d.remote {
			why := "end of file"
			if !errors.Is(r.err, io.EOF) {
				why = r.err.Error()
			}
			if d.welcomed {
				d.say("the connection to the parent ended (%s); exiting", why)
			} else {
				d.say("the parent closed the connection before WELCOME (%s); exiting", why)
			}
		}
		return errClosed
	}
	return nil
}

func (d *driver) events() error {
	for {
		ev, err := d.core.NextEvent()
		if err != nil {
			var pe *proto.ProtocolError
			if !errors.As(err, &pe) {
				pe = &proto.ProtocolError{Code: proto.CodeProtocol, Message: err.Error()}
			}
			_ = d.core.SendFatal(pe)
			return d.closeOut(&FatalError{Code: pe.Code, Message: pe.Message})
		}
		if ev == nil {
			return nil
		}
		if err := d.onEvent(ev); err != nil {
			return err
		}
	}
}

func (d *driver) onEvent(ev proto.Event) error {
	switch e := ev.(type) {
	case *proto.Welcome:
		wl := d.core.Welcome()
		d.batch = int(proto.RowsBatchBytes(int64(d.w.rowsBatch), int64(wl.InitialCredit), int64(wl.MaxFrameSize)))
		d.welcomed = true
		if d.remote {
			d.startHeartbeat(wl.HeartbeatMs)
		}
	case *proto.Request:
		d.start(e)
	case *proto.Reject:
		_ = d.core.SendError(e.ID, e.Code, rejectMessage(e.Code), "")
	case *proto.Cancel:
		if c := d.calls[e.ID]; c != nil {
			d.setFlag(c, proto.CodeCancelled)
		}
	case *proto.Credit:
		if c := d.calls[e.ID]; c != nil && c.stream != nil {
			return d.flush(c)
		}
	case *proto.Ping:
		_ = d.core.SendPong(e.Nonce)
	case *proto.Drain:
		return d.onDrain(e.GraceMs)
	case *proto.ErrorFrame:
		// ERROR id 0 from the parent (a refused handshake included): fatal, exit 1 (8.4).
		return &FatalError{Code: e.Code, Message: e.Message, Received: true, Refused: d.remote && !d.welcomed}
	case *proto.Pong:
		d.onPong(e.Nonce)
	case *proto.Late:
	}
	return nil
}

func rejectMessage(code proto.ErrorCode) string {
	switch code {
	case proto.CodeUnknownMethod:
		return "no such method on this worker"
	case proto.CodeCodecUnsupported:
		return "the method does not accept this codec"
	case proto.CodeOverloaded:
		return "max_in_flight requests are already in flight"
	case proto.CodeDraining:
		return "the worker is draining"
	case proto.CodeCancelled:
		return "cancelled while its request was being received"
	}
	return code.String()
}

// maxTimeout is the largest deadline kept as a timer; a larger timeout_us (up to 2^64 - 1 µs)
// never passes in the life of a process.
const maxTimeout = 100 * 365 * 24 * time.Hour

func (d *driver) start(r *proto.Request) {
	m := d.w.methods[r.Method]
	c := &call{id: r.ID, kind: m.kind, codec: Codec(r.Codec)}
	ctx, cancel := context.WithCancelCause(context.Background())
	if r.TimeoutUs > 0 && r.TimeoutUs <= uint64(maxTimeout/time.Microsecond) {
		budget := time.Duration(r.TimeoutUs) * time.Microsecond
		c.deadline = time.Now().Add(budget)
		var cancelDeadline context.CancelFunc
		ctx, cancelDeadline = context.WithDeadlineCause(ctx, c.deadline, causeError(proto.CodeDeadlineExceeded))
		inner := cancel
		cancel = func(cause error) { inner(cause); cancelDeadline() }
		c.timer = time.AfterFunc(budget, func() {
			select {
			case d.expired <- c:
			case <-d.quit:
			}
		})
	}
	c.cancel = cancel
	if m.kind == proto.KindStream {
		c.stream = newStream(d, c)
	}
	d.calls[c.id] = c
	go func() {
		o := m.run(ctx, c, r.Body)
		select {
		case d.outcomes <- done{c, o}:
		case <-d.quit:
		}
	}()
}

// setFlag sets c's cancellation flag unless it is set (8.3), and cancels its context.
func (d *driver) setFlag(c *call, code proto.ErrorCode) {
	if c.flag == 0 {
		c.flag = code
		c.cancel(causeError(code))
	}
}

// endCall forgets c once its terminal is sent: its timer stopped, its context released, a
// handler blocked in Rows.Send woken.
func (d *driver) endCall(c *call) {
	delete(d.calls, c.id)
	if c.timer != nil {
		c.timer.Stop()
	}
	c.cancel(causeError(proto.CodeCancelled))
	if c.stream != nil {
		c.stream.close()
		delete(d.dirty, c.stream)
	}
	if d.core.IsDraining() && d.core.InFlight() == 0 && len(d.calls) == 0 {
		d.goodbyeDue = true
	}
}

func (d *driver) onDeadline(c *call) error {
	if d.calls[c.id] != c {
		return nil
	}
	d.setFlag(c, proto.CodeDeadlineExceeded)
	return d.sendFlagged(c)
}

// sendFlagged ends c with ERROR carrying its flag's code, at once (8.3).
func (d *driver) sendFlagged(c *call) error {
	_ = d.core.SendError(c.id, c.flag, causeError(c.flag).(Error).Message, "")
	d.endCall(c)
	return d.maybeGoodbye()
}

func (d *driver) onOutcome(c *call, o outcome) error {
	if d.calls[c.id] != c || c.finished {
		return nil // ended already (deadline, drain): the abandoned handler's outcome is dropped
	}
	if c.flag == 0 && !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
		d.setFlag(c, proto.CodeDeadlineExceeded)
	}
	if c.flag != 0 {
		return d.sendFlagged(c)
	}
	err := o.err
	if err == nil && c.stream != nil {
		err = c.stream.failure()
	}
	if err != nil {
		if c.stream != nil {
			if ferr := d.flushRows(c); ferr != nil {
				return ferr
			}
		}
		we := toWire(err)
		_ = d.core.SendError(c.id, we.code, we.message, we.details)
		d.endCall(c)
		return d.maybeGoodbye()
	}
	if c.stream == nil {
		if serr := d.core.SendResult(c.id, o.body); serr != nil {
			d.sendTooLarge(c, "result", len(o.body), serr)
		} else {
			d.endCall(c)
		}
		return d.maybeGoodbye()
	}
	c.finished = true
	c.summary = o.body
	return d.flush(c)
}

// sendTooLarge ends c with HANDLER_ERROR when the core refuses its result or summary (8.1).
func (d *driver) sendTooLarge(c *call, what string, n int, err error) {
	msg := fmt.Sprintf("the %s could not be sent: %v", what, err)
	var pe *proto.ProtocolError
	if errors.As(err, &pe) && pe.Code == proto.CodeMessageTooLarge {
		msg = fmt.Sprintf("the %s of %d bytes is above max_message_size %d", what, n, d.core.Welcome().MaxMessageSize)
	}
	_ = d.core.SendError(c.id, proto.CodeHandlerError, msg, "")
	d.endCall(c)
}

// flush sends what c's stream holds while credit allows, then END once its handler has
// returned and every row is out.
func (d *driver) flush(c *call) error {
	if err := d.flushRows(c); err != nil {
		return err
	}
	if c.finished && c.stream.empty() {
		if err := d.core.SendEnd(c.id, c.summary); err != nil {
			d.sendTooLarge(c, "summary", len(c.summary), err)
		} else {
			d.endCall(c)
		}
		return d.maybeGoodbye()
	}
	return nil
}

func (d *driver) flushRows(c *call) error {
	s := c.stream
	if s.drain(d.core, d.batch) {
		delete(d.dirty, s)
	}
	return nil
}

func (d *driver) onRowsNote(n rowsNote) {
	if d.calls[n.s.c.id] != n.s.c {
		return
	}
	d.dirty[n.s] = true
	if n.full {
		_ = d.flush(n.s.c)
		return
	}
	if !d.flushOn {
		d.flushOn = true
		d.flushT.Reset(d.w.flushEvery)
	}
}

// flushDirty sends the rows every stream holds (the flush rule, section 6).
func (d *driver) flushDirty(bool) error {
	for s := range d.dirty {
		if err := d.flush(s.c); err != nil {
			return err
		}
	}
	return nil
}

func (d *driver) onDrain(graceMs uint32) error {
	if len(d.calls) == 0 {
		return d.goodbye()
	}
	if graceMs == 0 {
		return d.drainNow()
	}
	d.drainT = time.NewTimer(time.Duration(graceMs) * time.Millisecond)
	return nil
}

// drainNow ends every request still in flight CANCELLED without waiting for its handler
// (8.4), then says GOODBYE.
func (d *driver) drainNow() error {
	for _, c := range d.calls {
		d.setFlag(c, proto.CodeCancelled)
		_ = d.core.SendError(c.id, proto.CodeCancelled, "cancelled: the worker drained past its grace", "")
		d.endCall(c)
	}
	return d.goodbye()
}

func (d *driver) maybeGoodbye() error {
	if d.goodbyeDue {
		return d.goodbye()
	}
	return nil
}

func (d *driver) goodbye() error {
	_ = d.core.SendGoodbye(proto.GoodbyeDrained)
	return d.closeOut(errClosed)
}

// closeOut writes what the core holds (GOODBYE or a fatal ERROR last), bounded in time, and
// returns err.
func (d *driver) closeOut(err error) error {
	deadline := time.Now().Add(2 * time.Second)
	_ = d.conn.SetWriteDeadline(deadline)
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for d.writing || d.core.OutputLen() > 0 {
		if !d.writing {
			d.writes <- d.core.TakeOutput(-1)
			d.writing = true
		}
		select {
		case werr := <-d.written:
			d.writing = false
			if werr != nil {
				return err
			}
		case r := <-d.reads:
			d.free <- r.buf // nothing more is read
			if r.err != nil && !d.writing {
				return err
			}
		case <-timeout.C:
			return err
		}
	}
	return err
}

// say writes one line for people to stderr (a remote worker's notices, 21.5).
func (d *driver) say(format string, args ...any) {
	fmt.Fprintf(d.w.stderr, "wirepool worker: "+format+"\n", args...)
}

// startHeartbeat pings the parent every heartbeat_ms of the WELCOME (1,000 ms when it says 0)
// and runs the PONG clock with that period (21.5).
func (d *driver) startHeartbeat(ms uint32) {
	if ms == 0 {
		ms = proto.RemoteDefaultRemoteHeartbeatMs
	}
	d.hb = time.Duration(ms) * time.Millisecond
	d.hbT = time.NewTicker(d.hb)
}

// heartbeat judges the parent gone when the oldest PING no PONG has answered is older than
// heartbeat_misses x heartbeat_ms (8.5, 21.5), and otherwise sends the next PING.
func (d *driver) heartbeat(now time.Time) error {
	if len(d.pings) > 0 {
		if late := now.Sub(d.pings[0].at); late > proto.HeartbeatMisses*d.hb {
			d.say("the parent is gone: no PONG for %v (heartbeat %v); exiting", late.Round(time.Millisecond), d.hb)
			return errClosed
		}
	}
	d.nonce++
	var n [8]byte
	for i := range n {
		n[i] = byte(d.nonce >> (8 * i))
	}
	if err := d.core.SendPing(n); err != nil {
		return nil // the connection is closing: nothing to ping
	}
	d.pings = append(d.pings, pingSent{nonce: n, at: now})
	return nil
}

// onPong: a PONG answers its PING and every older one.
func (d *driver) onPong(nonce [8]byte) {
	for i, p := range d.pings {
		if p.nonce == nonce {
			d.pings = d.pings[i+1:]
			return
		}
	}
}
