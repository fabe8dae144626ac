package worker

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	testID     = "00112233445566778899aabbccddeeff"
	testSecret = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
	testFP     = "sha256:ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
)

func goodDoc() map[string]any {
	return map[string]any{"v": 1, "host": "pool.example", "port": 7070, "tls": true,
		"fingerprint": testFP, "id": testID, "secret": testSecret, "expires": 2000000000}
}

func encodeTicket(t *testing.T, doc any) string {
	t.Helper()
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return "wirepool-ticket-1." + base64.RawURLEncoding.EncodeToString(b)
}

func encodeRaw(raw string) string {
	return "wirepool-ticket-1." + base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func with(doc map[string]any, key string, v any) map[string]any {
	out := map[string]any{}
	for k, x := range doc {
		out[k] = x
	}
	if v == nil {
		delete(out, key)
	} else {
		out[key] = v
	}
	return out
}

func TestParseTicket(t *testing.T) {
	tk, err := ParseTicket("  \t" + encodeTicket(t, with(goodDoc(), "later", []int{1})) + "\r\n")
	if err != nil {
		t.Fatal(err)
	}
	if tk.Host != "pool.example" || tk.Port != 7070 || !tk.TLS || tk.Expires != 2000000000 {
		t.Fatalf("%+v", tk)
	}
	if tk.ID[0] != 0x00 || tk.ID[15] != 0xff || tk.Secret[31] != 0x1f || tk.Fingerprint[0] != 0xff {
		t.Fatalf("%+v", tk)
	}
	if tk.SNI() != "pool.example" || tk.address() != "pool.example:7070" {
		t.Fatalf("SNI %q, address %q", tk.SNI(), tk.address())
	}
	if s := tk.String(); strings.Contains(s, testSecret) || !strings.Contains(s, testID) {
		t.Fatalf("String() = %q", s)
	}
	block := tk.joinBlock()
	if len(block) != 64 || string(block[:8]) != "WIREJOIN" || block[8] != 1 || block[9] != 0 ||
		string(block[10:16]) != "\x00\x00\x00\x00\x00\x00" || block[16] != 0x00 || block[31] != 0xff || block[63] != 0x1f {
		t.Fatalf("JOIN block %x", block)
	}
	// '=' padding, which a writer omits, is accepted.
	text := encodeTicket(t, goodDoc())
	if pad := (4 - (len(text)-len("wirepool-ticket-1."))%4) % 4; pad > 0 {
		if _, err := ParseTicket(text + strings.Repeat("=", pad)); err != nil {
			t.Fatalf("padded: %v", err)
		}
	}
	// Expiry in whole seconds: valid through second expires.
	if tk.Expired(time.Unix(2000000000, 999_000_000)) || !tk.Expired(time.Unix(2000000001, 0)) {
		t.Fatal("expiry is not by whole seconds")
	}
	// IPv6: without brackets, and in brackets (stripped to connect); no SNI for an IP literal.
	for _, host := range []string{"::1", "[::1]"} {
		tk, err := ParseTicket(encodeTicket(t, with(goodDoc(), "host", host)))
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		if tk.ConnectHost() != "::1" || tk.SNI() != "" || tk.address() != "[::1]:7070" {
			t.Fatalf("%s: connect %q, SNI %q, address %q", host, tk.ConnectHost(), tk.SNI(), tk.address())
		}
	}
	if tk, _ := ParseTicket(encodeTicket(t, with(goodDoc(), "host", "10.0.0.7"))); tk == nil || tk.SNI() != "" {
		t.Fatal("an IPv4 literal is sent as SNI")
	}
	// Plain TCP on loopback; a malformed fingerprint is then ignored.
	for _, host := range []string{"127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost"} {
		doc := with(with(goodDoc(), "tls", false), "host", host)
		if _, err := ParseTicket(encodeTicket(t, with(doc, "fingerprint", "nonsense"))); err != nil {
			t.Fatalf("plain %s: %v", host, err)
		}
	}
	// At most 4,096 characters after trimming.
	long := ""
	for n := 2000; len(long) < 4096; n++ {
		long = encodeTicket(t, with(goodDoc(), "pad", strings.Repeat("a", n)))
	}
	if len(long) != 4096 {
		t.Fatalf("made a ticket of %d characters", len(long))
	}
	if _, err := ParseTicket("\n" + long + " \t\r\n"); err != nil {
		t.Fatalf("a ticket of 4,096 characters: %v", err)
	}
	if _, err := ParseTicket(long + "A"); err == nil {
		t.Fatal("a ticket of 4,097 characters was accepted")
	}
}

func TestParseTicketRefuses(t *testing.T) {
	good := encodeTicket(t, goodDoc())
	body := strings.TrimPrefix(good, "wirepool-ticket-1.")
	cases := []struct {
		name, text, says string
	}{
		{"empty", "", "not a wirepool ticket"},
		{"not a ticket", "not a ticket", "not a wirepool ticket"},
		{"other prefix", "wirepool-ticket-2." + body, "not a wirepool ticket"},
		{"too long", encodeTicket(t, with(goodDoc(), "pad", strings.Repeat("a", 3100))), "at most 4096 characters"},
		{"whitespace inside", good[:40] + " " + good[40:], "not base64url JSON"},
		{"newline inside", good[:40] + "\n" + good[40:], "not base64url JSON"},
		{"standard alphabet", "wirepool-ticket-1." + base64.RawStdEncoding.EncodeToString([]byte(`{"v":1,"host":"a?>"}`)), "not base64url JSON"},
		{"bad padding", good + "===", "not base64url JSON"},
		{"one char too many", good + "A", "not base64url JSON"},
		{"not JSON", encodeRaw("{nope"), "not base64url JSON"},
		{"trailing JSON", encodeRaw(`{"v":1} {}`), "not base64url JSON"},
		{"not UTF-8", encodeRaw("{\"v\":1,\"host\":\"\xff\"}"), "not base64url JSON"},
		{"not an object", encodeRaw(`[1]`), "not a JSON object"},
		{"no v", encodeTicket(t, with(goodDoc(), "v", nil)), "version (missing) is not supported"},
		{"v 2", encodeTicket(t, with(goodDoc(), "v", 2)), "version 2 is not supported"},
		{"v 1.0", encodeRaw(strings.Replace(encodeJSON(t, goodDoc()), `"v":1`, `"v":1.0`, 1)), "version 1.0 is not supported"},
		{"v true", encodeTicket(t, with(goodDoc(), "v", true)), "version true is not supported"},
		{"no host", encodeTicket(t, with(goodDoc(), "host", nil)), `"host" must be a string`},
		{"host number", encodeTicket(t, with(goodDoc(), "host", 7)), `"host" must be a string`},
		{"empty host", encodeTicket(t, with(goodDoc(), "host", "")), "host must be 1-253 bytes"},
		{"long host", encodeTicket(t, with(goodDoc(), "host", strings.Repeat("a.", 127))), "host must be 1-253 bytes"},
		{"bad host", encodeTicket(t, with(goodDoc(), "host", "a b")), "neither a host name nor an IP literal"},
		{"bad label", encodeTicket(t, with(goodDoc(), "host", "-a.example")), "neither a host name nor an IP literal"},
		{"bracketed IPv4", encodeTicket(t, with(goodDoc(), "host", "[127.0.0.1]")), "only an IPv6 literal goes in brackets"},
		{"bracketed name", encodeTicket(t, with(goodDoc(), "host", "[localhost]")), "only an IPv6 literal goes in brackets"},
		{"no port", encodeTicket(t, with(goodDoc(), "port", nil)), `"port" must be an integer`},
		{"port string", encodeTicket(t, with(goodDoc(), "port", "7070")), `"port" must be an integer`},
		{"port fraction", encodeTicket(t, with(goodDoc(), "port", 70.5)), `"port" must be an integer`},
		{"port 0", encodeTicket(t, with(goodDoc(), "port", 0)), "port must be 1-65535"},
		{"port 65536", encodeTicket(t, with(goodDoc(), "port", 65536)), "port must be 1-65535"},
		{"no tls", encodeTicket(t, with(goodDoc(), "tls", nil)), `"tls" must be true or false`},
		{"tls 1", encodeTicket(t, with(goodDoc(), "tls", 1)), `"tls" must be true or false`},
		{"no expires", encodeTicket(t, with(goodDoc(), "expires", nil)), `"expires" must be an integer`},
		{"expires fraction", encodeTicket(t, with(goodDoc(), "expires", 1.5)), `"expires" must be an integer`},
		{"expires string", encodeTicket(t, with(goodDoc(), "expires", "2000000000")), `"expires" must be an integer`},
		{"no fingerprint", encodeTicket(t, with(goodDoc(), "fingerprint", nil)), `"fingerprint" must be 'sha256:'`},
		{"fingerprint no prefix", encodeTicket(t, with(goodDoc(), "fingerprint", testFP[7:])), `"fingerprint" must be 'sha256:'`},
		{"fingerprint short", encodeTicket(t, with(goodDoc(), "fingerprint", testFP[:70])), `"fingerprint" must be 64 lowercase hex digits`},
		{"fingerprint upper", encodeTicket(t, with(goodDoc(), "fingerprint", strings.ToUpper(testFP[7:])+"")), `"fingerprint" must be 'sha256:'`},
		{"fingerprint uppercase hex", encodeTicket(t, with(goodDoc(), "fingerprint", "sha256:"+strings.ToUpper(testFP[7:]))), `"fingerprint" must be 64 lowercase hex digits`},
		{"fingerprint not hex", encodeTicket(t, with(goodDoc(), "fingerprint", "sha256:"+strings.Repeat("g", 64))), `"fingerprint" is not hex`},
		{"plain non-loopback", encodeTicket(t, with(with(goodDoc(), "tls", false), "host", "10.0.0.7")), "loopback only"},
		{"plain name", encodeTicket(t, with(goodDoc(), "tls", false)), "loopback only"},
		{"no id", encodeTicket(t, with(goodDoc(), "id", nil)), `"id" must be 32 lowercase hex digits`},
		{"id short", encodeTicket(t, with(goodDoc(), "id", testID[:30])), `"id" must be 32 lowercase hex digits`},
		{"id upper", encodeTicket(t, with(goodDoc(), "id", strings.ToUpper(testID))), `"id" must be 32 lowercase hex digits`},
		{"no secret", encodeTicket(t, with(goodDoc(), "secret", nil)), `"secret" must be 64 lowercase hex digits`},
		{"secret number", encodeTicket(t, with(goodDoc(), "secret", 5)), `"secret" must be 64 lowercase hex digits`},
		{"secret not hex", encodeTicket(t, with(goodDoc(), "secret", strings.Repeat("z", 64))), `"secret" is not hex`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tk, err := ParseTicket(c.text)
			var te *TicketError
			if !errors.As(err, &te) {
				t.Fatalf("got %+v, %v; want a TicketError saying %q", tk, err, c.says)
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Fatalf("%q does not say %q", err, c.says)
			}
			if strings.Contains(err.Error(), testSecret) {
				t.Fatalf("the secret is in the error: %q", err)
			}
		})
	}
}

