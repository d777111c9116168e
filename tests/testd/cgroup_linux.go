package testd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

// baseSeq numbers the cgroup bases of this process.
var baseSeq atomic.Int64

// Cgroup2Mount returns where a cgroup2 hierarchy is mounted: the hybrid
// layout's /sys/fs/cgroup/unified or a unified /sys/fs/cgroup; "" if
// neither is.
func Cgroup2Mount() string {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	return ""
}

// CgroupBase returns a fresh path below root for a daemon's --cgroup-base,
// named prefix-<pid>-<n>; it does not create it (corrald does). Its cleanup
// kills whatever is left below the base and removes it, failing the test if
// it cannot. Call it before starting the daemons that use the base, so that
// the cleanup runs after theirs.
func CgroupBase(t testing.TB, root, prefix string) string {
	t.Helper()
	return cgroupBase(t, root, prefix, false)
}

// StrictCgroupBase is CgroupBase whose cleanup also fails the test when a
// cgroup or a process is left in the base once the daemons using it have
// stopped.
func StrictCgroupBase(t testing.TB, root, prefix string) string {
	t.Helper()
	return cgroupBase(t, root, prefix, true)
}

func cgroupBase(t testing.TB, root, prefix string, strict bool) string {
	t.Helper()
	if root == "" {
		t.Fatal("cgroup base: no cgroup2 hierarchy")
	}
	base := filepath.Join(root, fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), baseSeq.Add(1)))
	t.Cleanup(func() {
		if strict {
			if left := CgroupChildren(base); len(left) > 0 {
				t.Errorf("cgroups left under %s: %v", base, left)
			}
			if procs, _ := os.ReadFile(filepath.Join(base, "cgroup.procs")); len(procs) > 0 {
				t.Errorf("processes left in %s: %s", base, procs)
			}
		}
		if err := RemoveCgroupTree(base); err != nil {
			t.Errorf("clean up cgroup base: %v", err)
		}
	})
	return base
}

// RemoveCgroupTree kills every process in the cgroup dir and below it
// (cgroup.kill), waits up to 5s for it to empty and removes dir and its
// descendants: scope/cgroupv2's Destroy, as corrald's leftover sweep does.
// A missing dir is fine.
func RemoveCgroupTree(dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cgroupv2.Dir(dir).Destroy(ctx); err != nil {
		return fmt.Errorf("remove cgroup tree: %w", err)
	}
	return nil
}

// CgroupChildren lists the names of the cgroups directly below dir (none
// when dir does not exist).
func CgroupChildren(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}
