package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/wirepool/wirepool/go/proto"
)

// reply is how a request ends, or one of its rows (streams).
type reply struct {
	body []byte
	rows [][]byte
	err  *Error
	end  bool // END (streams) or RESULT
	size int  // ROWS payload length, for Consumed
}

// pending is one request in flight on a worker.
type pending struct {
	q   []reply       // guarded by the proc's mu
	sig chan struct{} // capacity 1: something was queued
}

func newPending() *pending { return &pending{sig: make(chan struct{}, 1)} }

// push queues r; mu is held.
func (pr *pending) push(r reply) {
	pr.q = append(pr.q, r)
	select {
	case pr.sig <- struct{}{}:
	default:
	}
}

// proc is one worker process and its connection; mu guards the core and the fields below it.
type proc struct {
	p    *Pool
	slot int
	cmd  *exec.Cmd
	conn net.Conn
	tail *tailBuf

	mu       sync.Mutex
	core     *proto.Connection
	reqs     map[uint64]*pending
	methods  map[string]int
	dead     bool
	exitErr  *Error
	leased   bool   // held by a Lease: the pool routes nothing to it
	retiring bool   // recycled or closing: DRAIN sent, nothing new routed to it
	sent     int    // requests sent, for MaxRequests
	hung     *Error // the liveness judge's verdict, set before the kill
	fatal    *Error // a protocol violation, either side's (PROTOCOL_VIOLATION)
	answered uint64 // the highest PING nonce a PONG answered
	bytesIn  uint64
	kick     chan struct{} // wakes the writer
	done     chan struct{} // closed when the reader ended and the process was reaped
	goodbye  chan struct{} // closed at GOODBYE or end of input
	exited   chan struct{} // closed once the process was reaped
	waitOnce sync.Once
	eof      bool // the reader saw end of input (the liveness clocks stop)
	byeOnce  sync.Once
}

// stderrLineMax bounds each line a worker's stderr tail keeps, in bytes (as the Rust parent's,
// rust/wirepool/src/spawn.rs): a longer line is cut there and marked stderrCut, so a worker
// printing one 100 MB line costs one cut line.
const stderrLineMax = 4096

// stderrCut marks a line of the tail cut at stderrLineMax.
const stderrCut = " [...truncated]"

// stderrMessageMax bounds the stderr tail an error's Message quotes, in bytes: its last lines,
// cut at the front ("..."), room for one whole cut line; Error.StderrTail and the details
// carry all of it.
const stderrMessageMax = stderrLineMax + len(stderrCut)

// tailBuf keeps the last max lines of a worker's stderr: a ring, each line cut to
// stderrLineMax bytes. It is the worker's stderr writer and never blocks it.
type tailBuf struct {
	mu    sync.Mutex
	ring  []string // up to max lines; once full, head is the oldest
	head  int
	max   int
	part  []byte // the line being written, at most stderrLineMax bytes
	cut   bool   // part lost bytes past stderrLineMax
	dirty bool   // part has something (possibly an empty cut line)
}

func (t *tailBuf) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		chunk := b
		if i >= 0 {
			chunk = b[:i]
		}
		if room := stderrLineMax - len(t.part); len(chunk) > room {
			chunk = chunk[:room]
			t.cut = true
		}
		t.part = append(t.part, chunk...)
		t.dirty = true
		if i < 0 {
			break
		}
		t.push(t.line())
		b = b[i+1:]
	}
	return n, nil
}

// line is the line being written, valid UTF-8, marked when cut; it starts the next. mu is held.
func (t *tailBuf) line() string {
	s := strings.ToValidUTF8(string(t.part), "\uFFFD")
	if t.cut {
		s += stderrCut
	}
	t.part, t.cut, t.dirty = t.part[:0], false, false
	return s
}

// push adds a whole line, dropping the oldest past max; mu is held.
func (t *tailBuf) push(s string) {
	switch {
	case t.max <= 0:
	case len(t.ring) < t.max:
		t.ring = append(t.ring, s)
	default:
		t.ring[t.head] = s
		t.head = (t.head + 1) % t.max
	}
}

