// Package redact replaces secrets in a command's output with "[REDACTED]"
// before anyone can read it: bearer tokens, AWS access key ids, AWS secret
// access keys written as "aws_secret_access_key = ...", and PEM private-key
// blocks. It works on a stream cut into arbitrary chunks (pipe reads): a
// Redactor holds back only the few bytes that might be the start of a secret,
// and its output does not depend on where the chunks were cut.
//
// What is recognised (ASCII, byte-wise):
//
//	bearer token     "bearer" (any case), 1-16 spaces or tabs, then 8 or more
//	                 of [A-Za-z0-9._~+/=-]. "Bearer " is kept, the token goes.
//	access key id    (AKIA|ASIA) followed by 16 or more of [A-Z0-9].
//	secret key       "aws_secret_access_key" (any case), an optional quote,
//	                 blanks, '=' or ':', blanks, an optional quote, then 1 or
//	                 more of [A-Za-z0-9/+=]. Everything up to the value is kept.
//	PEM private key  "-----BEGIN <label>-----" through "-----END <label>-----"
//	                 where the label is 1-64 of [A-Z ] containing "PRIVATE KEY"
//	                 (RSA, EC, OPENSSH, ENCRYPTED, PGP ... BLOCK). The whole
//	                 block becomes one "[REDACTED]". A block with no END line
//	                 is redacted to the end of the stream: key material is
//	                 never released.
//
// This is a best-effort filter for the secrets that tools commonly print, not
// a guarantee: a secret in another format, split by a program across
// unrelated writes with other bytes between, or encoded, passes through.
package redact

import "bytes"

// Replacement is what a secret is replaced with.
const Replacement = "[REDACTED]"

// MaxHeld bounds the bytes a Redactor holds back between calls: the longest
// prefix of a pattern that must be seen whole before it can be decided.
const MaxHeld = 128

const (
	maxBlanks   = 16 // spaces or tabs allowed around separators
	maxPEMLabel = 64 // bytes of a PEM label ("RSA PRIVATE KEY")
	minToken    = 8  // bearer token characters needed for a match
)

// charset is a byte class.
type charset [256]bool

func newCharset(ranges ...string) *charset {
	var c charset
	for _, r := range ranges {
		if len(r) == 3 && r[1] == '-' {
			for b := int(r[0]); b <= int(r[2]); b++ {
				c[b] = true
			}
			continue
		}
		for i := 0; i < len(r); i++ {
			c[r[i]] = true
		}
	}
	return &c
}

var (
	tokenChars  = newCharset("A-Z", "a-z", "0-9", "._~+/=-")
	keyIDChars  = newCharset("A-Z", "0-9")
	secretChars = newCharset("A-Z", "a-z", "0-9", "/+=")
	labelChars  = newCharset("A-Z", " ")
	// triggers are the first bytes of every pattern.
	triggers = newCharset("bBaA-")
)

// mode is what the Redactor is in the middle of.
type mode uint8

const (
	modeScan mode = iota // plain output: looking for the start of a secret
	modeSkip             // dropping the rest of a redacted run of r.skip bytes
	modePEM              // inside a private-key block: dropping to its END line
)

// Redactor redacts one output stream. It is not safe for concurrent use: one
// goroutine (the reactor's loop, for a child's stdout or stderr) owns it and
// calls Write for every chunk in stream order, then Flush once at EOF.
type Redactor struct {
	held []byte   // undecided bytes: a possible start of a secret
	mode mode     // modeScan, modeSkip or modePEM
	skip *charset // the run modeSkip drops
	hits int      // secrets replaced so far
}

// New returns a Redactor at the start of a stream.
func New() *Redactor { return &Redactor{} }

// Write takes the next chunk of the stream and returns the bytes that are
// now safe to release, in a new slice the caller may keep (possibly empty).
// Bytes that might be the start of a secret are held back (at most MaxHeld)
// until later input decides them.
func (r *Redactor) Write(p []byte) []byte {
	buf := p
	if len(r.held) > 0 {
		buf = append(r.held, p...)
	}
	out, rest := r.process(buf, false)
	// rest may alias p, which the caller reuses: copy it.
	r.held = append(r.held[:0], rest...)
	return out
}

