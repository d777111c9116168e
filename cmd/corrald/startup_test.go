package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/store"

	"github.com/corral-dev/corral/tests/testenv"
)

// mainEnv makes the test binary run corrald's main instead of the tests,
// so that a test can start corrald as a process of its own without
// building it.
const mainEnv = "CORRALD_TEST_RUN_MAIN"

func init() {
	if os.Getenv(mainEnv) == "1" {
		os.Args = append([]string{"corrald"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
}

// startCorrald runs corrald with args (and JSON logs) until it exits,
// which must happen within 30s, and returns its exit status and the log
// lines it wrote.
func startCorrald(t *testing.T, args ...string) (int, []map[string]any) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"--log-format", "json", "--config", "/dev/null"}, args...)...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	var lines []map[string]any
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("corrald wrote a line that is not JSON: %q", sc.Text())
			continue
		}
		lines = append(lines, m)
	}
	err = cmd.Wait()
	if cmd.ProcessState == nil {
		t.Fatalf("corrald: %v", err)
	}
	return cmd.ProcessState.ExitCode(), lines
}

// doubledWrap returns why msg repeats its context ("open store: open
// store: ...", "listen /x: listen unix /x: ..."), or "".
func doubledWrap(msg string) string {
	parts := strings.Split(msg, ": ")
	for i := 1; i < len(parts); i++ {
		if parts[i] == parts[i-1] {
			return fmt.Sprintf("%q twice in a row", parts[i])
		}
	}
	seen := map[string]bool{}
	for _, w := range strings.FieldsFunc(msg, func(r rune) bool { return r == ' ' || r == ':' || r == '"' }) {
		if strings.Contains(w, "/") {
			if seen[w] {
				return fmt.Sprintf("path %s twice", w)
			}
			seen[w] = true
		}
	}
	return ""
}

// TestStartupErrors walks the ways start-up fails: corrald exits 1, and
// its last log line (the journal's MESSAGE under systemd) says
// "corrald failed: " and why, with each piece of context said once.
func TestStartupErrors(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "corrald's start-up needs root (no_new_privs aside, the state and socket directories)")
	}
	tmp := t.TempDir()
	file := filepath.Join(tmp, "a-file")
	os.WriteFile(file, nil, 0o600)
	// The store's lock, held by this process: a second "corrald" on the
	// same state directory must stop at once, naming this pid.
	locked := filepath.Join(tmp, "locked")
	st, err := store.OpenOptions(locked, zerolog.Nop(), store.Options{Synchronous: store.SyncNormal})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	live := filepath.Join(tmp, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	for _, tc := range []struct {
		name string
		args []string
		want string // the whole reason, after "corrald failed: "
	}{
		{"shim missing", []string{"--shim", "/nonexistent/corral-shim"},
			"--shim /nonexistent/corral-shim: no such file or directory"},
		{"shim relative", []string{"--shim", "corral-shim"}, "--shim corral-shim: not an absolute path"},
		{"state dir under a file", []string{"--state-dir", file + "/state"},
			"state directory: mkdir " + file + ": not a directory"},
		{"store sync", []string{"--state-dir", tmp + "/s1", "--store-sync", "always"}, `--store-sync "always": want normal or full`},
		{"store kind", []string{"--state-dir", tmp + "/s2", "--store", "redis"}, `--store "redis": want sqlite or memory`},
		{"store in use", []string{"--state-dir", locked},
			fmt.Sprintf("open store: state directory %s is in use by pid %d", locked, os.Getpid())},
		{"scope", []string{"--state-dir", tmp + "/s3", "--scope", "jail"}, `--scope "jail": want auto, systemd, cgroup or pgroup`},
		{"cgroup base", []string{"--state-dir", tmp + "/s4", "--scope", "cgroup", "--cgroup-base", "rel"}, "cgroup backend: "},
		{"socket dir", []string{"--state-dir", tmp + "/s5", "--scope", "pgroup", "--socket", file + "/corrald.sock"},
			"socket directory: mkdir " + file + ": not a directory"},
		{"socket is a file", []string{"--state-dir", tmp + "/s6", "--scope", "pgroup", "--socket", file},
			"socket " + file + ": exists and is not a socket"},
		{"socket in use", []string{"--state-dir", tmp + "/s7", "--scope", "pgroup", "--socket", live},
			"socket " + live + ": another corrald is listening"},
		{"metrics address", []string{"--state-dir", tmp + "/s8", "--scope", "pgroup", "--socket", tmp + "/s8.sock", "--metrics-listen", "0.0.0.0:9464"},
			`--metrics-listen 0.0.0.0:9464: "0.0.0.0" is not a loopback address (use 127.0.0.1, [::1] or unix:PATH)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, lines := startCorrald(t, tc.args...)
			if code != 1 || len(lines) == 0 {
				t.Fatalf("corrald %q = exit %d with %d log lines, want exit 1 and a log", tc.args, code, len(lines))
			}
			last := lines[len(lines)-1]
			msg, _ := last["message"].(string)
			reason, ok := strings.CutPrefix(msg, "corrald failed: ")
			if last["level"] != "error" || !ok {
				t.Fatalf("last log line = %v, want level error and message \"corrald failed: ...\"", last)
			}
			if !strings.HasPrefix(reason, tc.want) || (!strings.HasSuffix(tc.want, ": ") && reason != tc.want) {
				t.Errorf("reason = %q, want %q", reason, tc.want)
			}
			if last["error"] != reason {
				t.Errorf("error field = %q, want the message's reason %q", last["error"], reason)
			}
			if why := doubledWrap(reason); why != "" {
				t.Errorf("reason %q: %s", reason, why)
			}
		})
	}
}

// TestDoubledWrap: the check above catches what it is meant to.
func TestDoubledWrap(t *testing.T) {
	for _, tt := range []struct {
		msg    string
		double bool
	}{
		{"open store: open store: state directory /var/lib/corral is in use by pid 4934", true},
		{"listen /run/x.sock: listen unix /run/x.sock: bind: permission denied", true},
		{"open store: state directory /var/lib/corral is in use by pid 4934", false},
		{"listen unix /run/x.sock: bind: permission denied", false},
	} {
		if got := doubledWrap(tt.msg) != ""; got != tt.double {
			t.Errorf("doubledWrap(%q) = %q, want doubled %t", tt.msg, doubledWrap(tt.msg), tt.double)
		}
	}
}