// Lines is the tail, oldest first, with a last line not yet ended by a newline.
func (t *tailBuf) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := make([]string, 0, len(t.ring)+1)
	l = append(append(l, t.ring[t.head:]...), t.ring[:t.head]...)
	if t.dirty && t.max > 0 {
		s := strings.ToValidUTF8(string(t.part), "\uFFFD")
		if t.cut {
			s += stderrCut
		}
		l = append(l, s)
		if len(l) > t.max {
			l = l[1:]
		}
	}
	if len(l) == 0 {
		return nil
	}
	return l
}

func (t *tailBuf) String() string { return strings.Join(t.Lines(), "\n") }

// message is the tail for an error's Message: at most stderrMessageMax bytes, its end.
func (t *tailBuf) message() string {
	s := t.String()
	if len(s) <= stderrMessageMax {
		return s
	}
	s = s[len(s)-stderrMessageMax:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return "..." + s
}

// spawn starts one worker and completes the handshake (section 1, 4).
func (p *Pool) spawn(ctx context.Context, slot int) (*proc, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, errorf(proto.CodeSpawnFailed, "socketpair: %v", err)
	}
	parentF := os.NewFile(uintptr(fds[0]), "wirepool-parent")
	childF := os.NewFile(uintptr(fds[1]), "wirepool-child")
	conn, err := net.FileConn(parentF)
	parentF.Close()
	if err != nil {
		childF.Close()
		return nil, errorf(proto.CodeSpawnFailed, "socketpair: %v", err)
	}
	o := &p.opts
	cmd := exec.Command(o.Command[0], o.Command[1:]...)
	cmd.Dir = o.Dir
	cmd.Env = append(append(os.Environ(), o.Env...), "WIREPOOL_FD=3")
	cmd.ExtraFiles = []*os.File{childF}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	tail := &tailBuf{max: o.StderrTailLines}
	cmd.Stderr = tail
	cmd.Stdout = o.Stdout
	w := &proc{p: p, slot: slot, cmd: cmd, conn: conn, tail: tail,
		core: proto.NewConnection(proto.Parent), reqs: map[uint64]*pending{},
		kick: make(chan struct{}, 1), done: make(chan struct{}), goodbye: make(chan struct{}),
		exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		childF.Close()
		conn.Close()
		return nil, errorf(proto.CodeSpawnFailed, "start %q: %v", o.Command[0], err)
	}
	childF.Close()
	hctx, cancel := context.WithTimeout(ctx, o.StartupTimeout)
	defer cancel()
	if err := w.handshake(hctx); err != nil {
		w.kill()
		conn.Close()
		w.reap(0)
		if e := new(Error); errors.As(err, &e) {
			if e.Code == proto.CodeWorkerExited {
				e.Message += w.exitText()
			}
			w.addExit(e)
		}
		return nil, err
	}
	go w.writer()
	go w.reader()
	if o.Heartbeat > 0 {
		go w.heartbeat()
	}
	return w, nil
}

func (w *proc) exitText() string {
	s := ""
	if st := w.cmd.ProcessState; st != nil {
		s = fmt.Sprintf(" (%s)", st.String())
	}
	return s + w.tailText()
}