func encodeJSON(t *testing.T, doc any) string {
	t.Helper()
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestTicketFromEnv(t *testing.T) {
	good := encodeTicket(t, goodDoc())
	t.Setenv("WIREPOOL_TICKET", "")
	t.Setenv("WIREPOOL_TICKET_FILE", "")
	_ = os.Unsetenv("WIREPOOL_TICKET")
	_ = os.Unsetenv("WIREPOOL_TICKET_FILE")
	if tk, err := ticketFromEnv(); tk != nil || err != nil {
		t.Fatalf("no variable: %v, %v", tk, err)
	}
	path := filepath.Join(t.TempDir(), "ticket")
	if err := os.WriteFile(path, []byte(good+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WIREPOOL_TICKET_FILE", path)
	if tk, err := ticketFromEnv(); err != nil || tk.Port != 7070 {
		t.Fatalf("from a file: %v, %v", tk, err)
	}
	if _, ok := os.LookupEnv("WIREPOOL_TICKET_FILE"); ok {
		t.Fatal("WIREPOOL_TICKET_FILE is still set")
	}
	// The text wins over the file, and both are removed.
	t.Setenv("WIREPOOL_TICKET", "not a ticket")
	t.Setenv("WIREPOOL_TICKET_FILE", path)
	if _, err := ticketFromEnv(); err == nil || !strings.Contains(err.Error(), "not a wirepool ticket") {
		t.Fatalf("WIREPOOL_TICKET did not win: %v", err)
	}
	for _, k := range []string{"WIREPOOL_TICKET", "WIREPOOL_TICKET_FILE"} {
		if _, ok := os.LookupEnv(k); ok {
			t.Fatalf("%s is still set", k)
		}
	}
	t.Setenv("WIREPOOL_TICKET_FILE", filepath.Join(t.TempDir(), "missing"))
	if _, err := ticketFromEnv(); err == nil || !strings.Contains(err.Error(), "cannot read WIREPOOL_TICKET_FILE") {
		t.Fatalf("a missing file: %v", err)
	}
	// A file is read up to 4,160 bytes: a longer one is too long, not read whole.
	if err := os.WriteFile(path, []byte(good+strings.Repeat(" ", 5000)+"x"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WIREPOOL_TICKET_FILE", path)
	if tk, err := ticketFromEnv(); err != nil {
		t.Fatalf("a ticket with trailing spaces past 4,160 bytes: %v, %v", tk, err)
	}
}

func TestTicketEncodeRoundTrips(t *testing.T) {
	tk, err := ParseTicket(encodeTicket(t, goodDoc()))
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseTicket(tk.Encode())
	if err != nil || *back != *tk {
		t.Fatalf("%v: %+v != %+v", err, back, tk)
	}
	plain := *tk
	plain.Host, plain.TLS, plain.Fingerprint = "127.0.0.1", false, [32]byte{}
	back, err = ParseTicket(plain.Encode())
	if err != nil || *back != plain {
		t.Fatalf("%v: %+v != %+v", err, back, plain)
	}
}
