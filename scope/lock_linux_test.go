package scope

import (
	"errors"
	"strings"
	"testing"
)

// TestSecondLockSaysWhatToDo: a second corrald on a cgroup base another one
// holds is refused with ErrScopesInUse, naming the base and the flag that
// gives it one of its own.
func TestSecondLockSaysWhatToDo(t *testing.T) {
	b := &cgroupBackend{base: t.TempDir()}
	first, err := b.Lock()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := (&cgroupBackend{base: b.base}).Lock()
	if err == nil {
		second.Close()
		t.Fatal("a second Lock of the same base succeeded")
	}
	if !errors.Is(err, ErrScopesInUse) || !strings.Contains(err.Error(), b.base) || !strings.Contains(err.Error(), "--cgroup-base") {
		t.Errorf("second Lock = %v; want ErrScopesInUse naming %s and --cgroup-base", err, b.base)
	}
}
