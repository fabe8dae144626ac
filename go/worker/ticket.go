package worker

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wirepool/wirepool/go/proto"
)

// Ticket is a join ticket (PROTOCOL.md 21.2): where a remote worker connects, whom it trusts
// and what it proves. Its secret is never printed: String names the ticket by its id.
type Ticket struct {
	// Host is the listener's host name or IP literal, as the ticket gives it (an IPv6
	// literal may be in brackets; ConnectHost strips them).
	Host string
	Port uint16
	// TLS is false only for plain TCP on a loopback address (21.1).
	TLS bool
	// Fingerprint is the SHA-256 of the parent certificate's DER (when TLS).
	Fingerprint [32]byte
	ID          [16]byte
	Secret      [32]byte
	// Expires is the Unix second after which the parent refuses the ticket (its last valid one).
	Expires int64
}

// TicketError says why a ticket is unusable (21.2): the worker exits with status 1.
type TicketError struct{ Reason string }

func (e *TicketError) Error() string { return "wirepool worker: unusable join ticket: " + e.Reason }

func ticketErr(format string, args ...any) error {
	return &TicketError{Reason: fmt.Sprintf(format, args...)}
}

// String names the ticket by its id and address, never its secret.
func (t *Ticket) String() string {
	return fmt.Sprintf("ticket %x for %s", t.ID, t.address())
}

// ConnectHost is Host without the brackets of an IPv6 literal.
func (t *Ticket) ConnectHost() string { return unbracket(t.Host) }

// SNI is the TLS server name the worker sends: the host when it is a DNS name, "" (none) for an
// IP literal (21.1).
func (t *Ticket) SNI() string {
	if _, err := netip.ParseAddr(t.ConnectHost()); err == nil {
		return ""
	}
	return t.Host
}

// Expired says whether the Unix time now is past Expires, in whole seconds: a ticket is valid
// through second Expires, with no allowance for clock skew (21.2).
func (t *Ticket) Expired(now time.Time) bool { return now.Unix() > t.Expires }

func (t *Ticket) address() string {
	return fmt.Sprintf("%s:%d", bracketed(t.ConnectHost()), t.Port)
}

func bracketed(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}

// joinBlock is the 64 bytes sent before HELLO (21.3).
func (t *Ticket) joinBlock() []byte {
	b := make([]byte, 0, proto.RemoteJoinBytes)
	b = append(b, proto.RemoteJoinMagic...)
	b = append(b, byte(proto.RemoteJoinVersion), byte(proto.RemoteJoinVersion>>8))
	b = append(b, 0, 0, 0, 0, 0, 0)
	b = append(b, t.ID[:]...)
	return append(b, t.Secret[:]...)
}

func unbracket(host string) string {
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		return host[1 : len(host)-1]
	}
	return host
}

// isLoopback: the name localhost (RFC 6761) or a loopback IP literal (127.0.0.0/8, ::1), also
// in brackets.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(unbracket(host))
	return err == nil && a.Unmap().IsLoopback()
}

