package reactor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/corral-dev/corral/tests/testenv"
)

// A caller keeps the host's network only when its network namespace is
// read and is the daemon's: one in another namespace, or one whose
// namespace cannot be read, is given network "none".
func TestOtherNetnsFailsClosed(t *testing.T) {
	if other, err := otherNetns(int32(os.Getpid())); other || err != nil {
		t.Errorf("otherNetns(own pid) = %v, %v; want false, nil (the daemon's own namespace)", other, err)
	}
	if other, err := otherNetns(0); other || err != nil {
		t.Errorf("otherNetns(0) = %v, %v; want false, nil (an in-process caller)", other, err)
	}
	gone := exec.Command("/bin/true")
	if err := gone.Run(); err != nil {
		t.Fatalf("run /bin/true: %v", err)
	}
	if other, err := otherNetns(int32(gone.Process.Pid)); !other || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("otherNetns(reaped pid %d) = %v, %v; want true (a caller whose namespace cannot be read kept the host's network), ENOENT",
			gone.Process.Pid, other, err)
	}
	testenv.SkipRoot(t, "a new network namespace needs root")
	in := exec.Command("unshare", "--net", "sleep", "30")
	if err := in.Start(); err != nil {
		t.Fatalf("start unshare --net sleep: %v", err)
	}
	t.Cleanup(func() {
		_ = in.Process.Kill()
		_ = in.Wait()
	})
	// unshare execs sleep once the namespace is made: wait for that.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", in.Process.Pid)); string(b) == "sleep\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unshare --net did not exec sleep within 10s")
		}
	}
	if other, err := otherNetns(int32(in.Process.Pid)); !other || err != nil {
		t.Errorf("otherNetns(pid in a new network namespace) = %v, %v; want true, nil", other, err)
	}
}

// The daemon's own namespace is kept once read, and a failed read is not
// kept: the next call reads again (and until then callers fail closed).
func TestSelfNetnsKeepsOnlyASuccessfulRead(t *testing.T) {
	reads := 0
	results := []error{os.ErrPermission, nil, os.ErrNotExist}
	c := netnsCache{read: func() (string, error) {
		err := results[reads]
		reads++
		if err != nil {
			return "", err
		}
		return "net:[1]", nil
	}}
	if ns, err := c.get(); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("get() after a failed read = %q, %v; want the read's error", ns, err)
	}
	for i := 0; i < 3; i++ {
		if ns, err := c.get(); ns != "net:[1]" || err != nil {
			t.Fatalf("get() #%d = %q, %v; want net:[1], nil (a failed read was kept)", i+2, ns, err)
		}
	}
	if reads != 2 {
		t.Errorf("read %d times, want 2 (once failing, once succeeding, then kept)", reads)
	}
}
