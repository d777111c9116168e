package redact

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

const (
	testKeyID  = "AKIAIOSFODNN7EXAMPLE"
	testSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	testToken  = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
	pemBody    = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\nVTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n"
)

var testPEM = "-----BEGIN RSA PRIVATE KEY-----\n" + pemBody + "-----END RSA PRIVATE KEY-----"

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"plain", "hello world\n", "hello world\n"},
		{"empty", "", ""},
		{"bearer header", "Authorization: Bearer " + testToken + "\n", "Authorization: Bearer [REDACTED]\n"},
		{"bearer any case, tab", "BEARER\tabcdefgh12345 ok", "BEARER\t[REDACTED] ok"},
		{"bearer lower, token at EOF", "bearer abcdefgh", "bearer [REDACTED]"},
		{"bearer short token kept", "bearer abc\n", "bearer abc\n"},
		{"bearer word alone", "the bearer of news", "the bearer of news"},
		{"bearer too many blanks", "bearer" + strings.Repeat(" ", 17) + "abcdefghij", "bearer" + strings.Repeat(" ", 17) + "abcdefghij"},
		{"access key id", "key=" + testKeyID + ".", "key=[REDACTED]."},
		{"session key id", "ASIAY34FZKBOKMUTVV7A", "[REDACTED]"},
		{"key id longer run dropped", testKeyID + "XYZ9 next", "[REDACTED] next"},
		{"key id too short", "AKIA1234567890ABCDE", "AKIA1234567890ABCDE"},
		{"key id lower case kept", "akiaiosfodnn7example", "akiaiosfodnn7example"},
		{"secret ini", "aws_secret_access_key = " + testSecret + "\n", "aws_secret_access_key = [REDACTED]\n"},
		{"secret env", "AWS_SECRET_ACCESS_KEY=" + testSecret, "AWS_SECRET_ACCESS_KEY=[REDACTED]"},
		{"secret json", `{"aws_secret_access_key": "` + testSecret + `"}`, `{"aws_secret_access_key": "[REDACTED]"}`},
		{"secret yaml", "aws_secret_access_key: '" + testSecret + "'", "aws_secret_access_key: '[REDACTED]'"},
		{"secret without value", "aws_secret_access_key=\n", "aws_secret_access_key=\n"},
		{"secret name alone", "set aws_secret_access_key first", "set aws_secret_access_key first"},
		{"pem block", "before\n" + testPEM + "\nafter\n", "before\n[REDACTED]\nafter\n"},
		{"openssh block", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----", "[REDACTED]"},
		{"pkcs8 block", "x-----BEGIN PRIVATE KEY-----\nMIIEvQ\n-----END PRIVATE KEY-----y", "x[REDACTED]y"},
		{"pgp block", "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----\n", "[REDACTED]\n"},
		{"two blocks", testPEM + "\n" + testPEM, "[REDACTED]\n[REDACTED]"},
		{"unterminated block", "a\n-----BEGIN EC PRIVATE KEY-----\n" + pemBody, "a\n[REDACTED]"},
		{"public key kept", "-----BEGIN PUBLIC KEY-----\nMFkwEw\n-----END PUBLIC KEY-----", "-----BEGIN PUBLIC KEY-----\nMFkwEw\n-----END PUBLIC KEY-----"},
		{"certificate kept", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"},
		{"lower-case label kept", "-----BEGIN rsa private key-----\nabc", "-----BEGIN rsa private key-----\nabc"},
		{"dashes", "----- ------BEGIN -----", "----- ------BEGIN -----"},
		{"all together", "Bearer " + testToken + " " + testKeyID + " aws_secret_access_key=" + testSecret + " " + testPEM,
			"Bearer [REDACTED] [REDACTED] aws_secret_access_key=[REDACTED] [REDACTED]"},
		{"binary around", "\x00\xff" + testKeyID + "\x00", "\x00\xff[REDACTED]\x00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(Bytes([]byte(tc.in))); got != tc.want {
				t.Errorf("Bytes(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// stream feeds in through one Redactor in the given chunk sizes (cycled)
// and returns the output, checking the held bound after every Write.
func stream(t *testing.T, in []byte, sizes []int) []byte {
	t.Helper()
	r := New()
	var out []byte
	for i, k := 0, 0; i < len(in); k++ {
		n := min(sizes[k%len(sizes)], len(in)-i)
		chunk := bytes.Clone(in[i : i+n])
		out = append(out, r.Write(chunk)...)
		// The caller reuses its buffer: scribbling over it must not matter.
		for j := range chunk {
			chunk[j] = '#'
		}
		if r.Held() > MaxHeld {
			t.Fatalf("held %d bytes after a write, more than MaxHeld %d", r.Held(), MaxHeld)
		}
		i += n
	}
	return append(out, r.Flush()...)
}

// fragments are the pieces random inputs are made of: secrets, near misses
// and noise, so that cuts land inside every pattern.
var fragments = []string{
	"Bearer " + testToken, "bearer  abcdefgh", "BEARER x", "Bearer", "bear", " ", "\n", "\t",
	testKeyID, "ASIA0000000000000000", "AKIA", "AKIA12345", "A", "a",
	"aws_secret_access_key=" + testSecret, `"aws_secret_access_key": "` + testSecret + `"`,
	"aws_secret_access_key", "aws_secret", "=", ":", "'", `"`,
	testPEM, "-----BEGIN RSA PRIVATE KEY-----\n", "-----END RSA PRIVATE KEY-----", "-----BEGIN ", "-----", "-",
	"-----BEGIN CERTIFICATE-----", "PRIVATE KEY", "hello world", "0123456789", "\x00\xff",
}

func randomInput(rng *rand.Rand, parts int) []byte {
	var b []byte
	for range parts {
		b = append(b, fragments[rng.IntN(len(fragments))]...)
	}
	return b
}

func TestChunkingDoesNotChangeOutput(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 300 {
		in := randomInput(rng, 1+rng.IntN(12))
		want := Bytes(in)
		// Every single cut.
		for cut := 0; cut <= len(in); cut++ {
			r := New()
			got := append(r.Write(bytes.Clone(in[:cut])), r.Write(bytes.Clone(in[cut:]))...)
			got = append(got, r.Flush()...)
			if !bytes.Equal(got, want) {
				t.Fatalf("input %d %q cut at %d:\n got %q\nwant %q", n, in, cut, got, want)
			}
		}
		// Byte by byte, and random chunkings.
		for _, sizes := range [][]int{{1}, {2, 3}, {rng.IntN(7) + 1, rng.IntN(50) + 1, rng.IntN(3) + 1}} {
			if got := stream(t, in, sizes); !bytes.Equal(got, want) {
				t.Fatalf("input %d %q in chunks %v:\n got %q\nwant %q", n, in, sizes, got, want)
			}
		}
	}
}

func TestNoSecretReachesOutput(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	const b64 = alnum + "abcdefghijklmnopqrstuvwxyz/+"
	pick := func(set string, n int) string {
		var sb strings.Builder
		for range n {
			sb.WriteByte(set[rng.IntN(len(set))])
		}
		return sb.String()
	}
	for n := range 500 {
		keyID := []string{"AKIA", "ASIA"}[rng.IntN(2)] + pick(alnum, 16)
		secret := pick(b64, 40)
		token := pick(b64+"._~-=", 8+rng.IntN(60))
		var body strings.Builder
		for range 1 + rng.IntN(40) {
			body.WriteString(pick(b64, 64) + "\n")
		}
		pemLine := strings.SplitN(body.String(), "\n", 2)[0]
		label := []string{"RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY", "ENCRYPTED PRIVATE KEY"}[rng.IntN(5)]
		in := strings.Join([]string{
			pick(b64, rng.IntN(30)),
			"Authorization: " + []string{"Bearer", "bearer", "BEARER"}[rng.IntN(3)] + " " + token,
			"id " + keyID,
			[]string{"aws_secret_access_key = ", "AWS_SECRET_ACCESS_KEY=", `"aws_secret_access_key":"`}[rng.IntN(3)] + secret,
			"-----BEGIN " + label + "-----\n" + body.String() + "-----END " + label + "-----",
			pick(b64, rng.IntN(30)),
		}, []string{"\n", " ", "\r\n"}[rng.IntN(3)])
		sizes := []int{1 + rng.IntN(100), 1 + rng.IntN(5)}
		out := string(stream(t, []byte(in), sizes))
		for _, s := range []string{token, keyID, secret, pemLine} {
			if strings.Contains(out, s) {
				t.Fatalf("case %d: secret %q in output %q", n, s, out)
			}
		}
		if got := strings.Count(out, Replacement); got < 4 {
			t.Fatalf("case %d: %d replacements, want at least 4: %q", n, got, out)
		}
	}
}

func TestUnterminatedBlockStaysBoundedAndRedacted(t *testing.T) {
	r := New()
	var out []byte
	out = append(out, r.Write([]byte("start\n-----BEGIN RSA PRIVATE KEY-----\n"))...)
	line := []byte("MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n")
	for range 64 << 10 / len(line) * 16 { // about 1 MiB of key material
		out = append(out, r.Write(line)...)
		if r.Held() > MaxHeld {
			t.Fatalf("held %d bytes inside a block", r.Held())
		}
	}
	out = append(out, r.Flush()...)
	if got, want := string(out), "start\n[REDACTED]"; got != want {
		t.Errorf("output = %.200q, want %q", got, want)
	}
	// Flush ended the stream: the Redactor is ready for a new one.
	if got := string(append(r.Write([]byte("plain ")), r.Flush()...)); got != "plain " {
		t.Errorf("after Flush, output = %q, want %q", got, "plain ")
	}
}

func TestHeldIsBoundedForAdversarialInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		unit string
	}{
		{"blanks after bearer", "bearer" + strings.Repeat(" ", 40)},
		{"long label", "-----BEGIN " + strings.Repeat("A", 200)},
		{"many dashes", strings.Repeat("-", 300)},
		{"repeated prefixes", "AKIA-----BEGIN aws_secret_access_key"},
		{"token run", "Bearer " + strings.Repeat("x", 10000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(strings.Repeat(tc.unit, 50))
			want := Bytes(in)
			if got := stream(t, in, []int{1, 7, 64}); !bytes.Equal(got, want) {
				t.Errorf("chunked output differs from one-shot")
			}
		})
	}
}

func TestRedactedCounts(t *testing.T) {
	r := New()
	r.Write([]byte("Bearer " + testToken + " " + testKeyID + " "))
	r.Write([]byte(testPEM))
	r.Flush()
	if got := r.Redacted(); got != 3 {
		t.Errorf("Redacted() = %d, want 3", got)
	}
}

func FuzzRedactor(f *testing.F) {
	for _, s := range fragments {
		f.Add([]byte(s), uint8(3))
	}
	f.Add([]byte("x Bearer "+testToken+" "+testPEM), uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, size uint8) {
		want := Bytes(in)
		got := stream(t, in, []int{int(size%64) + 1, 1})
		if !bytes.Equal(got, want) {
			t.Fatalf("chunked output %q differs from one-shot %q", got, want)
		}
		// Output grows only by replacements.
		if len(want) > len(in)+len(Replacement)*(len(in)/minToken+1) {
			t.Fatalf("output %d bytes from %d input bytes", len(want), len(in))
		}
	})
}

func BenchmarkWrite(b *testing.B) {
	chunk := []byte(strings.Repeat(fmt.Sprintf("line of build output %d with - dashes and Bearer-ish words a b\n", 7), 4096))
	r := New()
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		r.Write(chunk)
	}
}
