package reactor

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
)

// Bounds on request fields, so one request cannot make the daemon allocate
// or wait without limit.
const (
	maxArgs        = 4096
	maxEnv         = 4096
	maxLabels      = 64
	maxLabelLen    = 256
	maxIDLen       = 128
	maxTimeoutMS   = int64(7 * 24 * time.Hour / time.Millisecond)
	maxOutputLimit = 64 << 20
	maxStdinBuffer = 8 << 20 // bytes queued for a child's stdin
	maxList        = 1000    // records exec.list returns at most
)

// normalize validates p and fills in defaults. Errors are -32602 naming the
// field.
func normalize(p *api.StartParams, d api.Defaults) error {
	bad := func(field, format string, args ...any) error {
		return api.Errorf(api.CodeInvalidParams, "%s: %s", field, fmt.Sprintf(format, args...))
	}
	if len(p.Argv) == 0 {
		return bad("argv", "required, at least the command")
	}
	if p.Traceparent != "" && !validTraceparent(p.Traceparent) {
		return bad("traceparent", "want a W3C traceparent, VERSION-TRACEID-PARENTID-FLAGS in lowercase hex")
	}
	if len(p.Argv) > maxArgs {
		return bad("argv", "more than %d arguments", maxArgs)
	}
	if p.Argv[0] == "" {
		return bad("argv[0]", "empty command")
	}
	for i, a := range p.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return bad(fmt.Sprintf("argv[%d]", i), "contains NUL")
		}
	}
	if len(p.Env) > maxEnv {
		return bad("env", "more than %d variables", maxEnv)
	}
	for k, v := range p.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return bad("env", "name %q must be non-empty without '=' or NUL", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return bad("env."+k, "value contains NUL")
		}
	}
	if p.Cwd != "" {
		if strings.IndexByte(p.Cwd, 0) >= 0 || !filepath.IsAbs(p.Cwd) {
			return bad("cwd", "must be an absolute path")
		}
	}
	for _, f := range []struct {
		name string
		v    *int64
		def  int64
		max  int64
	}{
		{"timeout_ms", &p.TimeoutMS, d.TimeoutMS, maxTimeoutMS},
		{"grace_ms", &p.GraceMS, d.GraceMS, maxTimeoutMS},
		{"cpu_ms", &p.CPUMS, 0, maxTimeoutMS},
		{"memory_bytes", &p.MemoryBytes, 0, 1 << 50},
		{"tasks_max", &p.TasksMax, d.TasksMax, 1 << 22},
		{"output_limit_bytes", &p.OutputLimitBytes, d.OutputLimitBytes, maxOutputLimit},
		{"idle_timeout_ms", &p.IdleTimeoutMS, 0, maxTimeoutMS},
	} {
		if *f.v < 0 {
			return bad(f.name, "must not be negative")
		}
		if *f.v > f.max {
			return bad(f.name, "at most %d", f.max)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if p.TTY {
		if p.TTYSize == nil {
			p.TTYSize = &api.TTYSize{Rows: api.DefaultTTYRows, Cols: api.DefaultTTYCols}
		}
		if err := checkTTYSize(*p.TTYSize, "tty_size"); err != nil {
			return err
		}
	} else if p.TTYSize != nil {
		return bad("tty_size", "only with tty: true")
	}
	if p.MemoryBytes != 0 && p.MemoryBytes < 1<<20 {
		return bad("memory_bytes", "at least 1 MiB")
	}
	if len(p.Labels) > maxLabels {
		return bad("labels", "more than %d labels", maxLabels)
	}
	for k, v := range p.Labels {
		if k == "" || len(k) > maxLabelLen || len(v) > maxLabelLen || !isLabelKey(k) {
			return bad("labels", "key %q: 1-%d characters of [A-Za-z0-9_.-], values up to %d bytes", k, maxLabelLen, maxLabelLen)
		}
	}
	if p.ID != "" {
		if err := checkID(p.ID); err != nil {
			return bad("id", "%v", err)
		}
	}
	switch p.Network {
	case "":
		p.Network = "host"
	case "host", "none":
	default:
		return bad("network", "must be \"host\" or \"none\"")
	}
	if strings.IndexByte(p.User, 0) >= 0 {
		return bad("user", "contains NUL")
	}
	return nil
}

func isLabelKey(k string) bool {
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// checkID accepts ids that are safe as a unit name, a directory name and a
// journal field value: 1-128 of [A-Za-z0-9_.-], not starting with '.' or '-'.
func checkID(id string) error {
	if len(id) == 0 || len(id) > maxIDLen {
		return fmt.Errorf("1 to %d characters", maxIDLen)
	}
	if id[0] == '.' || id[0] == '-' {
		return fmt.Errorf("must not start with '.' or '-'")
	}
	if !isLabelKey(id) {
		return fmt.Errorf("only [A-Za-z0-9_.-]")
	}
	return nil
}

// newID returns a UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then
// random bits, so ids sort by creation time.
func newID(now time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	ms := uint64(now.UnixMilli())
	binary.BigEndian.PutUint16(b[0:2], uint16(ms>>32))
	binary.BigEndian.PutUint32(b[2:6], uint32(ms))
	b[6] = (b[6] & 0x0f) | 0x70 // version 7
	b[8] = (b[8] & 0x3f) | 0x80 // variant 10
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// parseSignal accepts "SIGTERM", "TERM", "term" or a number.
func parseSignal(s string) (unix.Signal, error) {
	if s == "" {
		return 0, api.Errorf(api.CodeInvalidParams, "signal: required")
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, api.Errorf(api.CodeInvalidParams, "signal: %d out of range", n)
		}
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return 0, api.Errorf(api.CodeInvalidParams, "signal: unknown signal %q", s)
	}
	return sig, nil
}

func signalName(sig unix.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return fmt.Sprintf("SIG%d", int(sig))
}

// traceparentRE is a W3C Trace Context traceparent: version 00 has exactly
// these four fields; a later version may add fields after a dash.
var traceparentRE = regexp.MustCompile(`^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-[\x21-\x7e]*)?$`)

// validTraceparent checks a traceparent as the W3C spec's parser does:
// version ff, an all-zero trace or parent id, and extra fields in
// version 00 are invalid.
func validTraceparent(s string) bool {
	m := traceparentRE.FindStringSubmatch(s)
	if m == nil || len(s) > 256 || m[1] == "ff" || (m[1] == "00" && m[4] != "") {
		return false
	}
	return strings.Trim(m[2], "0") != "" && strings.Trim(m[3], "0") != ""
}
