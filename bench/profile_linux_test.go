package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/reactor"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/store"
	"github.com/corral-dev/corral/tests/testd"
)

var (
	profileExecN  = 1000 // start+wait of /bin/true under the CPU profile
	profileDrainN = 2    // 1 GB drains under the CPU profile
)

// profileEnv names a directory to keep the CPU profiles in (else they go
// with the test's temporary directory).
const profileEnv = "CORRAL_BENCH_PROFILE_DIR"

// clientLabel marks the samples of the benchmark's own client side (its
// calls and the ipc.Client reader goroutine), so that the tables show the
// daemon's side alone.
const clientLabel = "side=client"

// benchProfile is (h): corrald has no pprof endpoint, so the suite runs the
// daemon's hot path in this process — reactor.New + Run with the cgroup
// backend, the SQLite store (sync normal), pool off, served by ipc.Server
// on a Unix socket as in corrald — under runtime/pprof, for the exec
// latency loop (one client, and 8 at once: (d)'s path) and the output
// drain, and prints the top functions.
func (s *suite) benchProfile(t *testing.T) {
	dir := os.Getenv(profileEnv)
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	log := zerolog.Nop()
	// The base's cleanup (checking that no cgroup is left) runs after the
	// backend's.
	base := testd.StrictCgroupBase(t, cgroupMount, "corral-bench")
	backend, err := scope.NewCgroup(scope.CgroupOptions{Base: base, Log: log})
	if err != nil {
		t.Fatalf("cgroup backend: %v", err)
	}
	t.Cleanup(func() { backend.Close() })
	st, err := store.OpenOptions(state, log, store.Options{Synchronous: store.SyncNormal})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	r, err := reactor.New(reactor.Config{
		Backend: backend, Log: log, StateDir: state, Store: st, SocketGID: -1,
		Info: api.Info{Pidfd: true},
	})
	if err != nil {
		st.Close()
		t.Fatalf("reactor: %v", err)
	}
	loopCtx, stopLoop := context.WithCancel(context.Background())
	loopDone := make(chan error, 1)
	go func() { loopDone <- r.Run(loopCtx) }()
	sock := filepath.Join(state, "corrald.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := ipc.NewServer(r, log)
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()
	// Registered after the backend's cleanup, so it runs before it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx, time.Second); err != nil {
			t.Errorf("reactor shutdown: %v", err)
		}
		_ = srv.Shutdown(ctx)
		<-srvDone
		stopLoop()
		if err := <-loopDone; err != nil {
			t.Errorf("reactor run: %v", err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})

	ctx := ctxT(t, 5*time.Minute)
	var execProf, exec8Prof, drainProf string
	pprof.Do(ctx, pprof.Labels("side", "client"), func(ctx context.Context) {
		c, err := ipc.Dial(sock) // its reader goroutine inherits the label
		if err != nil {
			t.Fatalf("dial in-process server: %v", err)
		}
		defer c.Close()
		for i := 0; i < 20; i++ {
			runWait(t, ctx, c, nil)
		}
		execProf = profileTo(t, filepath.Join(dir, "exec.pprof"), func() {
			for i := 0; i < profileExecN; i++ {
				runWait(t, ctx, c, nil)
			}
		})
		// (d)'s path: 8 clients at once, each on its own connection, as
		// many start+wait in all.
		cs := make([]*ipc.Client, 8)
		for i := range cs {
			if cs[i], err = ipc.Dial(sock); err != nil {
				t.Fatalf("dial in-process server: %v", err)
			}
			defer cs[i].Close()
		}
		exec8Prof = profileTo(t, filepath.Join(dir, "exec8.pprof"), func() {
			var wg sync.WaitGroup
			errs := make(chan error, len(cs))
			for _, c := range cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < profileExecN/len(cs); i++ {
						if err := trueThrough(ctx, c); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("8 clients in-process: %v", err)
			}
		})
		argv := []string{"/usr/bin/head", "-c", fmt.Sprint(drainBytes), "/dev/zero"}
		drainProf = profileTo(t, filepath.Join(dir, "drain.pprof"), func() {
			for i := 0; i < profileDrainN; i++ {
				rec, err := c.Start(ctx, api.StartParams{Argv: argv, TimeoutMS: 300000})
				if err != nil {
					t.Fatalf("exec.start: %v", err)
				}
				rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID})
				if err != nil {
					t.Fatalf("exec.wait: %v", err)
				}
				if rec.ExitCode == nil || *rec.ExitCode != 0 || rec.Stdout.TotalBytes != drainBytes {
					b, _ := json.Marshal(rec)
					t.Fatalf("head in-process: want exit 0 and %d bytes; got %s", drainBytes, b)
				}
			}
		})
	})

	fmt.Fprintf(&s.out, "\n### (h) CPU profiles of the hot paths\n\n"+
		"corrald has no pprof endpoint, so the suite runs the daemon's code in its own process: reactor.New + Run with scope.NewCgroup, the SQLite store (sync normal), no pool, "+
		"behind ipc.Server on a Unix socket, and a client in the same process whose samples (its calls and its reader goroutine, labelled %s) are left out with -tagignore. "+
		"runtime/pprof CPU profile (user and system time of the process's threads; the children's own time is not in it). "+
		"Top 15 by flat time, then by cumulative time (`go tool pprof -top`).\n", clientLabel)
	for _, p := range []struct{ title, file string }{
		{fmt.Sprintf("exec latency loop: %d × start+wait of /bin/true", profileExecN), execProf},
		{fmt.Sprintf("executions from 8 clients at once: %d × start+wait of /bin/true, each client its own connection", profileExecN/8*8), exec8Prof},
		{fmt.Sprintf("output drain: %d × head -c %d /dev/zero", profileDrainN, drainBytes), drainProf},
	} {
		for _, mode := range []string{"flat", "cum"} {
			args := []string{"tool", "pprof", "-top", "-nodecount=15", "-tagignore=" + clientLabel}
			if mode == "cum" {
				args = append(args, "-cum")
			}
			out, err := exec.Command(testd.GoTool(), append(args, p.file)...).CombinedOutput()
			if err != nil {
				t.Errorf("go tool pprof %s: %v\n%s", p.file, err, out)
				continue
			}
			fmt.Fprintf(&s.out, "\n%s, by %s:\n\n```\n%s```\n", p.title, mode, trimPprofHeader(string(out)))
		}
	}
}

// profileTo runs f under a CPU profile written to path and returns path.
func profileTo(t *testing.T, path string, f func()) string {
	t.Helper()
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		t.Fatalf("start CPU profile: %v", err)
	}
	f()
	pprof.StopCPUProfile()
	return path
}

// trimPprofHeader drops pprof's File/Build ID/Time lines, which name
// temporary paths and say nothing about the profile.
func trimPprofHeader(s string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if strings.HasPrefix(line, "File:") || strings.HasPrefix(line, "Build ID:") || strings.HasPrefix(line, "Time:") {
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}