// A host name's labels: letters, digits, hyphens (underscores seen in the wild), 1-63 each.
var hostLabel = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$`)

func checkHost(host string) error {
	if len(host) < 1 || len(host) > 253 {
		return ticketErr("its host must be 1-253 bytes")
	}
	if strings.HasPrefix(host, "[") {
		inner := unbracket(host)
		if a, err := netip.ParseAddr(inner); inner == host || err != nil || !a.Is6() {
			return ticketErr("its host %q: only an IPv6 literal goes in brackets", host)
		}
		return nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	name := strings.TrimSuffix(host, ".")
	for label := range strings.SplitSeq(name, ".") {
		if !hostLabel.MatchString(label) {
			return ticketErr("its host %q is neither a host name nor an IP literal", host)
		}
	}
	return nil
}

// isBase64URL: the base64url alphabet only (no padding, no whitespace).
func isBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

var integer = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// intField is a JSON integer (no fraction, no exponent) that fits an int64.
func intField(doc map[string]any, name string) (int64, bool) {
	n, ok := doc[name].(json.Number)
	if !ok || !integer.MatchString(string(n)) {
		return 0, false
	}
	v, err := n.Int64()
	return v, err == nil
}

func hexField(doc map[string]any, name string, dst []byte) error {
	s, ok := doc[name].(string)
	if !ok {
		return ticketErr("its field %q must be %d lowercase hex digits", name, 2*len(dst))
	}
	return hexInto(s, name, dst)
}

func hexInto(s, name string, dst []byte) error {
	if len(s) != 2*len(dst) || s != strings.ToLower(s) {
		return ticketErr("its field %q must be %d lowercase hex digits", name, 2*len(dst))
	}
	if _, err := hex.Decode(dst, []byte(s)); err != nil {
		return ticketErr("its field %q is not hex", name)
	}
	return nil
}

// ParseTicket reads a ticket's text form (21.2). The spaces, tabs, CRs and LFs around it are
// trimmed, then the 4,096-character limit applies; whitespace inside, or a character of the body
// outside the base64url alphabet, makes it unusable ('=' padding is accepted). Unknown fields
// are ignored. The error is a *TicketError saying what is wrong.
func ParseTicket(text string) (*Ticket, error) {
	text = strings.Trim(text, " \t\r\n")
	if utf8.RuneCountInString(text) > proto.RemoteTicketMaxChars {
		return nil, ticketErr("a ticket is at most %d characters", proto.RemoteTicketMaxChars)
	}
	body, ok := strings.CutPrefix(text, proto.RemoteTicketPrefix)
	if !ok {
		return nil, ticketErr("not a wirepool ticket (it must start with %q)", proto.RemoteTicketPrefix)
	}
	unpadded := strings.TrimRight(body, "=")
	pad := len(body) - len(unpadded)
	if !isBase64URL(unpadded) || len(unpadded)%4 == 1 || (pad != 0 && pad != (4-len(unpadded)%4)%4) {
		return nil, ticketErr("its body is not base64url JSON")
	}
	raw, err := base64.RawURLEncoding.DecodeString(unpadded)
	if err != nil || !utf8.Valid(raw) {
		return nil, ticketErr("its body is not base64url JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, ticketErr("its body is not base64url JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, ticketErr("its body is not base64url JSON")
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil, ticketErr("its body is not a JSON object")
	}
	if ver, ok := intField(doc, "v"); !ok || ver != 1 {
		return nil, ticketErr("ticket version %v is not supported (1)", jsonText(doc["v"]))
	}
	t := &Ticket{}
	host, ok := doc["host"].(string)
	if !ok {
		return nil, ticketErr("its field \"host\" must be a string")
	}
	if err := checkHost(host); err != nil {
		return nil, err
	}
	t.Host = host
	if n, isNum := doc["port"].(json.Number); !isNum || !integer.MatchString(string(n)) {
		return nil, ticketErr("its field \"port\" must be an integer")
	}
	port, ok := intField(doc, "port")
	if !ok || port < 1 || port > 65535 {
		return nil, ticketErr("its port must be 1-65535")
	}
	t.Port = uint16(port)
	tlsOn, ok := doc["tls"].(bool)
	if !ok {
		return nil, ticketErr("its field \"tls\" must be true or false")
	}
	t.TLS = tlsOn
	if t.Expires, ok = intField(doc, "expires"); !ok {
		return nil, ticketErr("its field \"expires\" must be an integer (Unix seconds)")
	}
	if tlsOn {
		fp, ok := doc["fingerprint"].(string)
		digits, cut := strings.CutPrefix(fp, "sha256:")
		if !ok || !cut {
			return nil, ticketErr("its field \"fingerprint\" must be 'sha256:' and 64 hex digits")
		}
		if err := hexInto(digits, "fingerprint", t.Fingerprint[:]); err != nil {
			return nil, err
		}
	} else if !isLoopback(host) {
		return nil, ticketErr("plain TCP (tls false) is allowed on loopback only, not %q", host)
	}
	if err := hexField(doc, "id", t.ID[:]); err != nil {
		return nil, err
	}
	if err := hexField(doc, "secret", t.Secret[:]); err != nil {
		return nil, err
	}
	return t, nil
}

// Encode is the ticket's text form (21.2): the prefix and the base64url (unpadded) JSON object;
// ParseTicket reads it back. It holds the secret: pass it to one worker, never log it.
func (t *Ticket) Encode() string {
	doc := map[string]any{"v": 1, "host": t.Host, "port": t.Port, "tls": t.TLS,
		"id": hex.EncodeToString(t.ID[:]), "secret": hex.EncodeToString(t.Secret[:]), "expires": t.Expires}
	if t.TLS {
		doc["fingerprint"] = "sha256:" + hex.EncodeToString(t.Fingerprint[:])
	}
	b, _ := json.Marshal(doc) // strings, integers and booleans: cannot fail
	return proto.RemoteTicketPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func jsonText(v any) string {
	if v == nil {
		return "(missing)"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// ticketFromEnv is the ticket in WIREPOOL_TICKET or else in the file WIREPOOL_TICKET_FILE
// names (at most 4,160 bytes read), or nil when neither is set. Both variables are removed so
// the worker's children do not inherit the secret.
func ticketFromEnv() (*Ticket, error) {
	text, ok := os.LookupEnv("WIREPOOL_TICKET")
	path, fromFile := os.LookupEnv("WIREPOOL_TICKET_FILE")
	_ = os.Unsetenv("WIREPOOL_TICKET")
	_ = os.Unsetenv("WIREPOOL_TICKET_FILE")
	if !ok {
		if !fromFile {
			return nil, nil
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, ticketErr("cannot read WIREPOOL_TICKET_FILE %q: %v", path, unwrapPath(err))
		}
		defer f.Close()
		data, err := io.ReadAll(io.LimitReader(f, proto.RemoteTicketMaxChars+64))
		if err != nil {
			return nil, ticketErr("cannot read WIREPOOL_TICKET_FILE %q: %v", path, unwrapPath(err))
		}
		if !utf8.Valid(data) {
			return nil, ticketErr("WIREPOOL_TICKET_FILE %q is not a ticket (not UTF-8 text)", path)
		}
		text = string(data)
	}
	return ParseTicket(text)
}

func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