// Flush ends the stream: the held bytes are decided as they stand and
// released, and the Redactor is ready for a new stream. An unterminated
// private-key block stays redacted.
func (r *Redactor) Flush() []byte {
	out, _ := r.process(r.held, true)
	r.held = r.held[:0]
	r.mode, r.skip = modeScan, nil
	return out
}

// Held reports how many bytes are held back (never more than MaxHeld).
func (r *Redactor) Held() int { return len(r.held) }

// Redacted reports how many secrets were replaced so far.
func (r *Redactor) Redacted() int { return r.hits }

// Bytes redacts a whole stream at once.
func Bytes(b []byte) []byte {
	r := New()
	out := r.Write(b)
	return append(out, r.Flush()...)
}

// verdict is what a pattern says about the bytes at one position.
type verdict uint8

const (
	noMatch  verdict = iota
	needMore         // the bytes so far are a prefix of a match
	match
)

// hit describes a match: keep bytes of the input stay, then the Replacement,
// and n bytes are consumed in all; next is the mode to continue in.
type hit struct {
	keep, n int
	next    mode
	skip    *charset
}

// process redacts buf. It returns what may be released and the undecided
// tail of buf (nil when final).
func (r *Redactor) process(buf []byte, final bool) (out, rest []byte) {
	out = make([]byte, 0, len(buf)+len(Replacement))
	i := 0
	for i < len(buf) {
		switch r.mode {
		case modeSkip:
			for i < len(buf) && r.skip[buf[i]] {
				i++
			}
			if i < len(buf) {
				r.mode, r.skip = modeScan, nil
			}
		case modePEM:
			j := bytes.IndexByte(buf[i:], '-')
			if j < 0 {
				i = len(buf)
				continue
			}
			i += j
			v, n := pemMarker(buf[i:], "-----END ", final)
			switch v {
			case needMore:
				return out, buf[i:]
			case match:
				i += n
				r.mode = modeScan
			default:
				i++
			}
		default:
			j := i
			for j < len(buf) && !triggers[buf[j]] {
				j++
			}
			out = append(out, buf[i:j]...)
			i = j
			if i == len(buf) {
				break
			}
			v, h := matchAt(buf[i:], final)
			switch v {
			case needMore:
				return out, buf[i:]
			case match:
				out = append(out, buf[i:i+h.keep]...)
				out = append(out, Replacement...)
				i += h.n
				r.mode, r.skip = h.next, h.skip
				r.hits++
			default:
				out = append(out, buf[i])
				i++
			}
		}
	}
	return out, nil
}

// matchAt tries every pattern at the start of b. Each answers needMore only
// while more input could change its answer, so the result never depends on
// where the stream was cut. final means no more input will come.
func matchAt(b []byte, final bool) (verdict, hit) {
	var v verdict
	var h hit
	switch b[0] {
	case 'b', 'B':
		v, h = bearer(b)
	case 'A':
		if v, h = accessKeyID(b); v == noMatch {
			v, h = secretKey(b)
		}
	case 'a':
		v, h = secretKey(b)
	case '-':
		var n int
		v, n = pemMarker(b, "-----BEGIN ", final)
		h = hit{n: n, next: modePEM}
	}
	if v == needMore && final {
		return noMatch, hit{}
	}
	return v, h
}

// literal matches lit at the start of b, ASCII case-insensitively when fold.
func literal(b []byte, lit string, fold bool) verdict {
	n := min(len(b), len(lit))
	for i := 0; i < n; i++ {
		c := b[i]
		if fold && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lit[i] {
			return noMatch
		}
	}
	if n < len(lit) {
		return needMore
	}
	return match
}

// blanks counts spaces and tabs at the start of b, up to maxBlanks+1.
// more is true when b ended inside the run.
func blanks(b []byte) (n int, more bool) {
	for n < len(b) && n <= maxBlanks && (b[n] == ' ' || b[n] == '\t') {
		n++
	}
	return n, n == len(b) && n <= maxBlanks
}

// run counts bytes of cs at the start of b, up to want. more is true when b
// ended before want bytes could be counted.
func run(b []byte, cs *charset, want int) (n int, more bool) {
	for n < len(b) && n < want && cs[b[n]] {
		n++
	}
	return n, n == len(b) && n < want
}

