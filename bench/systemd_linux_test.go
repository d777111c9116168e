package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/harness"
)

// systemdEnv, when set (to the sample count), turns the test binary into
// the measuring process of benchSystemd, run inside a harness systemd;
// systemdCorraldEnv names the corrald binary to start there.
const (
	systemdEnv        = "CORRAL_BENCH_SYSTEMD"
	systemdCorraldEnv = "CORRAL_BENCH_SYSTEMD_CORRALD"
)

var systemdN = 100 // samples per side

// Sides of the systemd comparison, as keys of the inside process's JSON.
const (
	sdCorrald    = "corrald systemd start+wait"
	sdRunScope   = "systemd-run --scope"
	sdRunService = "systemd-run --wait (service)"
	sdBare       = "os/exec Run"
)

// benchSystemd compares corrald with --scope systemd against systemd-run,
// inside a private systemd booted by tests/harness (PID 1 here is not
// systemd). The measuring runs in a process inside it; this side only
// boots, collects the samples and tears down.
func (s *suite) benchSystemd(t *testing.T) {
	if reason := harness.Unavailable(); reason != "" {
		fmt.Fprintf(&s.out, "\n### (f) systemd comparison\n\nSkipped: cannot boot a harness systemd here (%s).\n", reason)
		t.Skipf("cannot boot a harness systemd: %s", reason)
	}
	sd, err := harness.Boot(harness.Options{})
	if err != nil {
		t.Fatalf("boot harness systemd: %v", err)
	}
	t.Cleanup(func() {
		if err := sd.Close(); err != nil {
			t.Errorf("close harness systemd: %v", err)
		}
	})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 5*time.Minute)
	cmd := sd.Command(ctx, harness.InsidePath(exe), "-test.run=^$")
	cmd.Env = append(os.Environ(), systemdEnv+"="+strconv.Itoa(systemdN), systemdCorraldEnv+"="+harness.InsidePath(s.bin))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("measure inside the harness systemd: %v\n%s", err, out.Bytes())
	}
	var res map[string][]time.Duration
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("decode samples from inside: %v\n%s", err, out.Bytes())
	}
	for _, k := range []string{sdCorrald, sdRunScope, sdRunService, sdBare} {
		if len(res[k]) != systemdN {
			t.Fatalf("%d samples of %q from inside, want %d", len(res[k]), k, systemdN)
		}
	}
	s.latencyTable("(f) corrald --scope systemd against systemd-run, /bin/true",
		fmt.Sprintf("Inside a private systemd 252 booted by tests/harness (own pid, mount and cgroup namespaces; same kernel and CPUs). %d samples per side, four sides interleaved. "+
			"corrald: exec.start + exec.wait until cleaned, one connection. `systemd-run --scope --quiet --collect /bin/true` (stderr to a pipe, stdout /dev/null): a transient scope around the command, the CLI's own start-up included; "+
			"`systemd-run --wait --quiet --collect /bin/true`: a transient service, waited until it finished.", systemdN),
		[]latencyRow{
			{"vs systemd-run --scope", "corrald systemd", sdRunScope, res[sdCorrald], res[sdRunScope]},
			{"vs systemd-run --wait", "corrald systemd", sdRunService, res[sdCorrald], res[sdRunService]},
			{"vs bare exec (inside)", "corrald systemd", sdBare, res[sdCorrald], res[sdBare]},
		})
}

// runSystemdInside is the measuring process of benchSystemd. It starts
// corrald with --scope systemd, takes the samples, prints them as JSON on
// stdout and returns the exit code.
func runSystemdInside() int {
	log := zerolog.New(os.Stderr).With().Timestamp().Str("component", "bench-systemd").Logger()
	n, err := strconv.Atoi(os.Getenv(systemdEnv))
	bin := os.Getenv(systemdCorraldEnv)
	if err != nil || n <= 0 || bin == "" {
		log.Error().Msg("want " + systemdEnv + " (sample count) and " + systemdCorraldEnv)
		return 2
	}
	dir, err := os.MkdirTemp("", "corral-bench-systemd-")
	if err != nil {
		log.Error().Err(err).Msg("temp dir")
		return 1
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "corrald.sock")
	d := exec.Command(bin, "--socket", sock, "--state-dir", filepath.Join(dir, "state"), "--scope", "systemd",
		"--config", "/dev/null", "--log-level", "warn", "--log-format", "json", "--drain", "1s")
	logf, err := os.Create(filepath.Join(dir, "corrald.log"))
	if err != nil {
		log.Error().Err(err).Msg("log file")
		return 1
	}
	defer logf.Close()
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		log.Error().Err(err).Msg("start corrald")
		return 1
	}
	defer func() {
		_ = d.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = d.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = d.Process.Kill()
			<-done
		}
	}()
	fail := func(err error, msg string) int {
		b, _ := os.ReadFile(logf.Name())
		log.Error().Err(err).Str("corrald_log", string(b)).Msg(msg)
		return 1
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fail(nil, "corrald did not listen within 15s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, err := ipc.Dial(sock)
	if err != nil {
		return fail(err, "dial corrald")
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	res := map[string][]time.Duration{}
	var firstErr error
	timed := func(side string, record bool, f func() error) func() {
		return func() {
			if firstErr != nil {
				return
			}
			t0 := time.Now()
			err := f()
			el := time.Since(t0)
			if err != nil {
				firstErr = fmt.Errorf("%s: %w", side, err)
				return
			}
			if record {
				res[side] = append(res[side], el)
			}
		}
	}
	run := func(argv ...string) func() error {
		return func() error {
			var stderr bytes.Buffer
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Stderr = &stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%v: %w: %s", argv, err, stderr.Bytes())
			}
			return nil
		}
	}
	viaCorrald := func() error {
		rec, err := c.Start(ctx, api.StartParams{Argv: []string{"/bin/true"}})
		if err != nil {
			return fmt.Errorf("exec.start: %w", err)
		}
		rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID})
		if err != nil {
			return fmt.Errorf("exec.wait: %w", err)
		}
		if rec.ExitCode == nil || *rec.ExitCode != 0 || rec.Backend != "systemd" && rec.Backend != "" {
			b, _ := json.Marshal(rec)
			return fmt.Errorf("want exit 0 under the systemd backend; got %s", b)
		}
		return nil
	}
	const warmup = 5
	for i := 0; i < warmup+n && firstErr == nil; i++ {
		rec := i >= warmup
		rotate(i,
			timed(sdCorrald, rec, viaCorrald),
			timed(sdRunScope, rec, run("systemd-run", "--scope", "--quiet", "--collect", "/bin/true")),
			timed(sdRunService, rec, run("systemd-run", "--wait", "--quiet", "--collect", "/bin/true")),
			timed(sdBare, rec, func() error { return exec.Command("/bin/true").Run() }),
		)
	}
	if firstErr != nil {
		return fail(firstErr, "measure")
	}
	b, err := json.Marshal(res)
	if err != nil {
		log.Error().Err(err).Msg("encode samples")
		return 1
	}
	if _, err := os.Stdout.Write(b); err != nil {
		log.Error().Err(err).Msg("write samples")
		return 1
	}
	return 0
}
