package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/tests/testenv"
)

// boot boots a harness systemd for one test and closes it at cleanup.
func boot(t *testing.T, opts Options) *Systemd {
	t.Helper()
	SkipUnlessBootable(t)
	start := time.Now()
	sd, err := Boot(opts)
	if err != nil {
		t.Fatalf("Boot: %v", err)
	}
	t.Logf("booted systemd pid %d in %v (%s)", sd.PID(), time.Since(start), sd.BootState())
	t.Cleanup(func() {
		if err := sd.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return sd
}

// run runs argv inside sd (raw: outside any scope) and returns its output.
func run(t *testing.T, sd *Systemd, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := sd.RawCommand(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func randomWord(t *testing.T) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func TestBootRunsOnlyOurUnits(t *testing.T) {
	sd := boot(t, Options{
		Units: map[string]string{"hello.service": "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n"},
		Start: []string{"hello.service"},
	})
	if got := run(t, sd, "systemctl", "is-system-running"); got != "running" {
		t.Errorf("is-system-running = %q, want running; failed: %s", got, run(t, sd, "systemctl", "--failed", "--no-legend"))
	}
	if got := run(t, sd, "systemctl", "is-active", "hello.service", "systemd-journald.service", "dbus.service"); got != "active\nactive\nactive" {
		t.Errorf("is-active hello journald dbus = %q, want all active", got)
	}
	// The lookup path must be ours alone (never the host's units).
	paths := strings.TrimPrefix(run(t, sd, "systemctl", "show", "-p", "UnitPath", "--value"), "")
	for _, p := range strings.Fields(paths) {
		if strings.HasPrefix(p, "/lib/systemd") || strings.HasPrefix(p, "/usr/lib/systemd") || strings.HasPrefix(p, "/etc/systemd") {
			t.Errorf("UnitPath contains host unit dir %s (all: %s)", p, paths)
		}
	}
	if got := run(t, sd, "systemctl", "show", "-p", "Virtualization", "--value"); got == "" {
		t.Errorf("Virtualization is empty, want a container type")
	}
	if got := run(t, sd, "cat", "/proc/1/comm"); got != "systemd" {
		t.Errorf("/proc/1/comm inside = %q, want systemd", got)
	}
}

func TestTransientUnitsAndScopes(t *testing.T) {
	sd := boot(t, Options{})
	unit := "harness-" + randomWord(t)[:6]
	run(t, sd, "systemd-run", "--wait", "--quiet", "--unit", unit, "true")
	if got := run(t, sd, "systemctl", "show", "-p", "Result", "--value", unit+".service"); got != "success" {
		t.Errorf("Result of %s = %q, want success", unit, got)
	}
	run(t, sd, "systemd-run", "--scope", "--quiet", "sleep", "0")

	// Command runs the program in a scope of its own, in every hierarchy
	// systemd manages (name=systemd on hybrid/legacy, 0:: on pure v2).
	out, err := sd.Command(context.Background(), "cat", "/proc/self/cgroup").CombinedOutput()
	if err != nil {
		t.Fatalf("Command cat /proc/self/cgroup: %v\n%s", err, out)
	}
	// Hierarchies systemd always manages, if the harness mounts them.
	managed := map[string]bool{}
	for _, h := range sd.cgroups {
		if h.v2 {
			managed[""] = true
		} else if strings.Contains(","+h.opts+",", ",name=systemd,") {
			managed["name=systemd"] = true
		}
	}
	if len(managed) == 0 {
		t.Fatalf("harness mounts neither cgroup2 nor name=systemd: %+v", sd.cgroups)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			t.Fatalf("bad /proc/self/cgroup line %q", line)
		}
		if strings.HasPrefix(parts[2], "/..") && (managed[parts[1]] || mounted(sd, parts[1])) {
			t.Errorf("cgroup line %q is outside the harness cgroup namespace", line)
		}
		if managed[parts[1]] && !strings.HasSuffix(parts[2], ".scope") {
			t.Errorf("cgroup line %q: want a transient scope", line)
		}
	}
}

func TestJournal(t *testing.T) {
	sd := boot(t, Options{})
	word := randomWord(t)
	run(t, sd, "systemd-cat", "-t", "harness-test", "echo", "hello "+word)
	// Delivery to journald is asynchronous; --sync waits for it to write.
	deadline := time.Now().Add(5 * time.Second)
	for {
		run(t, sd, "journalctl", "--sync")
		got := run(t, sd, "journalctl", "-t", "harness-test", "-o", "cat", "--no-pager")
		if strings.Contains(got, "hello "+word) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("journalctl -t harness-test = %q, want it to contain %q", got, "hello "+word)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The host's kernel log must not leak into the harness journal.
	if got := run(t, sd, "journalctl", "-k", "--no-pager", "-q"); strings.Contains(got, "Linux version") {
		t.Errorf("journalctl -k shows the host kernel log:\n%.300s", got)
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	SkipUnlessBootable(t)
	// A first boot warms up what the runtime opens once (the poller's
	// epoll fd); after that a Boot/Close cycle must not change the count.
	warm, err := Boot(Options{})
	if err != nil {
		t.Fatalf("Boot: %v", err)
	}
	if err := warm.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	before := testenv.Measure()

	sd, err := Boot(Options{})
	if err != nil {
		t.Fatalf("Boot: %v", err)
	}
	// Something long-running inside, in its own scope, to be torn down.
	run(t, sd, "systemd-run", "--quiet", "--unit", "sleeper", "sleep", "1000")
	pid := sd.PID()
	var dirs []string
	for _, h := range sd.cgroups {
		dirs = append(dirs, h.child)
	}
	dir := sd.dir
	if err := sd.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := sd.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		t.Errorf("kill(%d, 0) after Close = %v, want ESRCH\n%s", pid, err, st)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s after Close: stat = %v, want not exist", d, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("harness dir %s after Close: stat = %v, want not exist", dir, err)
	}
	// The goroutines that waited for init and read the console may still be
	// returning when Close does: give them a moment.
	if err := before.Check(5 * time.Second); err != nil {
		t.Errorf("5s after Boot+Close: %v", err)
	}
	if leftover := processesIn(t, dir); len(leftover) > 0 {
		t.Errorf("processes still mentioning %s: %v", dir, leftover)
	}
}

// processesIn lists pids whose command line mentions s.
func processesIn(t *testing.T, s string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if strings.Contains(string(cmdline), s) {
			out = append(out, fmt.Sprintf("%s %q", e.Name(), cmdline))
		}
	}
	return out
}

func TestInsidePath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/tmp/go-build1/b001/x.test", InsideHostTmp + "/go-build1/b001/x.test"},
		{"/tmp", InsideHostTmp},
		{"/tmpfoo/x", "/tmpfoo/x"},
		{"/var/tmp/a", InsideHostVarTmp + "/a"},
		{"/work/main", "/work/main"},
	}
	for _, tt := range tests {
		if got := InsidePath(tt.in); got != tt.want {
			t.Errorf("InsidePath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := insidePathArg("-test.testlogfile=/tmp/x/testlog.txt"); got != "-test.testlogfile="+InsideHostTmp+"/x/testlog.txt" {
		t.Errorf("insidePathArg = %q", got)
	}
}

// mounted reports whether the harness mounts the v1 hierarchy of ctrls.
func mounted(sd *Systemd, ctrls string) bool {
	for _, h := range sd.cgroups {
		if !h.v2 && ctrls != "" && strings.Contains(","+h.opts+",", ","+ctrls+",") {
			return true
		}
	}
	return false
}