// bearer: "bearer", 1-16 blanks, at least minToken token characters.
func bearer(b []byte) (verdict, hit) {
	if v := literal(b, "bearer", true); v != match {
		return v, hit{}
	}
	i := len("bearer")
	n, more := blanks(b[i:])
	if more {
		return needMore, hit{}
	}
	if n == 0 || n > maxBlanks {
		return noMatch, hit{}
	}
	i += n
	t, more := run(b[i:], tokenChars, minToken)
	if more {
		return needMore, hit{}
	}
	if t < minToken {
		return noMatch, hit{}
	}
	return match, hit{keep: i, n: i + t, next: modeSkip, skip: tokenChars}
}

// accessKeyID: AKIA or ASIA, then 16 of [A-Z0-9]; the rest of the run is
// dropped too.
func accessKeyID(b []byte) (verdict, hit) {
	v := upperLiteral(b, "AKIA")
	if v == noMatch {
		v = upperLiteral(b, "ASIA")
	}
	if v != match {
		return v, hit{}
	}
	t, more := run(b[4:], keyIDChars, 16)
	if more {
		return needMore, hit{}
	}
	if t < 16 {
		return noMatch, hit{}
	}
	return match, hit{keep: 0, n: 4 + t, next: modeSkip, skip: keyIDChars}
}

// upperLiteral matches lit exactly (case-sensitive) at the start of b.
func upperLiteral(b []byte, lit string) verdict {
	n := min(len(b), len(lit))
	if !bytes.Equal(b[:n], []byte(lit[:n])) {
		return noMatch
	}
	if n < len(lit) {
		return needMore
	}
	return match
}

// secretKey: aws_secret_access_key (any case), an optional closing quote,
// blanks, '=' or ':', blanks, an optional opening quote, then the value.
func secretKey(b []byte) (verdict, hit) {
	const key = "aws_secret_access_key"
	if v := literal(b, key, true); v != match {
		return v, hit{}
	}
	i := len(key)
	if i == len(b) {
		return needMore, hit{}
	}
	if b[i] == '"' || b[i] == '\'' {
		i++
	}
	var v verdict
	if i, v = skipBlanks(b, i); v != match {
		return v, hit{}
	}
	if b[i] != '=' && b[i] != ':' {
		return noMatch, hit{}
	}
	if i, v = skipBlanks(b, i+1); v != match {
		return v, hit{}
	}
	if b[i] == '"' || b[i] == '\'' {
		i++
		if i == len(b) {
			return needMore, hit{}
		}
	}
	if !secretChars[b[i]] {
		return noMatch, hit{}
	}
	return match, hit{keep: i, n: i + 1, next: modeSkip, skip: secretChars}
}

// skipBlanks steps over at most maxBlanks blanks from b[i]. On match it
// returns the index of the next byte, which exists; needMore when b ends
// first; noMatch when there are too many blanks.
func skipBlanks(b []byte, i int) (int, verdict) {
	n, more := blanks(b[i:])
	switch {
	case more:
		return i, needMore
	case n > maxBlanks:
		return i, noMatch
	case i+n == len(b):
		return i, needMore
	}
	return i + n, match
}

// pemMarker matches prefix ("-----BEGIN " or "-----END "), a label of 1 to
// maxPEMLabel [A-Z ] bytes containing "PRIVATE KEY", and "-----". It returns
// the marker's length on a match.
func pemMarker(b []byte, prefix string, final bool) (verdict, int) {
	v := upperLiteral(b, prefix)
	if v == needMore && final {
		return noMatch, 0
	}
	if v != match {
		return v, 0
	}
	i := len(prefix)
	n, more := run(b[i:], labelChars, maxPEMLabel+1)
	if more {
		if final {
			return noMatch, 0
		}
		return needMore, 0
	}
	if n == 0 || n > maxPEMLabel || !bytes.Contains(b[i:i+n], []byte("PRIVATE KEY")) {
		return noMatch, 0
	}
	i += n
	switch upperLiteral(b[i:], "-----") {
	case match:
		return match, i + 5
	case needMore:
		if final {
			return noMatch, 0
		}
		return needMore, 0
	}
	return noMatch, 0
}
