package pool

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/wirepool/wirepool/go/proto"
	"github.com/wirepool/wirepool/go/worker"
)

// ListenOptions configure a Listener (PROTOCOL.md 21). Zero values take the defaults of
// spec/constants.json's remote section.
type ListenOptions struct {
	// Addr is where to listen, host:port (default "127.0.0.1:0": loopback, any free port).
	Addr string
	// Advertise is the host workers connect to, written into tickets (default: Addr's host,
	// which then must not be an unspecified address such as 0.0.0.0).
	Advertise string
	// Plain listens on plain TCP instead of TLS 1.3: allowed only when Addr's host and
	// Advertise are loopback addresses (21.1).
	Plain bool
	// JoinTimeout bounds the TLS handshake and the 64 JOIN bytes, from the TCP accept
	// (default 5 s).
	JoinTimeout time.Duration
	// HelloTimeout bounds the whole join up to a complete HELLO, from the TCP accept
	// (default 10 s): a joined connection no pool slot takes within it is refused as
	// "the pool is full".
	HelloTimeout time.Duration
	// MaxPendingJoins is how many connections may be between accept and hand-over at once;
	// more are closed as soon as they are accepted (default 64).
	MaxPendingJoins int
	// RefusalLogPerSecond bounds the refusal lines logged per second (default 10); the lines
	// past it are counted and the count is logged with the next second's first line.
	RefusalLogPerSecond int
	// Logger receives one line per refused or timed-out connection (default slog.Default()).
	Logger *slog.Logger
}

// Listener is a pool's TCP + TLS 1.3 listener for remote workers (PROTOCOL.md 21): a
// self-signed certificate made at Listen and pinned by the tickets' fingerprint, ALPN
// wirepool/1, join tickets, the 64-byte JOIN block checked in 21.3's order, and 21.4's bounds
// on an unauthenticated peer. A pool whose Options.Remote names it starts each worker as a
// child with a single-use ticket in WIREPOOL_TICKET instead of a socketpair; its workers then
// join here. Close it after the pools that use it. Safe for concurrent use.
type Listener struct {
	o         ListenOptions
	ln        net.Listener
	tlsConfig *tls.Config // nil: plain TCP
	fp        [32]byte
	port      uint16
	closing   chan struct{}
	wg        sync.WaitGroup // the accept loop and each connection not yet handed over

	mu      sync.Mutex // guards the fields below
	closed  bool
	tickets map[[16]byte]*issued
	waiters []*joinWaiter
	parked  []*parkedJoin
	open    map[net.Conn]struct{} // accepted and not handed over: Close closes them
	stats   ListenerStats

	logMu      sync.Mutex
	logSecond  int64
	logLines   int
	logDropped int
	logFlush   *time.Timer // logs the dropped count at the end of its second
}

// ListenerStats counts a listener's connections.
type ListenerStats struct {
	Accepted  int            // TCP connections accepted
	Joined    int            // handed over to a pool after a good join
	Refused   int            // refused or timed out before the hand-over
	RefusedBy map[string]int // refusals by cause ("join timeout", "bad magic", "wrong secret", ...)
	Pending   int            // between accept and hand-over now
	Tickets   int            // tickets that can still be used
}

type issued struct {
	secret    [32]byte
	expires   int64
	singleUse bool
}

// joined is a connection that passed the join step, for a pool to drive from its HELLO on.
type joined struct {
	conn     net.Conn // the TLS connection (or the TCP one, plain)
	raw      net.Conn // the TCP connection under it
	peer     string   // the address the listener saw (21.6)
	deadline time.Time
}

type joinWaiter struct {
	id *[16]byte // nil: any pool ticket's join
	ch chan *joined
}

type parkedJoin struct {
	j     *joined
	id    [16]byte
	pool  bool          // joined with a pool ticket: any waiter may take it
	taken chan struct{} // closed by the accept that took it
	gone  bool          // taken or refused; l.mu
}

// refusalLinger bounds how long a refused peer that does not read its answer holds the
// connection.
const refusalLinger = time.Second

// maxTicketTTL bounds a ticket's lifetime (ten years), so expires stays a sane Unix time.
const maxTicketTTL = 10 * 365 * 24 * time.Hour

