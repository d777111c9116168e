package testenv

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// recorder is a testing.TB that notes whether Skip or Fatal ran instead of
// stopping the goroutine.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper()                     {}
func (r *recorder) Skip(args ...any)            { r.skipped = true }
func (r *recorder) Fatal(args ...any)           { r.failed = true }
func (r *recorder) Skipf(f string, args ...any) { r.skipped = true }
func (r *recorder) Fatalf(f string, args ...any) {
	r.failed = true
	r.msg = f
}

func TestSkipFailsUnderStrict(t *testing.T) {
	tests := []struct {
		strict             string
		wantSkip, wantFail bool
	}{
		{"", true, false},
		{"0", true, false},
		{"1", false, true},
	}
	for _, tt := range tests {
		t.Run("CORRAL_STRICT="+tt.strict, func(t *testing.T) {
			t.Setenv(StrictEnv, tt.strict)
			r := &recorder{TB: t}
			Skip(r, "no cgroup2 mount")
			if r.skipped != tt.wantSkip || r.failed != tt.wantFail {
				t.Errorf("Skip: skipped %v failed %v, want %v %v", r.skipped, r.failed, tt.wantSkip, tt.wantFail)
			}
			r = &recorder{TB: t}
			Skipf(r, "needs %s", "perl")
			if r.skipped != tt.wantSkip || r.failed != tt.wantFail {
				t.Errorf("Skipf: skipped %v failed %v, want %v %v", r.skipped, r.failed, tt.wantSkip, tt.wantFail)
			}
			if code := SkipSuite("testenv", "needs root"); (code != 0) != tt.wantFail {
				t.Errorf("SkipSuite = %d, want failure %v", code, tt.wantFail)
			}
		})
	}
}

func TestCheckFindsLeakedFD(t *testing.T) {
	warm()
	before := Measure()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	err = before.CheckFDs(50 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "/proc/") {
		t.Errorf("CheckFDs with a file open = %v, want an error naming it", err)
	}
	f.Close()
	if err := before.Check(2 * time.Second); err != nil {
		t.Errorf("Check after closing it = %v, want nil", err)
	}
}

func TestCheckFindsLeakedGoroutine(t *testing.T) {
	warm()
	// Earlier tests' goroutines may still be ending: wait for the count to
	// hold still before taking the baseline.
	for n, i := -1, 0; i < 100 && runtime.NumGoroutine() != n; i++ {
		n = runtime.NumGoroutine()
		time.Sleep(10 * time.Millisecond)
	}
	before := Measure()
	stop := make(chan struct{})
	go func() { <-stop }()
	if err := before.Check(50 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "goroutines") {
		t.Errorf("Check with a goroutine running = %v, want an error about goroutines", err)
	}
	close(stop)
	for i := 0; i < 100 && runtime.NumGoroutine() > before.Goroutines; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if err := before.Check(2 * time.Second); err != nil {
		t.Errorf("Check after it ended = %v, want nil", err)
	}
}

// TestLowerFDLimitZeroHasNoHoles: under LowerFDLimit(0) no fd can be
// opened even where one below the old limit was just closed (another
// goroutine's close must not let a test's one failing open succeed).
func TestLowerFDLimitZeroHasNoHoles(t *testing.T) {
	hole, err := syscall.Dup(0)
	if err != nil {
		t.Fatal(err)
	}
	restore, err := LowerFDLimit(0)
	if err != nil {
		syscall.Close(hole)
		t.Fatal(err)
	}
	syscall.Close(hole) // a hole below the lowered limit's old lowest free fd
	fd, derr := syscall.Dup(0)
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	if derr == nil {
		syscall.Close(fd)
	}
	if !errors.Is(derr, syscall.EMFILE) {
		t.Errorf("dup under LowerFDLimit(0) after a close = %v (fd %d), want EMFILE", derr, fd)
	}
}

func TestLowerFDLimit(t *testing.T) {
	restore, err := LowerFDLimit(1)
	if err != nil {
		t.Fatal(err)
	}
	first, ferr := syscall.Dup(0)
	second, serr := syscall.Dup(0)
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	for _, fd := range []int{first, second} {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
	if ferr != nil {
		t.Errorf("first dup under LowerFDLimit(1) = %v, want an fd", ferr)
	}
	if !errors.Is(serr, syscall.EMFILE) {
		t.Errorf("second dup under LowerFDLimit(1) = %v, want EMFILE", serr)
	}
	if fd, err := syscall.Dup(0); err != nil {
		t.Errorf("dup after restore = %v, want an fd", err)
	} else {
		syscall.Close(fd)
	}
}
