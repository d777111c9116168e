package reactor

import (
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
	if otherNetns(int32(os.Getpid())) {
		t.Error("a caller in the daemon's own network namespace counted as in another")
	}
	gone := exec.Command("/bin/true")
	if err := gone.Run(); err != nil {
		t.Fatalf("run /bin/true: %v", err)
	}
	if !otherNetns(int32(gone.Process.Pid)) {
		t.Errorf("a caller whose network namespace cannot be read (pid %d, reaped) kept the host's network", gone.Process.Pid)
	}
	if os.Getuid() != 0 {
		testenv.Skip(t, "a new network namespace needs root")
	}
	other := exec.Command("unshare", "--net", "sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatalf("start unshare --net sleep: %v", err)
	}
	defer func() {
		_ = other.Process.Kill()
		_ = other.Wait()
	}()
	// unshare execs sleep once the namespace is made: wait for that.
	for i := 0; i < 500; i++ {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", other.Process.Pid)); string(b) == "sleep\n" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !otherNetns(int32(other.Process.Pid)) {
		t.Error("a caller in a new network namespace kept the host's network")
	}
}
