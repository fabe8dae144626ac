package worker

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"io"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wirepool/wirepool/go/proto"
)

// remoteParent is a TLS listener that takes one worker's join, as a pool's listener does (21).
type remoteParent struct {
	t      *testing.T
	ln     net.Listener
	ticket map[string]any
	accept chan net.Conn
}

func newRemoteParent(t *testing.T) *remoteParent {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// Expired and named for nobody: the pin is the whole check (21.1).
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "someone else"},
		NotBefore: time.Unix(1e9, 0), NotAfter: time.Unix(1e9+60, 0)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{proto.RemoteALPN},
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	p := &remoteParent{t: t, ln: ln, accept: make(chan net.Conn, 1),
		ticket: map[string]any{"v": 1, "host": "127.0.0.1", "port": ln.Addr().(*net.TCPAddr).Port, "tls": true,
			"fingerprint": "sha256:" + hex.EncodeToString(sum[:]), "id": testID, "secret": testSecret,
			"expires": time.Now().Unix() + 3600}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err == nil {
			p.accept <- c
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return p
}

// serve runs w with the ticket doc and returns its outcome channel and stderr.
func (p *remoteParent) serve(w *Worker, doc map[string]any) (<-chan error, *bytes.Buffer) {
	var stderr bytes.Buffer
	w.stderr = &stderr
	w.ticketText = new(encodeTicket(p.t, doc))
	served := make(chan error, 1)
	go func() { served <- w.Serve(context.Background()) }()
	return served, &stderr
}

// join accepts the worker's connection and reads its JOIN block.
func (p *remoteParent) join() *tls.Conn {
	p.t.Helper()
	var c net.Conn
	select {
	case c = <-p.accept:
	case <-time.After(5 * time.Second):
		p.t.Fatal("the worker did not connect")
	}
	tc := c.(*tls.Conn)
	p.t.Cleanup(func() { _ = tc.Close() })
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	block := make([]byte, 64)
	if _, err := io.ReadFull(tc, block); err != nil {
		p.t.Fatal(err)
	}
	_ = tc.SetDeadline(time.Time{})
	st := tc.ConnectionState()
	if st.Version != tls.VersionTLS13 || st.NegotiatedProtocol != "wirepool/1" || st.ServerName != "" {
		p.t.Fatalf("TLS %x, ALPN %q, SNI %q", st.Version, st.NegotiatedProtocol, st.ServerName)
	}
	want, _ := hex.DecodeString("57495245" + "4a4f494e" + "0100" + "000000000000" + testID + testSecret)
	if !bytes.Equal(block, want) {
		p.t.Fatalf("JOIN block %x", block)
	}
	return tc
}

func waitServed(t *testing.T, served <-chan error) error {
	t.Helper()
	select {
	case err := <-served:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
		return nil
	}
}

func TestRemoteJoinHeartbeatsAndPongClock(t *testing.T) {
	p := newRemoteParent(t)
	w := New()
	Method(w, "add", func(_ context.Context, r addReq) (addResp, error) { return addResp{r.A + r.B}, nil })
	served, stderr := p.serve(w, p.ticket)
	conn := p.join()
	fp := &fakeParent{t: t, conn: conn, core: proto.NewConnection(proto.Parent), methods: map[string]uint16{}, buf: make([]byte, 1<<20)}
	hello, ok := fp.next().(*proto.Hello)
	if !ok || len(hello.Methods) != 1 {
		t.Fatalf("HELLO %+v", hello)
	}
	fp.methods["add"] = 0
	welcome, _, err := proto.Negotiate(hello, proto.Offer{MaxFrameSize: proto.DefaultMaxFrameSize, InitialCredit: proto.DefaultInitialCredit,
		HeartbeatMs: 20, MaxInFlight: 8, MaxMessageSize: proto.DefaultMaxMessageSize, Remote: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := fp.core.SendWelcome(welcome); err != nil {
		t.Fatal(err)
	}
	fp.flush()
	id := fp.request("add", `{"A": 2, "B": 3}`, 0)
	// The worker pings every heartbeat_ms; answered, it stays.
	pings, result := 0, false
	for pings < 5 || !result {
		switch e := fp.next().(type) {
		case *proto.Ping:
			pings++
			if err := fp.core.SendPong(e.Nonce); err != nil {
				t.Fatal(err)
			}
			fp.flush()
		case *proto.Result:
			if e.ID != id || string(e.Body) != `{"sum":5}` {
				t.Fatalf("RESULT %d %q", e.ID, e.Body)
			}
			result = true
		default:
			t.Fatalf("%T", e)
		}
	}
	// Unanswered, the PONG clock judges the parent gone: exit as after end of file (nil).
	if err := waitServed(t, served); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if !strings.Contains(stderr.String(), "the parent is gone: no PONG") || strings.Count(stderr.String(), "\n") != 1 {
		t.Fatalf("stderr %q", stderr.String())
	}
}

func TestRemoteJoinRefused(t *testing.T) {
	p := newRemoteParent(t)
	served, _ := p.serve(New(), p.ticket)
	conn := p.join()
	core := proto.NewConnection(proto.Parent)
	if err := core.Refuse(proto.CodeBadHandshake, "join refused"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(core.TakeOutput(-1)); err != nil {
		t.Fatal(err)
	}
	err := waitServed(t, served)
	var fe *FatalError
	if !errors.As(err, &fe) || !fe.Refused || fe.Code != proto.CodeBadHandshake {
		t.Fatalf("Serve: %v", err)
	}
	if !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "join refused") {
		t.Fatalf("%q", err)
	}
}

func TestRemoteNoWelcome(t *testing.T) {
	p := newRemoteParent(t)
	w := New()
	w.welcomeWithin = 100 * time.Millisecond
	served, stderr := p.serve(w, p.ticket)
	p.join()
	if err := waitServed(t, served); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if !strings.Contains(stderr.String(), "no WELCOME within 100ms") {
		t.Fatalf("stderr %q", stderr.String())
	}
}

func TestRemoteJoinFailsBeforeSending(t *testing.T) {
	p := newRemoteParent(t)
	// A wrong pin: the handshake fails and nothing is sent.
	wrong := with(p.ticket, "fingerprint", testFP)
	served, _ := p.serve(New(), wrong)
	c := <-p.accept
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	read := make(chan int, 1)
	go func() { // the server's side of the handshake runs in its first Read
		n, _ := c.Read(make([]byte, 64))
		read <- n
	}()
	err := waitServed(t, served)
	var je *JoinError
	if !errors.As(err, &je) || !errors.Is(err, errPin) || strings.Contains(err.Error(), testSecret) {
		t.Fatalf("Serve: %v", err)
	}
	if n := <-read; n != 0 {
		t.Fatalf("the parent read %d bytes after a wrong pin", n)
	}
	_ = c.Close()
	// Expired by this clock: refused before connecting.
	served, _ = p.serve(New(), with(p.ticket, "expires", time.Now().Unix()-1))
	err = waitServed(t, served)
	var te *TicketError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Serve: %v", err)
	}
	// Nobody listening: a JoinError.
	_ = p.ln.Close()
	served, _ = p.serve(New(), p.ticket)
	if err := waitServed(t, served); !errors.As(err, &je) {
		t.Fatalf("Serve: %v", err)
	}
}