// handshake reads HELLO, negotiates and sends WELCOME.
func (w *proc) handshake(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = w.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := make([]byte, 65536)
	for {
		ev, err := w.core.NextEvent()
		if err != nil {
			_ = w.core.SendFatal(err.(*proto.ProtocolError))
			_, _ = w.conn.Write(w.core.TakeOutput(1 << 30))
			return w.violation(protoCode(err), "at the handshake: %v", err)
		}
		if ev != nil {
			switch ev := ev.(type) {
			case *proto.Hello:
				o := &w.p.opts
				wel, clamped, err := proto.Negotiate(ev, proto.Offer{MaxFrameSize: int64(o.MaxFrameSize),
					InitialCredit: int64(o.InitialCredit), HeartbeatMs: o.Heartbeat.Milliseconds(), MaxInFlight: int64(o.MaxInFlight),
					MaxMessageSize: o.MaxMessageSize, WorkerID: uint32(w.slot)})
				if err == nil {
					err = checkRequired(ev, o.Require)
				}
				if err != nil {
					_ = w.core.Refuse(protoCode(err), err.Error())
					_, _ = w.conn.Write(w.core.TakeOutput(1 << 30))
					return errorf(protoCode(err), "%v", err)
				}
				if clamped {
					w.p.clamped(o.MaxInFlight, ev.MaxConcurrency)
				}
				if err := w.core.SendWelcome(wel); err != nil {
					return errorf(protoCode(err), "%v", err)
				}
				if _, err := w.conn.Write(w.core.TakeOutput(1 << 30)); err != nil {
					return errorf(proto.CodeWorkerExited, "the worker closed its connection at the handshake")
				}
				w.methods = map[string]int{}
				for i, m := range ev.Methods {
					w.methods[m.Name] = i
				}
				_ = w.conn.SetReadDeadline(time.Time{})
				return nil
			case *proto.ErrorFrame:
				return w.violation(ev.Code, "the worker sent a fatal ERROR before its handshake ended: %s", ev.Message)
			}
			continue
		}
		n, err := w.conn.Read(buf)
		if n > 0 {
			w.core.Receive(buf[:n])
			continue
		}
		if ctx.Err() != nil {
			return errorf(proto.CodeStartupTimeout, "no HELLO within %v%s", w.p.opts.StartupTimeout, w.tailText())
		}
		if err != nil {
			msg := "the worker exited before its HELLO"
			if !w.reap(w.p.opts.GoodbyeGrace) {
				msg = "the worker closed its connection before its HELLO and was killed"
			}
			if st := w.cmd.ProcessState; st != nil && st.ExitCode() == 0 && w.tail.String() == "" {
				msg += " (did the worker program call its SDK's serve?)"
			}
			return errorf(proto.CodeWorkerExited, "%s", msg)
		}
	}
}

func (w *proc) tailText() string {
	if t := w.tail.message(); t != "" {
		return "; stderr: " + t
	}
	return ""
}

func protoCode(err error) proto.ErrorCode {
	var pe *proto.ProtocolError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return proto.CodeProtocol
}

func (w *proc) kill() {
	if w.cmd.Process != nil {
		_ = w.cmd.Process.Kill()
	}
}

// flush wakes the writer; callers hold mu or not.
func (w *proc) flush() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *proc) writer() {
	for {
		select {
		case <-w.kick:
		case <-w.done:
			return
		}
		for {
			w.mu.Lock()
			out := w.core.TakeOutput(4 << 20)
			w.mu.Unlock()
			if len(out) == 0 {
				break
			}
			if _, err := w.conn.Write(out); err != nil {
				w.conn.Close()
				break
			}
		}
	}
}

