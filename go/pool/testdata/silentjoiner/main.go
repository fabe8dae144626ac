// Command silentjoiner is a remote worker that joins with its ticket (WIREPOOL_TICKET) and then
// sends nothing, not even a HELLO: go/pool's TestRemoteHelloTimeout builds and runs it. It
// leaves at end of file, or after 60 s should the parent never close.
package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/wirepool/wirepool/go/proto"
	"github.com/wirepool/wirepool/go/worker"
)

func main() {
	tk, err := worker.ParseTicket(os.Getenv("WIREPOOL_TICKET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{proto.RemoteALPN}, InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || sha256.Sum256(raw[0]) != tk.Fingerprint {
				return errors.New("pin mismatch")
			}
			return nil
		}}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp",
		net.JoinHostPort(tk.ConnectHost(), strconv.Itoa(int(tk.Port))), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var b bytes.Buffer
	b.WriteString(proto.RemoteJoinMagic)
	b.Write([]byte{proto.RemoteJoinVersion, 0, 0, 0, 0, 0, 0, 0})
	b.Write(tk.ID[:])
	b.Write(tk.Secret[:])
	_, _ = c.Write(b.Bytes())
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	_, _ = io.Copy(io.Discard, c)
}
