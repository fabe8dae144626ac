package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/wirepool/wirepool/go/proto"
)

// connectTimeout bounds the TCP connect, and then the TLS handshake, of a remote join (21.5:
// the listener's join_timeout_ms).
const connectTimeout = proto.RemoteDefaultJoinTimeoutMs * time.Millisecond

// welcomeTimeout: no WELCOME within this of the TCP connect, the worker gives up (21.5).
const welcomeTimeout = proto.RemoteDefaultWelcomeTimeoutMs * time.Millisecond

// JoinError is a remote join that failed before anything reached the parent: the connect, the
// TLS handshake, or the pin (21.6: exit status 1).
type JoinError struct {
	Ticket *Ticket
	Err    error
}

func (e *JoinError) Error() string {
	return fmt.Sprintf("wirepool worker: cannot join the pool at %s (ticket %x): %v", e.Ticket.address(), e.Ticket.ID, e.Err)
}

func (e *JoinError) Unwrap() error { return e.Err }

var errPin = errors.New("the parent's certificate does not match the ticket's fingerprint")

// tlsConfig is the client side of 21.1: TLS 1.3 only, the pin as the whole check (no CA, no
// name, no dates), ALPN wirepool/1 alone, SNI only for a DNS name, no client certificate.
func tlsConfig(t *Ticket) *tls.Config {
	pin := t.Fingerprint
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		MaxVersion:         tls.VersionTLS13,
		NextProtos:         []string{proto.RemoteALPN},
		ServerName:         t.SNI(),
		InsecureSkipVerify: true, // the pin below is the whole check (21.1)
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errPin
			}
			if sum := sha256.Sum256(raw[0]); !bytes.Equal(sum[:], pin[:]) {
				return errPin
			}
			return nil
		},
	}
}

// join connects to the parent the ticket names and sends the JOIN block (21.3); HELLO follows
// on the returned connection. connected is the time of the TCP connect, from which the welcome
// timeout runs.
func join(ctx context.Context, t *Ticket) (conn net.Conn, connected time.Time, err error) {
	if t.Expired(time.Now()) {
		return nil, time.Time{}, ticketErr("the ticket %x has expired (it expired at Unix time %d; this clock says %d)", t.ID, t.Expires, time.Now().Unix())
	}
	fail := func(err error) (net.Conn, time.Time, error) {
		return nil, time.Time{}, &JoinError{Ticket: t, Err: err}
	}
	dialer := net.Dialer{Timeout: connectTimeout}
	raw, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(t.ConnectHost(), strconv.Itoa(int(t.Port))))
	if err != nil {
		return fail(err)
	}
	connected = time.Now()
	conn = raw
	if t.TLS {
		held := &heldConn{Conn: raw}
		tc := tls.Client(held, tlsConfig(t))
		hctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			_ = raw.Close()
			if errors.Is(err, errPin) {
				return fail(errPin)
			}
			return fail(fmt.Errorf("TLS 1.3 handshake: %w", err))
		}
		conn = &tlsConn{Conn: tc, raw: held}
	}
	_ = conn.SetWriteDeadline(time.Now().Add(connectTimeout))
	if _, err := conn.Write(t.joinBlock()); err != nil {
		_ = conn.Close()
		return fail(fmt.Errorf("sending the join: %w", err))
	}
	_ = conn.SetWriteDeadline(time.Time{})
	return conn, connected, nil
}

// tlsConn hands the TCP socket each Write's TLS records in one write: a chunk of whole frames
// (TakeOutput) then reaches the kernel together, so a worker that dies between two writes (a
// crash, an abort) leaves no frame cut at a record boundary for its parent to read as TRUNCATED.
type tlsConn struct {
	*tls.Conn
	raw *heldConn
}

func (c *tlsConn) Write(b []byte) (int, error) {
	c.raw.hold()
	n, err := c.Conn.Write(b)
	if ferr := c.raw.release(); err == nil && ferr != nil {
		return 0, ferr
	}
	return n, err
}

// heldConn is the TCP connection under TLS: while held, what TLS writes is kept, then written
// at once on release. The lock orders it with the records TLS writes from its read side (a
// KeyUpdate answer) and from Close (close_notify), which go straight out.
type heldConn struct {
	net.Conn
	mu   sync.Mutex
	held bool
	buf  []byte
}

func (c *heldConn) hold() {
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
}

func (c *heldConn) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = false
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	if cap(c.buf) > 8<<20 {
		c.buf = nil
	}
	return err
}

func (c *heldConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held {
		c.buf = append(c.buf, b...)
		return len(b), nil
	}
	return c.Conn.Write(b)
}