func (w *proc) reader() {
	var evs []proto.Event
	var why *Error
	for why == nil {
		// Zero-copy: the socket is read into the core's own buffer, the rest of a large frame
		// in one piece, so a continued message costs its bytes and no copies (section 5).
		w.mu.Lock()
		buf := w.core.ReadBuffer(64 << 10)
		w.mu.Unlock()
		n, err := w.conn.Read(buf)
		w.mu.Lock()
		if n > 0 {
			w.bytesIn += uint64(n)
			w.core.Received(n)
			var perr error
			evs, perr = w.core.NextEvents(evs[:0])
			for _, ev := range evs {
				if w.fatal != nil {
					break // after a fatal ERROR (id 0) nothing more is delivered (8.4)
				}
				w.onEvent(ev)
			}
			if perr != nil {
				_ = w.core.SendFatal(perr.(*proto.ProtocolError))
				w.flush()
				w.fatal = w.violation(protoCode(perr), "the worker broke the protocol: %v", perr)
			}
			if w.fatal != nil {
				why = w.fatal
			}
		}
		if err != nil {
			w.eof = true
		}
		if err != nil && why == nil {
			if e := w.core.EndOfInput(); e != nil {
				why = errorf(proto.CodeWorkerExited, "connection lost mid-frame: %v", e)
			} else {
				why = errorf(proto.CodeWorkerExited, "the worker closed its connection")
			}
		}
		w.mu.Unlock()
	}
	w.byeOnce.Do(func() { close(w.goodbye) })
	if why.Code == proto.CodeProtocolViolation {
		// Whatever the fatal ERROR still has to say gets the goodbye grace; then the close.
		w.flushOut()
	}
	w.conn.Close()
	// Reap: a worker that closed its connection gets the goodbye grace to exit.
	w.reap(w.p.opts.GoodbyeGrace)
	w.mu.Lock()
	w.dead = true
	if w.hung != nil {
		why = w.hung // the judge's kill explains the end
	}
	why.Message += w.exitText()
	w.addExit(why)
	w.exitErr = why
	for id, pr := range w.reqs {
		delete(w.reqs, id)
		pr.push(reply{err: why, end: true})
	}
	w.mu.Unlock()
	close(w.done)
	w.p.workerDied(w)
}

// onEvent handles one event; mu is held.
func (w *proc) onEvent(ev proto.Event) {
	switch ev := ev.(type) {
	case *proto.Result:
		if pr := w.reqs[ev.ID]; pr != nil {
			delete(w.reqs, ev.ID)
			pr.push(reply{body: ev.Body, end: true})
		}
	case *proto.ErrorFrame:
		if ev.ID == 0 {
			// Fatal for the connection (8.4): PROTOCOL_VIOLATION with the worker's code, and
			// the worker gets the goodbye grace to exit.
			if w.fatal == nil {
				w.fatal = w.violation(ev.Code, "the worker reported a fatal error: %s", ev.Message)
				w.fatal.Message = ev.Message
			}
			return
		}
		if pr := w.reqs[ev.ID]; pr != nil {
			delete(w.reqs, ev.ID)
			e := &Error{Code: ev.Code, Message: ev.Message}
			if ev.Details != "" {
				e.Details = []byte(ev.Details)
			}
			pr.push(reply{err: e, end: true})
		}
	case *proto.Rows:
		if pr := w.reqs[ev.ID]; pr != nil {
			rows := make([][]byte, len(ev.Rows))
			copy(rows, ev.Rows)
			pr.push(reply{rows: rows, size: ev.PayloadLen})
		}
	case *proto.End:
		if pr := w.reqs[ev.ID]; pr != nil {
			delete(w.reqs, ev.ID)
			pr.push(reply{body: ev.Summary, end: true})
		}
	case *proto.Ping:
		_ = w.core.SendPong(ev.Nonce)
		w.flush()
	case *proto.Pong:
		if n := proto.PongNonce(ev.Nonce); n > w.answered {
			w.answered = n
		}
	case *proto.Goodbye:
		w.byeOnce.Do(func() { close(w.goodbye) })
		// A worker that says GOODBYE and stays costs its requests one grace, never a hang (8.4).
		time.AfterFunc(w.p.opts.GoodbyeGrace, func() {
			select {
			case <-w.exited:
			default:
				w.kill()
			}
		})
	}
	if w.p != nil {
		w.p.wake()
	}
}

// pop takes the next queued reply; mu is held.
func (pr *pending) pop() (reply, bool) {
	if len(pr.q) == 0 {
		return reply{}, false
	}
	r := pr.q[0]
	pr.q = pr.q[1:]
	return r, true
}

// violation is the PROTOCOL_VIOLATION error for a 1xx code, the code in its details
// (protocol_code, as the other parents say it).
func (w *proc) violation(code proto.ErrorCode, format string, args ...any) *Error {
	e := errorf(proto.CodeProtocolViolation, format, args...)
	return withDetails(e, map[string]any{"protocol_code": int(code)})
}

