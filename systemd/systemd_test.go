package systemd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/tests/harness"
)

const helperEnv = "CORRAL_SYSTEMD_TEST_HELPER"

// go-systemd's journal package opens one socket for the life of the process
// on first use (JournalWriter's sends): open it before TestMain's leak check
// takes its count, so it is not counted as leaked.
func init() { JournalAvailable() }

// TestMain runs the package inside a private systemd (for the journal
// test); the listeners helper runs in a child of the test binary.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "listeners" {
		os.Exit(listenersHelper())
	}
	os.Exit(harness.RunInside(m))
}

// notifySocket listens on a fresh $NOTIFY_SOCKET for the test.
func notifySocket(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	t.Cleanup(closeNotifier) // before TestMain's leak check
	return c
}

// closeNotifier closes the notifier's kept socket.
func closeNotifier() {
	notifySock.mu.Lock()
	notifySock.closeLocked()
	notifySock.mu.Unlock()
}

func notifierOpens() int {
	notifySock.mu.Lock()
	defer notifySock.mu.Unlock()
	return notifySock.opens
}

func TestNotify(t *testing.T) {
	c := notifySocket(t)
	tests := []struct {
		name string
		send func() (bool, error)
		want string
	}{
		{"ready", Ready, "READY=1"},
		{"stopping", Stopping, "STOPPING=1"},
		{"watchdog", Watchdog, "WATCHDOG=1"},
		{"status", func() (bool, error) { return Status("3 running") }, "STATUS=3 running"},
		{"status newline", func() (bool, error) { return Status("a\nMAINPID=1") }, "STATUS=a MAINPID=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sent, err := tt.send()
			if !sent || err != nil {
				t.Fatalf("send = %v, %v; want true, nil", sent, err)
			}
			buf := make([]byte, 512)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(buf[:n]); got != tt.want {
				t.Errorf("datagram = %q, want %q", got, tt.want)
			}
		})
	}
	if os.Getenv("NOTIFY_SOCKET") == "" {
		t.Errorf("NOTIFY_SOCKET was unset by a notification; later ones would be lost")
	}
}

func TestNotifyWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	os.Unsetenv("NOTIFY_SOCKET")
	for name, f := range map[string]func() (bool, error){"Ready": Ready, "Stopping": Stopping, "Watchdog": Watchdog} {
		if sent, err := f(); sent || err != nil {
			t.Errorf("%s() without NOTIFY_SOCKET = %v, %v; want false, nil", name, sent, err)
		}
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "absent.sock"))
	if sent, err := Ready(); sent || err == nil {
		t.Errorf("Ready() to a missing socket = %v, %v; want false and an error", sent, err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	me := strconv.Itoa(os.Getpid())
	tests := []struct {
		name       string
		usec, pid  string
		want       time.Duration
		wantEnable bool
	}{
		{"unset", "", "", 0, false},
		{"ours", "10000000", me, 10 * time.Second, true},
		{"no pid", "4000000", "", 4 * time.Second, true},
		{"other pid", "10000000", "1", 0, false},
		{"malformed", "ten", me, 0, false},
		{"zero", "0", me, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", tt.usec)
			t.Setenv("WATCHDOG_PID", tt.pid)
			if tt.usec == "" {
				os.Unsetenv("WATCHDOG_USEC")
			}
			if tt.pid == "" {
				os.Unsetenv("WATCHDOG_PID")
			}
			got, ok := WatchdogInterval()
			if got != tt.want || ok != tt.wantEnable {
				t.Errorf("WatchdogInterval() = %v, %v; want %v, %v", got, ok, tt.want, tt.wantEnable)
			}
		})
	}
}

func TestUnderSystemd(t *testing.T) {
	_, err := os.Stat("/run/systemd/system")
	booted := err == nil
	tests := []struct {
		name, invocation, notify string
		want                     bool
	}{
		{"plain process", "", "", false},
		{"service", "abc123", "", booted},
		{"notify service", "", "/run/systemd/notify", booted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("INVOCATION_ID", tt.invocation)
			t.Setenv("NOTIFY_SOCKET", tt.notify)
			if got := UnderSystemd(); got != tt.want {
				t.Errorf("UnderSystemd() = %v, want %v (/run/systemd/system exists: %v)", got, tt.want, booted)
			}
		})
	}
}

func TestScrubEnv(t *testing.T) {
	in := []string{"PATH=/bin", "NOTIFY_SOCKET=/run/systemd/notify", "LISTEN_FDS=1", "LISTEN_PID=7",
		"LISTEN_FDNAMES=corrald.socket", "WATCHDOG_USEC=1", "WATCHDOG_PID=7", "INVOCATION_ID=x",
		"JOURNAL_STREAM=8:9", "HOME=/root", "NOTIFY_SOCKETX=keep"}
	want := []string{"PATH=/bin", "HOME=/root", "NOTIFY_SOCKETX=keep"}
	if got := ScrubEnv(in); !reflect.DeepEqual(got, want) {
		t.Errorf("ScrubEnv = %q, want %q", got, want)
	}
}

