package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

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

	mu      sync.Mutex
	core    *proto.Connection
	reqs    map[uint64]*pending
	methods map[string]int
	dead    bool
	exitErr *Error
	kick    chan struct{} // wakes the writer
	done    chan struct{} // closed when the reader ended and the process was reaped
	goodbye chan struct{} // closed at GOODBYE or end of input
	byeOnce sync.Once
}

// tailBuf keeps the last lines of a worker's stderr.
type tailBuf struct {
	mu    sync.Mutex
	lines []string
	part  []byte
	max   int
}

func (t *tailBuf) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.part = append(t.part, b...)
	for {
		i := bytes.IndexByte(t.part, '\n')
		if i < 0 {
			break
		}
		t.lines = append(t.lines, string(t.part[:i]))
		t.part = t.part[i+1:]
		if len(t.lines) > t.max {
			t.lines = t.lines[len(t.lines)-t.max:]
		}
	}
	if len(t.part) > 8192 {
		t.part = t.part[len(t.part)-8192:]
	}
	return len(b), nil
}

func (t *tailBuf) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := append([]string(nil), t.lines...)
	if len(t.part) > 0 {
		l = append(l, string(t.part))
	}
	return strings.Join(l, "\n")
}

// spawn starts one worker and completes the handshake (section 1, 4).
func (p *Pool) spawn(ctx context.Context, slot int) (*proc, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, errorf(proto.CodeWorkerExited, "socketpair: %v", err)
	}
	parentF := os.NewFile(uintptr(fds[0]), "wirepool-parent")
	childF := os.NewFile(uintptr(fds[1]), "wirepool-child")
	conn, err := net.FileConn(parentF)
	parentF.Close()
	if err != nil {
		childF.Close()
		return nil, errorf(proto.CodeWorkerExited, "socketpair: %v", err)
	}
	o := &p.opts
	cmd := exec.Command(o.Command[0], o.Command[1:]...)
	cmd.Dir = o.Dir
	cmd.Env = append(append(os.Environ(), o.Env...), "WIREPOOL_FD=3")
	cmd.ExtraFiles = []*os.File{childF}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	tail := &tailBuf{max: proto.ParentDefaultStderrTailLines}
	cmd.Stderr = tail
	w := &proc{p: p, slot: slot, cmd: cmd, conn: conn, tail: tail,
		core: proto.NewConnection(proto.Parent), reqs: map[uint64]*pending{},
		kick: make(chan struct{}, 1), done: make(chan struct{}), goodbye: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		childF.Close()
		conn.Close()
		return nil, errorf(proto.CodeWorkerExited, "start %q: %v", o.Command[0], err)
	}
	childF.Close()
	hctx, cancel := context.WithTimeout(ctx, o.StartupTimeout)
	defer cancel()
	if err := w.handshake(hctx); err != nil {
		w.kill()
		conn.Close()
		_ = cmd.Wait()
		if e := new(Error); errors.As(err, &e) && e.Code == proto.CodeWorkerExited {
			e.Message += w.exitText()
		}
		return nil, err
	}
	go w.writer()
	go w.reader()
	return w, nil
}

func (w *proc) exitText() string {
	s := ""
	if st := w.cmd.ProcessState; st != nil {
		s = fmt.Sprintf(" (%s)", st.String())
	}
	if t := w.tail.String(); t != "" {
		s += "; stderr: " + t
	}
	return s
}

// handshake reads HELLO, negotiates and sends WELCOME.
func (w *proc) handshake(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = w.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := make([]byte, 65536)
	for {
		ev, err := w.core.NextEvent()
		if err != nil {
			return errorf(protoCode(err), "handshake: %v", err)
		}
		if ev != nil {
			switch ev := ev.(type) {
			case *proto.Hello:
				o := &w.p.opts
				wel, _, err := proto.Negotiate(ev, proto.Offer{MaxFrameSize: int64(o.MaxFrameSize),
					InitialCredit: int64(o.InitialCredit), HeartbeatMs: 0, MaxInFlight: int64(o.MaxInFlight),
					MaxMessageSize: o.MaxMessageSize, WorkerID: uint32(w.slot)})
				if err != nil {
					_ = w.core.Refuse(protoCode(err), err.Error())
					_, _ = w.conn.Write(w.core.TakeOutput(1 << 30))
					return errorf(protoCode(err), "%v", err)
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
				return errorf(ev.Code, "the worker refused: %s", ev.Message)
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
			_ = w.cmd.Wait()
			msg := "the worker exited before its HELLO"
			if st := w.cmd.ProcessState; st != nil && st.ExitCode() == 0 && w.tail.String() == "" {
				msg += " (did the worker program call its SDK's serve?)"
			}
			return errorf(proto.CodeWorkerExited, "%s", msg)
		}
	}
}

func (w *proc) tailText() string {
	if t := w.tail.String(); t != "" {
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
	buf := make([]byte, 256<<10)
	var evs []proto.Event
	var why *Error
	for why == nil {
		n, err := w.conn.Read(buf)
		w.mu.Lock()
		if n > 0 {
			w.core.Receive(buf[:n])
			var perr error
			evs, perr = w.core.NextEvents(evs[:0])
			for _, ev := range evs {
				w.onEvent(ev)
			}
			if perr != nil {
				_ = w.core.SendFatal(perr.(*proto.ProtocolError))
				w.flush()
				why = errorf(proto.CodeWorkerExited, "protocol violation: %v", perr)
			}
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
	w.conn.Close()
	// Reap: a worker that closed its connection gets the goodbye grace to exit.
	exited := make(chan struct{})
	go func() { _ = w.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(w.p.opts.GoodbyeGrace):
		w.kill()
		<-exited
	}
	w.mu.Lock()
	w.dead = true
	why.Message += w.exitText()
	status := map[string]any{"exit_status": nil, "signal": nil, "stderr_tail": w.tail.String()}
	if st := w.cmd.ProcessState; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			status["signal"] = int(ws.Signal())
		} else {
			status["exit_status"] = st.ExitCode()
		}
	}
	withDetails(why, status)
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
			return // fatal report: the connection closes next
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
	case *proto.Goodbye:
		w.byeOnce.Do(func() { close(w.goodbye) })
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
