package main

import (
	"errors"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/tests/testenv"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"0", 0, false},
		{"4096", 4096, false},
		{"1K", 1024, false},
		{"100k", 102400, false},
		{"512M", 512 << 20, false},
		{"512MB", 512 << 20, false},
		{"1GiB", 1 << 30, false},
		{"2g", 2 << 30, false},
		{"1T", 1 << 40, false},
		{"10B", 10, false},
		{"", 0, true},
		{"M", 0, true},
		{"-1M", 0, true},
		{"1.5G", 0, true},
		{"12X", 0, true},
		{"99999999999G", 0, true},
	}
	for _, tt := range tests {
		got, err := parseSize(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d, error %t", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"30s", 30 * time.Second, false},
		{"1m30s", 90 * time.Second, false},
		{"500ms", 500 * time.Millisecond, false},
		{"10", 10 * time.Second, false},
		{"1.5", 1500 * time.Millisecond, false},
		{"0", 0, false},
		{"-1s", 0, true},
		{"-3", 0, true},
		{"soon", 0, true},
		{"NaN", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		got, err := parseDuration(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v, error %t", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
	if got := millis(300 * time.Microsecond); got != 1 {
		t.Errorf("millis(300µs) = %d, want 1 (not 0, which means default)", got)
	}
}

func TestParseRun(t *testing.T) {
	orig := osLookup
	t.Cleanup(func() { osLookup = orig })
	osLookup = func(k string) (string, bool) {
		switch k {
		case "HOME":
			return "/home/me", true
		case "TERM":
			return "xterm-256color", true
		}
		return "", false
	}

	tests := []struct {
		name    string
		args    []string
		want    api.StartParams
		wantErr string
	}{
		{
			name: "all flags",
			args: []string{"--timeout", "5s", "--grace", "1s", "--cpu", "15s", "--memory", "512M",
				"--tasks", "10", "--env", "A=1", "--env", "B=x=y", "--env", "HOME", "--cwd", "/tmp",
				"--label", "tool_call=abc", "--network", "none", "--id", "key1", "--output-limit", "1K",
				"--user", "nobody", "--redact", "-i", "--", "python3", "-c", "print(1)"},
			want: api.StartParams{
				Argv: []string{"python3", "-c", "print(1)"}, TimeoutMS: 5000, GraceMS: 1000, CPUMS: 15000,
				MemoryBytes: 512 << 20, TasksMax: 10, Env: map[string]string{"A": "1", "B": "x=y", "HOME": "/home/me"},
				Cwd: "/tmp", Labels: map[string]string{"tool_call": "abc"}, Network: "none", ID: "key1",
				OutputLimitBytes: 1024, User: "nobody", Redact: true, StdinOpen: true,
			},
		},
		{
			name: "command flags are the command's",
			args: []string{"--timeout", "2s", "ls", "-l", "--timeout", "9"},
			want: api.StartParams{Argv: []string{"ls", "-l", "--timeout", "9"}, TimeoutMS: 2000},
		},
		{
			name: "defaults are zero (daemon defaults)",
			args: []string{"--", "true"},
			want: api.StartParams{Argv: []string{"true"}},
		},
		{
			name: "-it: a terminal with our TERM, stdin forwarded, idle limit",
			args: []string{"-it", "--idle-timeout", "1m", "--", "sh"},
			want: api.StartParams{Argv: []string{"sh"}, TTY: true, StdinOpen: true, IdleTimeoutMS: 60000,
				Env: map[string]string{"TERM": "xterm-256color"}},
		},
		{
			name: "--tty keeps a TERM given with --env",
			args: []string{"--tty", "--env", "TERM=dumb", "sh"},
			want: api.StartParams{Argv: []string{"sh"}, TTY: true, Env: map[string]string{"TERM": "dumb"}},
		},
		{name: "bad idle timeout", args: []string{"--idle-timeout", "soon", "true"}, wantErr: "invalid duration"},
		{name: "no command", args: []string{"--timeout", "1s"}, wantErr: "no command"},
		{name: "bad network", args: []string{"--network", "bridge", "true"}, wantErr: "--network"},
		{name: "negative tasks", args: []string{"--tasks", "-3", "true"}, wantErr: `invalid argument "-3" for "--tasks" flag: negative`},
		{name: "bad size", args: []string{"--memory", "lots", "true"}, wantErr: "invalid size"},
		{name: "bad duration", args: []string{"--timeout", "-5s", "true"}, wantErr: "negative"},
		{name: "bad env", args: []string{"--env", "=x", "true"}, wantErr: "KEY=VALUE"},
		{name: "unset env", args: []string{"--env", "NOPE_NOT_SET", "true"}, wantErr: "not set"},
		{name: "bad label", args: []string{"--label", "novalue", "true"}, wantErr: "KEY=VALUE"},
		{name: "non-UTF-8 argument", args: []string{"--", "printf", "%s", "a\xffb"}, wantErr: `argument 2 "a\xffb" is not valid UTF-8`},
		{name: "non-UTF-8 env", args: []string{"--env", "K=\xfe", "true"}, wantErr: `--env "K" is not valid UTF-8`},
		{name: "non-UTF-8 cwd", args: []string{"--cwd", "/tmp/\xff", "true"}, wantErr: `--cwd "/tmp/\xff" is not valid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o, argv, err := parseRun(fs, tt.args)
			var p api.StartParams
			if err == nil {
				p, err = o.startParams(argv)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, tt.want) {
				t.Errorf("params = %+v\nwant      %+v", p, tt.want)
			}
		})
	}
}

// TestParseArgsInterspersed: a command's flags may come before, between and
// after its arguments, and "--" ends them.
func TestParseArgsInterspersed(t *testing.T) {
	tests := []struct {
		args     []string
		wantPos  []string
		wantJSON bool
		wantF    bool
	}{
		{[]string{"ID", "--json"}, []string{"ID"}, true, false},
		{[]string{"--json", "ID"}, []string{"ID"}, true, false},
		{[]string{"-f", "ID", "SIG", "--json"}, []string{"ID", "SIG"}, true, true},
		{[]string{"--", "-ID"}, []string{"-ID"}, false, false},
		{[]string{"ID", "--", "--json"}, []string{"ID", "--json"}, false, false},
		{[]string{"-f", "--json=true", "ID", "SIG"}, []string{"ID", "SIG"}, true, true},
	}
	for _, tt := range tests {
		e := &env{stdout: io.Discard, stderr: io.Discard}
		g := &globalFlags{}
		fs := newFlagSet(e, g, "logs")
		f := fs.BoolP("follow", "f", false, "")
		pos, code, ok := parseArgs(e, fs, tt.args, len(tt.wantPos), exitUsage)
		if !ok || !reflect.DeepEqual(pos, tt.wantPos) || g.json != tt.wantJSON || *f != tt.wantF {
			t.Errorf("parseArgs(%q) = %q, %d, %t (json %t, f %t); want %q (json %t, f %t)",
				tt.args, pos, code, ok, g.json, *f, tt.wantPos, tt.wantJSON, tt.wantF)
		}
	}
}

func TestSocketPath(t *testing.T) {
	tests := []struct {
		flag, env, want string
	}{
		{"", "", "/run/corral/corrald.sock"},
		{"", "/tmp/env.sock", "/tmp/env.sock"},
		{"/tmp/flag.sock", "/tmp/env.sock", "/tmp/flag.sock"},
	}
	for _, tt := range tests {
		g := &globalFlags{socket: tt.flag}
		e := &env{getenv: func(k string) string {
			if k == "CORRAL_SOCKET" {
				return tt.env
			}
			return ""
		}}
		if got := g.socketPath(e); got != tt.want {
			t.Errorf("socketPath(flag %q, env %q) = %q, want %q", tt.flag, tt.env, got, tt.want)
		}
	}
}

// TestPermissionDeniedSaysWhatToDo: a connect refused for want of permission
// (a user outside the socket's group) names the socket's group and how to
// join it, not only "permission denied".
func TestPermissionDeniedSaysWhatToDo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corrald.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	grp, err := user.LookupGroupId(strconv.Itoa(os.Getgid()))
	if err != nil {
		testenv.Skipf(t, "no name for gid %d: %v", os.Getgid(), err)
	}
	denied := &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.EACCES)}
	got := withSocketHint(denied, path).Error()
	if !strings.Contains(got, "permission denied") || !strings.Contains(got, "group "+grp.Name) || !strings.Contains(got, "usermod -aG "+grp.Name) {
		t.Errorf("permission denied error = %q, want it to name group %s and how to join it", got, grp.Name)
	}
	other := errors.New("dial unix: i/o timeout")
	if got := withSocketHint(other, path); got != other {
		t.Errorf("another error = %v, want it unchanged", got)
	}
}
