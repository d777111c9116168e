package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// peer is a long-lived helper process driven one command a line on its
// stdin, answering each with one line on its stdout. Owned by the test
// goroutine that started it (startPeer); stopped by a t.Cleanup.
type peer struct {
	name  string // "python peer", "spawn peer": for messages
	in    io.WriteCloser
	lines *bufio.Scanner
}

// startPeer starts cmd as the peer called name, its stderr on ours, and
// stops it at the test's cleanup: "quit", stdin closed, then up to 30s for
// it to exit before it is killed; an exit other than 0, or the kill, is
// an error of the test.
func startPeer(t *testing.T, name string, cmd *exec.Cmd) *peer {
	t.Helper()
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_, _ = io.WriteString(in, "quit\n")
		in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%s did not quit within 30s; killed", name)
		}
	})
	return &peer{name: name, in: in, lines: bufio.NewScanner(out)}
}

// ask sends one command and returns the peer's answer line.
func (p *peer) ask(t *testing.T, command string) string {
	t.Helper()
	if _, err := io.WriteString(p.in, command+"\n"); err != nil {
		t.Fatalf("%s %q: %v", p.name, command, err)
	}
	if !p.lines.Scan() {
		t.Fatalf("%s %q: no answer: %v", p.name, command, p.lines.Err())
	}
	return p.lines.Text()
}

// pyPeerScript is the seed article's asyncio run_limited, driven one command
// per line (see the script's doc string).
const pyPeerScript = "testdata/run_limited_peer.py"

// pyPeer is one python3 process running pyPeerScript (a peer).
type pyPeer struct{ *peer }

// pyResult is the peer's answer to one command.
type pyResult struct {
	NS         int64  `json:"ns"`
	Code       *int   `json:"code"`
	StdoutKept int    `json:"stdout_kept"`
	Truncated  bool   `json:"truncated"`
	Error      string `json:"error"`
}

// startPyPeer starts the peer, or returns nil with the reason when python3
// is not there.
func startPyPeer(t *testing.T) (*pyPeer, string) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		return nil, "no python3 on PATH"
	}
	script, err := filepath.Abs(pyPeerScript)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, script)
	// The peer's children inherit its environment, so they carry the mark.
	cmd.Env = append(os.Environ(), markEnv+"="+markValue()+"-python")
	return &pyPeer{startPeer(t, "python peer", cmd)}, ""
}

// do sends one command and returns the peer's answer.
func (p *pyPeer) do(t *testing.T, command string) pyResult {
	t.Helper()
	line := p.ask(t, command)
	var r pyResult
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("python peer %q: answer %q: %v", command, line, err)
	}
	if r.Error != "" {
		t.Fatalf("python peer %q: %s", command, r.Error)
	}
	return r
}

// runTrue is one run_limited(["/bin/true"]) in the peer; the time is the
// peer's own (perf_counter_ns around the await).
func (p *pyPeer) runTrue(t *testing.T) time.Duration {
	t.Helper()
	r := p.do(t, "true")
	if r.Code == nil || *r.Code != 0 {
		t.Fatalf("python run_limited /bin/true: exit code %v, want 0", r.Code)
	}
	return time.Duration(r.NS)
}

// drain is one run_limited of head -c n /dev/zero in the peer; it checks
// that the function kept its 256,000 bytes and flagged the truncation.
func (p *pyPeer) drain(t *testing.T, n int64) time.Duration {
	t.Helper()
	r := p.do(t, fmt.Sprintf("drain %d", n))
	if r.Code == nil || *r.Code != 0 || r.StdoutKept != min(int(n), 256_000) || !r.Truncated {
		t.Fatalf("python run_limited head -c %d: code %v, kept %d, truncated %v; want 0, 256000, true", n, r.Code, r.StdoutKept, r.Truncated)
	}
	return time.Duration(r.NS)
}

// spawnPeerSource is the C-speed floor: posix_spawn + waitpid of /bin/true
// in a long-lived C process (see its comment).
const spawnPeerSource = "testdata/spawn_peer.c"

// spawnPeer is one running spawn_peer (a peer).
type spawnPeer struct{ *peer }

// startSpawnPeer compiles spawn_peer.c with the C compiler (cc) and starts
// it, or returns nil with the reason when there is no compiler.
func startSpawnPeer(t *testing.T) (*spawnPeer, string) {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		return nil, "no C compiler (cc) on PATH"
	}
	src, err := filepath.Abs(spawnPeerSource)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "spawn_peer")
	if out, err := exec.Command(cc, "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("compile %s: %v\n%s", src, err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), markEnv+"="+markValue()+"-spawn")
	return &spawnPeer{startPeer(t, "spawn peer", cmd)}, ""
}

// runTrue is one posix_spawn + waitpid of /bin/true in the peer; the time
// is the peer's own (CLOCK_MONOTONIC around the two calls).
func (p *spawnPeer) runTrue(t *testing.T) time.Duration {
	t.Helper()
	return p.do(t, "true")
}

// runKernel is the kernel work corrald does for one /bin/true under the
// cgroup backend (a cgroup below cgBase, a workspace below workDir, two
// pipes, clone3 into the cgroup, exec, EOF, wait, both rmdirs), done by the
// C peer with no daemon, store or RPC; the time is the peer's own.
func (p *spawnPeer) runKernel(t *testing.T, cgBase, workDir string) time.Duration {
	t.Helper()
	return p.do(t, "kernel "+cgBase+" "+workDir)
}

// do sends one command and returns the time the peer answered with, which
// must come with exit status 0.
func (p *spawnPeer) do(t *testing.T, command string) time.Duration {
	t.Helper()
	line := p.ask(t, command)
	var ns int64
	var code int
	if _, err := fmt.Sscanf(line, "%d %d", &ns, &code); err != nil || code != 0 {
		t.Fatalf("spawn peer %q: answer %q (%v), want a time and exit status 0", command, line, err)
	}
	return time.Duration(ns)
}

// kernelRate is the kernel work of runKernel done by k worker processes of
// the C peer at once for d (a worker starts no round after d; the window
// ends when the last one is done): the rounds completed per second of the
// window, as the peer timed it.
func (p *spawnPeer) kernelRate(t *testing.T, k int, d time.Duration, cgBase, workDir string) float64 {
	t.Helper()
	command := fmt.Sprintf("kernelrate %d %d %s %s", k, d.Milliseconds(), cgBase, workDir)
	line := p.ask(t, command)
	var ns, rounds int64
	if _, err := fmt.Sscanf(line, "%d %d", &ns, &rounds); err != nil || ns <= 0 {
		t.Fatalf("spawn peer %q: answer %q (%v), want the window's nanoseconds and its rounds", command, line, err)
	}
	return float64(rounds) / time.Duration(ns).Seconds()
}