// listenersHelper runs in a child started by runListeners: it reports what
// Listeners returned, one line per listener, and the LISTEN_* left behind.
func listenersHelper() int {
	lns, err := Listeners()
	if err != nil {
		fmt.Println("error:", err)
		return 0
	}
	for _, l := range lns {
		fmt.Println("listener:", l.Addr().String())
		l.Close()
	}
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		if v, ok := os.LookupEnv(k); ok {
			fmt.Printf("env: %s=%s\n", k, v)
		}
	}
	return 0
}

// runListeners starts the helper with files as fds 3.. and LISTEN_PID set
// to the helper's own pid, and returns its report lines.
func runListeners(t *testing.T, names string, files ...*os.File) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// sh's $$ is the pid the helper will have after exec.
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" -test.run='^$'`, exe)
	cmd.Env = append(os.Environ(), helperEnv+"=listeners", fmt.Sprintf("LISTEN_FDS=%d", len(files)))
	if names != "" {
		cmd.Env = append(cmd.Env, "LISTEN_FDNAMES="+names)
	}
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "listener:") || strings.HasPrefix(l, "error:") || strings.HasPrefix(l, "env:") {
			lines = append(lines, l)
		}
	}
	return lines
}

// socketFile returns a listening socket's fd (as a file) and its address.
func socketFile(t *testing.T, network string) (*os.File, string) {
	t.Helper()
	var l interface {
		net.Listener
		File() (*os.File, error)
	}
	switch network {
	case "unix":
		path := filepath.Join(t.TempDir(), "s.sock")
		ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l = ul
	case "tcp":
		tl, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		l = tl
	}
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(); l.Close() })
	return f, l.Addr().String()
}

func TestListeners(t *testing.T) {
	a, aAddr := socketFile(t, "unix")
	b, bAddr := socketFile(t, "unix")
	tcp, _ := socketFile(t, "tcp")
	tests := []struct {
		name  string
		names string
		files []*os.File
		want  []string
	}{
		{"none", "", nil, nil},
		{"one unnamed", "", []*os.File{a}, []string{"listener: " + aAddr}},
		{"all when none is ours", "x.socket:y.socket", []*os.File{a, b}, []string{"listener: " + aAddr, "listener: " + bAddr}},
		{"only corrald.socket", "other.socket:corrald.socket", []*os.File{a, b}, []string{"listener: " + bAddr}},
		{"tcp refused", "", []*os.File{tcp}, []string{"error: socket-activated fd LISTEN_FD_3: tcp listener, want a unix stream socket"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runListeners(t, tt.names, tt.files...)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("helper reported %q, want %q", got, tt.want)
			}
		})
	}
}

func TestJournalFields(t *testing.T) {
	harness.Require(t)
	if !JournalAvailable() {
		t.Fatal("JournalAvailable() = false inside the harness, want true")
	}
	b := make([]byte, 8)
	rand.Read(b)
	id := "e-" + hex.EncodeToString(b)
	log := zerolog.New(JournalWriter()).With().Timestamp().Str("syslog_identifier", "corral-systemd-test").Logger()
	log.Warn().Str("exec_id", id).Str("event", "exec_started").Int("owner_uid", 1000).
		Strs("argv", []string{"sleep", "1"}).Msg("execution started")

	var entry map[string]any
	deadline := time.Now().Add(5 * time.Second)
	for entry == nil {
		// journald receives datagrams asynchronously; --sync waits until
		// what it has received is written.
		if out, err := exec.Command("journalctl", "--sync").CombinedOutput(); err != nil {
			t.Fatalf("journalctl --sync: %v\n%s", err, out)
		}
		out, err := exec.Command("journalctl", "EXEC_ID="+id, "-o", "json", "--no-pager").Output()
		if err != nil {
			t.Fatalf("journalctl EXEC_ID=%s: %v", id, err)
		}
		if len(bytes.TrimSpace(out)) > 0 {
			if err := json.Unmarshal(bytes.SplitN(out, []byte("\n"), 2)[0], &entry); err != nil {
				t.Fatalf("journal entry %s: %v", out, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no journal entry with EXEC_ID=%s", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := map[string]string{
		"EXEC_ID":           id,
		"EVENT":             "exec_started",
		"OWNER_UID":         "1000",
		"ARGV":              `["sleep","1"]`,
		"MESSAGE":           "execution started",
		"PRIORITY":          "4",
		"SYSLOG_IDENTIFIER": "corral-systemd-test",
	}
	for k, v := range want {
		if got, _ := entry[k].(string); got != v {
			t.Errorf("journal field %s = %q, want %q", k, got, v)
		}
	}
	if _, ok := entry["TIME"]; ok {
		t.Errorf("journal entry has a TIME field; the writer should drop zerolog's timestamp")
	}
	if js, _ := entry["JSON"].(string); !strings.Contains(js, `"exec_id":"`+id+`"`) {
		t.Errorf("JSON field = %q, want the original event", js)
	}
}
