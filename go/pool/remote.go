package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/wirepool/wirepool/go/proto"
)

// remoteConn is what a remote worker's proc holds beside its connection (PROTOCOL.md 21).
type remoteConn struct {
	raw  net.Conn // the TCP connection under TLS: kill closes it, with no close_notify to wait on
	peer string   // the address the listener saw
	pid  uint32   // from its HELLO, once it came
}

// spawnRemote is spawn for a pool whose workers join Options.Remote (21.8, the subprocess
// launcher): the worker starts as a child in a session of its own (no parent-death signal: it
// leaves by end of file or its own heartbeat clock, as on another machine) with a single-use
// ticket in WIREPOOL_TICKET instead of WIREPOOL_FD, and its connection is the one that joins
// with that ticket. Before it joins, the child is ours: its exit status and stderr say why it
// did not; after, its death is a lost connection (21.6).
func (p *Pool) spawnRemote(ctx context.Context, slot int) (*proc, error) {
	o := &p.opts
	l := o.Remote
	t, err := l.Issue(o.StartupTimeout+l.o.HelloTimeout, true)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.Command[0], o.Command[1:]...)
	cmd.Dir = o.Dir
	env := make([]string, 0, len(os.Environ())+len(o.Env)+1)
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "WIREPOOL_FD" && k != "WIREPOOL_TICKET" && k != "WIREPOOL_TICKET_FILE" {
			env = append(env, kv)
		}
	}
	cmd.Env = append(append(env, o.Env...), "WIREPOOL_TICKET="+t.Encode())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	tail := &tailBuf{max: o.StderrTailLines}
	cmd.Stderr = tail
	cmd.Stdout = o.Stdout
	w := &proc{p: p, slot: slot, cmd: cmd, tail: tail,
		core: proto.NewConnection(proto.Parent), reqs: map[uint64]*pending{},
		kick: make(chan struct{}, 1), done: make(chan struct{}), goodbye: make(chan struct{}),
		exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		l.forget(t.ID)
		return nil, errorf(proto.CodeSpawnFailed, "start %q: %v", o.Command[0], err)
	}
	w.waitOnce.Do(func() {
		go func() {
			_ = w.cmd.Wait()
			close(w.exited)
		}()
	})
	actx, cancel := context.WithTimeout(ctx, o.StartupTimeout)
	type accepted struct {
		j   *joined
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		j, err := l.accept(actx, &t.ID)
		ch <- accepted{j, err}
	}()
	var a accepted
	select {
	case a = <-ch:
	case <-w.exited:
		cancel()
		if a = <-ch; a.j != nil {
			_ = a.j.raw.Close()
		}
		e := errorf(proto.CodeWorkerExited, "the remote worker (child pid %d) exited before it joined%s", cmd.Process.Pid, w.exitText())
		w.addExit(e)
		a = accepted{err: e}
	}
	cancel()
	if a.err != nil {
		l.forget(t.ID)
		w.kill()
		w.reap(0)
		if e, ok := a.err.(*Error); ok && e.Code == proto.CodeStartupTimeout {
			e.Message = fmt.Sprintf("the remote worker (child pid %d) did not join within %v%s", cmd.Process.Pid, o.StartupTimeout, w.tailText())
			w.addExit(e)
		}
		return nil, a.err
	}
	w.conn = a.j.conn
	w.remote = &remoteConn{raw: a.j.raw, peer: a.j.peer}
	hctx, hcancel := context.WithDeadline(ctx, a.j.deadline)
	defer hcancel()
	if err := w.handshake(hctx); err != nil {
		w.kill()
		_ = w.conn.Close()
		w.reap(0)
		if e, ok := err.(*Error); ok {
			switch {
			case e.Code == proto.CodeWorkerExited:
				e.Message += w.exitText()
			case e.Code == proto.CodeStartupTimeout && !a.j.deadline.After(time.Now()):
				// The listener's bound, not the start-up timeout, ran out (21.4).
				e.Message = fmt.Sprintf("the remote worker %s joined but sent no complete HELLO within the hello timeout of %v from its accept",
					w.remote.peer, l.o.HelloTimeout)
			}
			w.addExit(e)
		}
		return nil, err
	}
	w.remote.pid = w.core.Hello().Pid
	go w.writer()
	go w.reader()
	go w.heartbeat()
	return w, nil
}

// heartbeatEvery is the worker's PING interval: the pool's, except that a remote connection's
// is never 0 (21.5: the default 1 s then).
func (w *proc) heartbeatEvery() time.Duration {
	if w.remote != nil && w.p.opts.Heartbeat == 0 {
		return time.Duration(proto.RemoteDefaultRemoteHeartbeatMs) * time.Millisecond
	}
	return w.p.opts.Heartbeat
}

// remoteText is a remote worker's end for an error's message: where it ran and its HELLO's pid
// (21.6); its exit status and stderr are not the pool's.
func (w *proc) remoteText() string {
	return fmt.Sprintf(" (remote worker %s pid %d: connection lost)", w.remote.peer, w.remote.pid)
}

// addLost is addExit for a remote worker: status and signal unknown (null), its host and pid,
// and "connection": "lost" on a WORKER_EXITED (21.6), beside what e's details already say.
func (w *proc) addLost(e *Error) {
	d := map[string]any{"exit_status": nil, "signal": nil, "host": w.remote.peer, "pid": w.remote.pid}
	if e.Code == proto.CodeWorkerExited {
		d["connection"] = "lost"
	}
	if len(e.Details) > 0 {
		var had map[string]any
		if json.Unmarshal(e.Details, &had) == nil {
			maps.Copy(d, had)
		}
	}
	withDetails(e, d)
	e.StderrTail = nil
}