// flushOut writes what the core still holds (a fatal ERROR), bounded by the goodbye grace.
func (w *proc) flushOut() {
	w.mu.Lock()
	out := w.core.TakeOutput(1 << 20)
	w.mu.Unlock()
	if len(out) > 0 {
		_ = w.conn.SetWriteDeadline(time.Now().Add(w.p.opts.GoodbyeGrace))
		_, _ = w.conn.Write(out)
	}
}

// checkRequired is CODEC_MISMATCH when hello lacks a required method, kind or codec.
func checkRequired(hello *proto.Hello, req []Requirement) error {
	for _, r := range req {
		i := slices.IndexFunc(hello.Methods, func(m proto.Method) bool { return m.Name == r.Method })
		switch {
		case i < 0:
			return &proto.ProtocolError{Code: proto.CodeCodecMismatch, Message: fmt.Sprintf("the worker has no method %q", r.Method)}
		case hello.Methods[i].Kind != r.Kind:
			return &proto.ProtocolError{Code: proto.CodeCodecMismatch, Message: fmt.Sprintf("method %q is %s, %s is required", r.Method, hello.Methods[i].Kind, r.Kind)}
		case !slices.Contains(hello.Methods[i].Codecs, uint8(r.Codec)):
			return &proto.ProtocolError{Code: proto.CodeCodecMismatch, Message: fmt.Sprintf("method %q does not accept %s", r.Method, r.Codec)}
		}
	}
	return nil
}

// heartbeat runs the liveness judge (the core's, 8.5) every tick: PINGs as it asks, and the
// kill with WORKER_HUNG at its verdict.
func (w *proc) heartbeat() {
	hb := uint64(w.p.opts.Heartbeat.Milliseconds())
	tick := min(max(hb/10, 5), 100)
	start := time.Now()
	judge := proto.NewLiveness(hb, tick, 0)
	t := time.NewTicker(time.Duration(tick) * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.done:
			return
		}
		w.mu.Lock()
		if w.dead || w.fatal != nil || w.eof || w.core.IsGoodbye() {
			// The goodbye grace bounds what is left; the judge has nothing to judge.
			w.mu.Unlock()
			return
		}
		v := judge.Tick(uint64(time.Since(start).Milliseconds()), proto.Seen{Answered: w.answered,
			IncompleteFrame: w.core.IncompleteFrameLen(), BytesIn: w.bytesIn})
		if v.Ping > 0 && w.core.SendPing(proto.PingNonce(v.Ping)) == nil {
			w.flush()
		}
		if v.Hung {
			what := "no PONG answered a PING"
			if v.Stalled {
				what = "one frame has been arriving"
			}
			w.hung = errorf(proto.CodeWorkerHung, "the worker is hung: %s for %d ms (3 heartbeats of %d ms)", what, v.Ms, hb)
			w.mu.Unlock()
			w.kill()
			return
		}
		w.mu.Unlock()
	}
}

// reap waits for the process to exit, at most grace (0: until it exits), then kills it and
// waits; false when it had to be killed.
func (w *proc) reap(grace time.Duration) bool {
	w.waitOnce.Do(func() {
		go func() {
			_ = w.cmd.Wait()
			close(w.exited)
		}()
	})
	if grace == 0 {
		<-w.exited
		return true
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-w.exited:
		return true
	case <-t.C:
		w.kill()
		<-w.exited
		return false
	}
}

// addExit adds how the process ended to e's details: exit_status or signal (one of them null),
// and the stderr tail, beside what e's details already say.
func (w *proc) addExit(e *Error) {
	status := map[string]any{"exit_status": nil, "signal": nil, "stderr_tail": w.tail.String()}
	if len(e.Details) > 0 {
		var d map[string]any
		if json.Unmarshal(e.Details, &d) == nil {
			maps.Copy(status, d)
		}
	}
	if st := w.cmd.ProcessState; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			status["signal"] = int(ws.Signal())
		} else {
			status["exit_status"] = st.ExitCode()
		}
	}
	withDetails(e, status)
	e.StderrTail = w.tail.Lines()
}
