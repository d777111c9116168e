package reactor

import (
	"errors"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/corral-dev/corral/api"
)

// fieldPrefix is how every invalid-params message of normalize starts: the
// field it names, then ": ".
var fieldPrefix = regexp.MustCompile(`^(argv|argv\[\d+\]|env|env\.[^\x00]*|cwd|timeout_ms|grace_ms|cpu_ms|memory_bytes|tasks_max|output_limit_bytes|labels|id|network|user): `)

var fuzzDefaults = api.Defaults{
	TimeoutMS: api.DefaultTimeoutMS, GraceMS: api.DefaultGraceMS,
	TasksMax: api.DefaultTasksMax, OutputLimitBytes: api.DefaultOutputLimitBytes,
}

// FuzzNormalize drives exec.start's param validation with arbitrary field
// values. It never fails on a rejection as such: it checks that nothing
// panics, that every rejection is -32602 naming a field, that what is
// accepted is within bounds, and that accepting is stable (normalizing
// accepted params again changes nothing).
func FuzzNormalize(f *testing.F) {
	f.Add("sh", "-c", uint16(2), "K", "v", "/tmp", int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), "tool_call", "abc", "", "", "")
	f.Add("", "", uint16(1), "", "", "", int64(-1), int64(-1), int64(-1), int64(-1), int64(-1), int64(-1), "", "", "", "bogus", "")
	f.Add("a", "b\x00", uint16(3), "A=B", "c", "rel/dir", int64(maxTimeoutMS+1), int64(1), int64(1), int64(1<<20-1), int64(1<<22+1), int64(maxOutputLimit+1), "k", "v", ".hidden", "none", "root")
	f.Add("a", "b", uint16(maxArgs+1), "K", "v\x00", "/", int64(1), int64(0), int64(maxTimeoutMS), int64(1<<50), int64(1), int64(1), "k k", "v", "-x", "host", "u\x00")
	f.Add("/bin/true", "", uint16(0), "PATH", "/x", "/a/../b", int64(5), int64(5), int64(5), int64(1<<20), int64(5), int64(5), strings.Repeat("k", 257), "v", strings.Repeat("i", 129), "none", "nobody")
	f.Fuzz(func(t *testing.T, argv0, arg string, nargs uint16, envK, envV, cwd string,
		timeout, grace, cpu, mem, tasks, output int64, labelK, labelV, id, network, user string) {
		n := int(nargs) % (maxArgs + 3)
		var argv []string
		if n > 0 {
			argv = make([]string, n)
			argv[0] = argv0
			for i := 1; i < n; i++ {
				argv[i] = arg
			}
		}
		p := api.StartParams{
			Argv: argv, Cwd: cwd, TimeoutMS: timeout, GraceMS: grace, CPUMS: cpu, MemoryBytes: mem,
			TasksMax: tasks, OutputLimitBytes: output, ID: id, Network: network, User: user,
		}
		if envK != "" || envV != "" {
			p.Env = map[string]string{envK: envV}
		}
		if labelK != "" || labelV != "" {
			p.Labels = map[string]string{labelK: labelV}
		}
		err := normalize(&p, fuzzDefaults)
		if err != nil {
			var ae *api.Error
			if !errors.As(err, &ae) {
				t.Fatalf("normalize rejected with %T %v, want *api.Error", err, err)
			}
			if ae.Code != api.CodeInvalidParams {
				t.Fatalf("normalize rejected with code %d (%q), want %d", ae.Code, ae.Message, api.CodeInvalidParams)
			}
			if !fieldPrefix.MatchString(ae.Message) {
				t.Fatalf("rejection message %q does not start with a field name", ae.Message)
			}
			return
		}
		checkAccepted(t, &p)
		again := p
		if err := normalize(&again, fuzzDefaults); err != nil || !reflect.DeepEqual(again, p) {
			t.Fatalf("normalizing accepted params again: err %v, changed %v", err, !reflect.DeepEqual(again, p))
		}
	})
}

// checkAccepted asserts the bounds normalize promises for accepted params.
func checkAccepted(t *testing.T, p *api.StartParams) {
	t.Helper()
	if len(p.Argv) == 0 || len(p.Argv) > maxArgs || p.Argv[0] == "" {
		t.Fatalf("accepted argv of %d elements, first %q", len(p.Argv), p.Argv[0])
	}
	for i, a := range p.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			t.Fatalf("accepted argv[%d] with NUL", i)
		}
	}
	if len(p.Env) > maxEnv {
		t.Fatalf("accepted %d env variables", len(p.Env))
	}
	for k, v := range p.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			t.Fatalf("accepted env %q=%q", k, v)
		}
	}
	if p.Cwd != "" && (!filepath.IsAbs(p.Cwd) || strings.IndexByte(p.Cwd, 0) >= 0) {
		t.Fatalf("accepted cwd %q", p.Cwd)
	}
	for _, f := range []struct {
		name     string
		v        int64
		min, max int64
	}{
		{"timeout_ms", p.TimeoutMS, 1, maxTimeoutMS},
		{"grace_ms", p.GraceMS, 1, maxTimeoutMS},
		{"cpu_ms", p.CPUMS, 0, maxTimeoutMS},
		{"memory_bytes", p.MemoryBytes, 0, 1 << 50},
		{"tasks_max", p.TasksMax, 1, 1 << 22},
		{"output_limit_bytes", p.OutputLimitBytes, 1, maxOutputLimit},
	} {
		if f.v < f.min || f.v > f.max {
			t.Fatalf("accepted %s = %d, want %d..%d", f.name, f.v, f.min, f.max)
		}
	}
	if p.MemoryBytes != 0 && p.MemoryBytes < 1<<20 {
		t.Fatalf("accepted memory_bytes %d below 1 MiB", p.MemoryBytes)
	}
	if len(p.Labels) > maxLabels {
		t.Fatalf("accepted %d labels", len(p.Labels))
	}
	for k, v := range p.Labels {
		if k == "" || len(k) > maxLabelLen || len(v) > maxLabelLen || !isLabelKey(k) {
			t.Fatalf("accepted label %q=%q", k, v)
		}
	}
	if p.ID != "" {
		if checkID(p.ID) != nil || strings.ContainsAny(p.ID, "/\x00") || p.ID == "." || p.ID == ".." {
			t.Fatalf("accepted id %q", p.ID)
		}
	}
	if p.Network != "host" && p.Network != "none" {
		t.Fatalf("accepted network %q", p.Network)
	}
	if strings.IndexByte(p.User, 0) >= 0 {
		t.Fatalf("accepted user with NUL")
	}
}

// FuzzParseSignal: exec.signal's signal field is a number in 1..64 or a
// known name; anything else is -32602 naming "signal".
func FuzzParseSignal(f *testing.F) {
	for _, s := range []string{"SIGTERM", "term", "kill", "9", "0", "65", "-1", "SIGRTMIN", "", "SIG", "sigsegv", "1e3", " 9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sig, err := parseSignal(s)
		if err != nil {
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeInvalidParams || !strings.HasPrefix(ae.Message, "signal: ") {
				t.Fatalf("parseSignal(%q) error %v, want -32602 naming signal", s, err)
			}
			return
		}
		if sig < 1 || sig > 64 {
			t.Fatalf("parseSignal(%q) = %d, out of 1..64", s, sig)
		}
	})
}