// Listen validates o (INVALID_ARGUMENT with the field in the details) and starts listening.
// A port it cannot bind is SPAWN_FAILED.
func Listen(o ListenOptions) (*Listener, error) {
	v, err := o.validate()
	if err != nil {
		return nil, err
	}
	l := &Listener{o: v, closing: make(chan struct{}), tickets: map[[16]byte]*issued{},
		open: map[net.Conn]struct{}{}, stats: ListenerStats{RefusedBy: map[string]int{}}}
	if !v.Plain {
		cert, fp, err := selfSigned()
		if err != nil {
			return nil, errorf(proto.CodeSpawnFailed, "the listener's certificate: %v", err)
		}
		l.fp = fp
		l.tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
			MaxVersion: tls.VersionTLS13, NextProtos: []string{proto.RemoteALPN}, ClientAuth: tls.NoClientCert}
	}
	ln, err := net.Listen("tcp", v.Addr)
	if err != nil {
		return nil, errorf(proto.CodeSpawnFailed, "cannot listen on %s: %v", v.Addr, err)
	}
	l.ln = ln
	l.port = uint16(ln.Addr().(*net.TCPAddr).Port)
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func (o *ListenOptions) validate() (ListenOptions, error) {
	v := *o
	bad := func(field, why string) (ListenOptions, error) {
		return v, withDetails(errorf(proto.CodeInvalidArgument, "%s %s", field, why), map[string]any{"field": field})
	}
	if v.Addr == "" {
		v.Addr = "127.0.0.1:0"
	}
	host, port, err := net.SplitHostPort(v.Addr)
	if err != nil {
		return bad("addr", "must be host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return bad("addr", "must have a port from 0 to 65,535")
	}
	if v.Advertise == "" {
		if a, err := netip.ParseAddr(host); host == "" || (err == nil && a.IsUnspecified()) {
			return bad("advertise", "is required when addr listens on every address")
		}
		v.Advertise = host
	}
	if len(v.Advertise) > 253 {
		return bad("advertise", "must be a host name or IP literal of 1-253 bytes")
	}
	if v.Plain && !(isLoopbackHost(host) && isLoopbackHost(v.Advertise)) {
		return bad("plain", "is allowed only when addr and advertise are loopback addresses (21.1)")
	}
	maxMs := time.Duration(proto.MaxTimeoutMs) * time.Millisecond
	durs := []struct {
		name string
		d    *time.Duration
		def  int
	}{
		{"join_timeout", &v.JoinTimeout, proto.RemoteDefaultJoinTimeoutMs},
		{"hello_timeout", &v.HelloTimeout, proto.RemoteDefaultHelloTimeoutMs},
	}
	for _, d := range durs {
		if *d.d < 0 || *d.d > maxMs {
			return bad(d.name, "out of range")
		}
		if *d.d == 0 {
			*d.d = time.Duration(d.def) * time.Millisecond
		}
	}
	if v.MaxPendingJoins < 0 || v.MaxPendingJoins > 65536 {
		return bad("max_pending_joins", "out of range")
	}
	if v.MaxPendingJoins == 0 {
		v.MaxPendingJoins = proto.RemoteDefaultMaxPendingJoins
	}
	if v.RefusalLogPerSecond < 0 || v.RefusalLogPerSecond > proto.MaxCount {
		return bad("refusal_log_per_second", "out of range")
	}
	if v.RefusalLogPerSecond == 0 {
		v.RefusalLogPerSecond = proto.RemoteDefaultRefusalLogPerSecond
	}
	if v.Logger == nil {
		v.Logger = slog.Default()
	}
	return v, nil
}

// isLoopbackHost: the name localhost (RFC 6761) or a loopback IP literal, also in brackets.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// selfSigned is an ECDSA P-256 certificate valid from an hour ago to 365 days ahead (21.1),
// and the SHA-256 of its DER, the pin.
func selfSigned() (tls.Certificate, [32]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, [32]byte{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, [32]byte{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "wirepool parent"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, [32]byte{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, sha256.Sum256(der), nil
}

// Addr is the address the listener is bound to (its port when Addr asked for port 0).
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Fingerprint is the SHA-256 of the certificate's DER, every ticket's pin (zero when Plain).
func (l *Listener) Fingerprint() [32]byte { return l.fp }

// Issue makes a ticket valid for ttl (0: the default 24 h; at most ten years). A pool ticket
// (singleUse false) admits any number of workers, each taken by the next slot of a pool
// waiting for one; a single-use ticket is spent by its first join that passes the ticket's
// checks. The ticket holds the secret: hand it to workers only, never log it.
func (l *Listener) Issue(ttl time.Duration, singleUse bool) (*worker.Ticket, error) {
	if ttl < 0 || ttl > maxTicketTTL {
		return nil, withDetails(errorf(proto.CodeInvalidArgument, "ttl out of range"), map[string]any{"field": "ttl"})
	}
	if ttl == 0 {
		ttl = time.Duration(proto.RemoteDefaultPoolTicketTtlS) * time.Second
	}
	t := &worker.Ticket{Host: l.o.Advertise, Port: l.port, TLS: !l.o.Plain, Fingerprint: l.fp,
		Expires: time.Now().Add(ttl).Unix()}
	if _, err := rand.Read(t.ID[:]); err != nil {
		return nil, errorf(proto.CodeSpawnFailed, "a ticket id: %v", err)
	}
	if _, err := rand.Read(t.Secret[:]); err != nil {
		return nil, errorf(proto.CodeSpawnFailed, "a ticket secret: %v", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errorf(proto.CodePoolClosed, "the listener is closed")
	}
	// Expired tickets are forgotten here, so a pool restarting workers for days holds no more
	// than the tickets still valid.
	now := time.Now().Unix()
	for id, it := range l.tickets {
		if now > it.expires {
			delete(l.tickets, id)
		}
	}
	l.tickets[t.ID] = &issued{secret: t.Secret, expires: t.Expires, singleUse: singleUse}
	return t, nil
}

// Revoke refuses later joins with t (21.2); the workers that joined with it stay.
func (l *Listener) Revoke(t *worker.Ticket) {
	l.mu.Lock()
	delete(l.tickets, t.ID)
	l.mu.Unlock()
}

// Stats is a snapshot of the listener's counters.
func (l *Listener) Stats() ListenerStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.RefusedBy = make(map[string]int, len(l.stats.RefusedBy))
	for k, n := range l.stats.RefusedBy {
		s.RefusedBy[k] = n
	}
	s.Tickets = len(l.tickets)
	return s
}

// Close stops listening, closes every connection not yet handed over to a pool and waits for
// the listener's goroutines; a pool still waiting for a worker to join fails POOL_CLOSED.
// Connections already handed over are their pools'.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.closing)
	err := l.ln.Close()
	for c := range l.open {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	l.logMu.Lock()
	if l.logFlush != nil && l.logFlush.Stop() {
		l.flushDroppedLocked()
	}
	l.logMu.Unlock()
	return err
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		raw, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait a little, as net/http does, rather
			// than spin.
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-l.closing:
				t.Stop()
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		l.mu.Lock()
		l.stats.Accepted++
		if l.closed || l.stats.Pending >= l.o.MaxPendingJoins {
			l.mu.Unlock()
			l.refused(raw, "too many pending")
			_ = raw.Close()
			continue
		}
		l.stats.Pending++
		l.open[raw] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.handle(raw)
	}
}

// release ends raw's pending life: handed over (true) or refused and closed.
func (l *Listener) release(raw net.Conn, handed bool) {
	l.mu.Lock()
	l.releaseLocked(raw, handed)
	l.mu.Unlock()
}

// releaseLocked is release with l.mu held: a connection handed over leaves l.open in the
// same critical section, so a concurrent Close never closes a pool's connection.
func (l *Listener) releaseLocked(raw net.Conn, handed bool) {
	if _, ok := l.open[raw]; ok {
		delete(l.open, raw)
		l.stats.Pending--
		if handed {
			l.stats.Joined++
		}
	}
}

// handle takes one accepted connection through TLS and the join step (21.3, 21.4).
func (l *Listener) handle(raw net.Conn) {
	defer l.wg.Done()
	accepted := time.Now()
	_ = raw.SetDeadline(accepted.Add(l.o.JoinTimeout))
	conn := raw
	if l.tlsConfig != nil {
		tc := tls.Server(raw, l.tlsConfig)
		if err := tc.Handshake(); err != nil {
			cause := "tls handshake failed"
			if isTimeout(err) {
				cause = "join timeout"
			}
			l.refuse(tc, raw, cause, nil)
			return
		}
		if tc.ConnectionState().NegotiatedProtocol != proto.RemoteALPN {
			l.refuse(tc, raw, "tls handshake failed (no ALPN "+proto.RemoteALPN+")", nil)
			return
		}
		conn = tc
	}
	// Exactly the 64 JOIN bytes and nothing more before the ticket is checked (21.4): the
	// HELLO behind them stays in the connection for the pool's core.
	var block [proto.RemoteJoinBytes]byte
	if _, err := io.ReadFull(conn, block[:]); err != nil {
		cause := "closed before the join"
		if isTimeout(err) {
			cause = "join timeout"
		}
		l.refuse(conn, raw, cause, nil)
		return
	}
	id, single, cause, answer := l.check(block[:])
	if cause != "" {
		l.refuse(conn, raw, cause, answer)
		return
	}
	_ = raw.SetDeadline(time.Time{}) // from here the pool's HELLO bound (j.deadline) applies
	j := &joined{conn: conn, raw: raw, peer: raw.RemoteAddr().String(), deadline: accepted.Add(l.o.HelloTimeout)}
	l.handOver(j, id, single)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// check is 21.3's checks in order: the cause of a refusal ("" when the join passes) and the
// ERROR id 0 to answer it with (nil: close without a word).
func (l *Listener) check(b []byte) (id [16]byte, singleUse bool, cause string, answer *proto.ErrorFrame) {
	refused := &proto.ErrorFrame{Code: proto.CodeBadHandshake, Message: "join refused"}
	if string(b[:8]) != proto.RemoteJoinMagic {
		return id, false, "bad magic", nil
	}
	if v := binary.LittleEndian.Uint16(b[8:10]); v != proto.RemoteJoinVersion {
		return id, false, fmt.Sprintf("join version %d", v), &proto.ErrorFrame{Code: proto.CodeVersionMismatch,
			Message: fmt.Sprintf("join version %d is not supported (%d)", v, proto.RemoteJoinVersion)}
	}
	if slices.ContainsFunc(b[10:16], func(c byte) bool { return c != 0 }) {
		return id, false, "reserved bytes not zero", refused
	}
	copy(id[:], b[16:32])
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.tickets[id]
	switch {
	case t == nil:
		return id, false, "unknown or revoked ticket", refused
	case subtle.ConstantTimeCompare(t.secret[:], b[32:64]) != 1:
		return id, false, "wrong secret", refused
	case time.Now().Unix() > t.expires:
		return id, false, "expired ticket", refused
	}
	if t.singleUse {
		delete(l.tickets, id) // spent by this join, whatever happens to its connection (21.2)
	}
	return id, t.singleUse, "", nil
}

// handOver gives j to a pool waiting for it, or parks it until one asks, its HELLO bound
// passes ("pool full") or the listener closes.
func (l *Listener) handOver(j *joined, id [16]byte, singleUse bool) {
	l.mu.Lock()
	for i, w := range l.waiters {
		if (w.id != nil && *w.id == id) || (w.id == nil && !singleUse) {
			l.waiters = slices.Delete(l.waiters, i, i+1)
			w.ch <- j // capacity 1, one send per waiter
			l.releaseLocked(j.raw, true)
			l.mu.Unlock()
			return
		}
	}
	p := &parkedJoin{j: j, id: id, pool: !singleUse, taken: make(chan struct{})}
	l.parked = append(l.parked, p)
	l.mu.Unlock()
	t := time.NewTimer(time.Until(j.deadline))
	defer t.Stop()
	select {
	case <-p.taken:
		return
	case <-t.C:
	case <-l.closing:
	}
	l.mu.Lock()
	if p.gone {
		l.mu.Unlock()
		return
	}
	p.gone = true
	l.parked = slices.DeleteFunc(l.parked, func(x *parkedJoin) bool { return x == p })
	l.mu.Unlock()
	l.refuse(j.conn, j.raw, "pool full", &proto.ErrorFrame{Code: proto.CodeBadHandshake, Message: "join refused: the pool is full"})
}

// accept is the next connection that joined with the ticket id (nil: any pool ticket), until
// ctx ends (STARTUP_TIMEOUT or the context's error) or the listener closes (POOL_CLOSED).
func (l *Listener) accept(ctx context.Context, id *[16]byte) (*joined, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errorf(proto.CodePoolClosed, "the listener is closed")
	}
	for _, p := range l.parked {
		if (id != nil && p.id == *id) || (id == nil && p.pool) {
			p.gone = true
			l.parked = slices.DeleteFunc(l.parked, func(x *parkedJoin) bool { return x == p })
			close(p.taken)
			l.releaseLocked(p.j.raw, true)
			l.mu.Unlock()
			return p.j, nil
		}
	}
	w := &joinWaiter{id: id, ch: make(chan *joined, 1)}
	l.waiters = append(l.waiters, w)
	l.mu.Unlock()
	var why *Error
	select {
	case j := <-w.ch:
		return j, nil
	case <-ctx.Done():
		why = errorf(proto.CodeStartupTimeout, "no worker joined in time")
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			why = ctxError(ctx)
		}
	case <-l.closing:
		why = errorf(proto.CodePoolClosed, "the listener is closed")
	}
	l.mu.Lock()
	l.waiters = slices.DeleteFunc(l.waiters, func(x *joinWaiter) bool { return x == w })
	l.mu.Unlock()
	select {
	case j := <-w.ch: // handed over before the waiter left: it is this caller's all the same
		return j, nil
	default:
		return nil, why
	}
}

// forget drops a ticket nobody will use (its worker never joined).
func (l *Listener) forget(id [16]byte) {
	l.mu.Lock()
	delete(l.tickets, id)
	l.mu.Unlock()
}

// refuse counts and logs a refusal, answers with an ERROR id 0 when given one, and closes:
// the answer, then a half-close, then what the peer still sends (its HELLO) is read and
// dropped until it closes or refusalLinger passes, so that the answer is not lost to a reset
// of unread bytes.
func (l *Listener) refuse(conn, raw net.Conn, cause string, answer *proto.ErrorFrame) {
	l.refused(raw, cause)
	if answer != nil {
		_ = raw.SetDeadline(time.Now().Add(refusalLinger))
		if b, err := proto.AppendFrame(nil, answer); err == nil {
			if _, err := conn.Write(b); err == nil {
				if tc, ok := conn.(*tls.Conn); ok {
					_ = tc.CloseWrite() // close_notify
				}
				if tcp, ok := raw.(*net.TCPConn); ok {
					_ = tcp.CloseWrite()
				}
				_, _ = io.Copy(io.Discard, io.LimitReader(conn, 1<<20))
			}
		}
	}
	l.release(raw, false) // before the close its peer sees, so that Stats agrees with the peer
	_ = raw.Close()
}

// refused counts a refusal by cause and logs it, at most RefusalLogPerSecond lines a second.
func (l *Listener) refused(raw net.Conn, cause string) {
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.stats.Refused++
		l.stats.RefusedBy[causeKey(cause)]++
	}
	l.mu.Unlock()
	if closed {
		return // the listener's own Close, not the peer's doing
	}
	l.logMu.Lock()
	defer l.logMu.Unlock()
	now := time.Now()
	if now.Unix() != l.logSecond {
		l.flushDroppedLocked()
		l.logSecond, l.logLines = now.Unix(), 0
	}
	if l.logLines >= l.o.RefusalLogPerSecond {
		if l.logDropped == 0 {
			// The count is logged once this second ends, even if no refusal follows.
			l.logFlush = time.AfterFunc(time.Unix(now.Unix()+1, 0).Sub(now), func() {
				l.logMu.Lock()
				l.flushDroppedLocked()
				l.logMu.Unlock()
			})
		}
		l.logDropped++
		return
	}
	l.logLines++
	peer := raw.RemoteAddr().String()
	l.o.Logger.Warn(fmt.Sprintf("wirepool listener: refused %s: %s", peer, cause), "peer", peer, "cause", cause)
}

// flushDroppedLocked logs how many refusal lines the rate limit dropped; l.logMu is held.
func (l *Listener) flushDroppedLocked() {
	if l.logDropped > 0 {
		l.o.Logger.Warn(fmt.Sprintf("wirepool listener: %d more refusals not logged", l.logDropped), "dropped", l.logDropped)
	}
	l.logDropped = 0
}

// causeKey is a cause without its particulars: "join version 7" counts as "join version".
func causeKey(cause string) string {
	for i := range len(cause) {
		if cause[i] == '(' || ('0' <= cause[i] && cause[i] <= '9') {
			for i > 0 && cause[i-1] == ' ' {
				i--
			}
			return cause[:i]
		}
	}
	return cause
}
