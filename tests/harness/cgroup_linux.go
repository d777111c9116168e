package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

const cgroupRoot = "/sys/fs/cgroup"

// hierarchy is one cgroup filesystem mounted at or under /sys/fs/cgroup.
type hierarchy struct {
	mountpoint string // host path, e.g. /sys/fs/cgroup/memory or /sys/fs/cgroup
	v2         bool
	opts       string // v1 only: controllers and name= for mount -o
	parent     string // host path of our own cgroup in this hierarchy
	child      string // host path of the harness's child cgroup
}

// cgroupLayout is how the host mounts its cgroup filesystems.
type cgroupLayout struct {
	rootIsV2    bool         // /sys/fs/cgroup itself is cgroup2 (pure v2)
	hierarchies []*hierarchy // mounted hierarchies, with our cgroup in each
	symlinks    map[string]string
}

// readMounts lists the host's mounts (the parser is scope/cgroupv2's, the
// one corrald itself uses).
func readMounts() ([]cgroupv2.Mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return cgroupv2.ParseMountinfo(data), nil
}

// ownCgroups reads /proc/self/cgroup ONCE (it changes under a reader when
// the process moves) into controller-list -> path; "" is the v2 entry.
func ownCgroups() (map[string]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read own cgroups: %w", err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		out[parts[1]] = parts[2]
	}
	return out, nil
}

// discoverCgroups finds the mounted hierarchies and our cgroup in each.
func discoverCgroups() (*cgroupLayout, error) {
	mounts, err := readMounts()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	lay := &cgroupLayout{symlinks: map[string]string{}}
	seen := map[string]bool{}
	for _, m := range mounts {
		if m.Point != cgroupRoot && !strings.HasPrefix(m.Point, cgroupRoot+"/") {
			continue
		}
		if m.Point == cgroupRoot {
			// A later mount on the same point hides an earlier one.
			lay.rootIsV2 = m.FSType == "cgroup2"
			lay.hierarchies = nil
			seen = map[string]bool{}
		}
		if m.FSType != "cgroup" && m.FSType != "cgroup2" {
			continue
		}
		if seen[m.Point] {
			continue
		}
		seen[m.Point] = true
		h := &hierarchy{mountpoint: m.Point, v2: m.FSType == "cgroup2"}
		var path string
		if h.v2 {
			p, ok := own[""]
			if !ok {
				return nil, fmt.Errorf("no v2 entry in /proc/self/cgroup for %s", m.Point)
			}
			path = p
		} else {
			var opts []string
			set := map[string]bool{}
			for _, o := range strings.Split(m.SuperOpts, ",") {
				// release_agent is per hierarchy and set by the host's
				// init; it may not be set again from a cgroup namespace.
				if o == "rw" || o == "ro" || strings.HasPrefix(o, "release_agent=") {
					continue
				}
				opts = append(opts, o)
				set[o] = true
			}
			h.opts = strings.Join(opts, ",")
			found := false
			for ctrls, p := range own {
				if ctrls == "" {
					continue
				}
				all := true
				for _, c := range strings.Split(ctrls, ",") {
					if !set[c] {
						all = false
					}
				}
				if all {
					path, found = p, true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("no /proc/self/cgroup entry for %s (%s)", m.Point, m.SuperOpts)
			}
		}
		// A mount whose root is not "/" (we are in a cgroup namespace or it
		// is a bind mount) shows the path relative to its root.
		rel := path
		if m.Root != "/" {
			if !strings.HasPrefix(path, m.Root) {
				return nil, fmt.Errorf("own cgroup %s is outside mount %s (root %s)", path, m.Point, m.Root)
			}
			rel = strings.TrimPrefix(path, m.Root)
		}
		if strings.HasPrefix(rel, "/..") {
			return nil, fmt.Errorf("own cgroup %s is outside our cgroup namespace", path)
		}
		h.parent = filepath.Join(m.Point, rel)
		h.child = h.parent // until create
		lay.hierarchies = append(lay.hierarchies, h)
	}
	if len(lay.hierarchies) == 0 {
		return nil, errors.New("no cgroup filesystem mounted under /sys/fs/cgroup")
	}
	if !lay.rootIsV2 {
		entries, err := os.ReadDir(cgroupRoot)
		if err == nil {
			for _, e := range entries {
				if e.Type()&os.ModeSymlink != 0 {
					if target, err := os.Readlink(filepath.Join(cgroupRoot, e.Name())); err == nil {
						lay.symlinks[e.Name()] = target
					}
				}
			}
		}
	}
	return lay, nil
}

// create makes the child cgroup name under our cgroup in every hierarchy.
// On error it removes what it created.
func (lay *cgroupLayout) create(name string) error {
	for i, h := range lay.hierarchies {
		parent := h.parent
		removeStale(parent)
		child := filepath.Join(parent, name)
		if err := os.Mkdir(child, 0o755); err != nil {
			lay.remove(i, time.Second)
			return fmt.Errorf("create cgroup %s: %w", child, err)
		}
		h.child = child
		if !h.v2 && strings.Contains(","+h.opts+",", ",cpuset,") {
			// v1 cpuset children start empty and refuse tasks until both
			// are set.
			for _, f := range []string{"cpus", "mems"} {
				file := "cpuset." + f
				if _, err := os.Stat(filepath.Join(parent, file)); err != nil {
					file = f // mounted with noprefix
				}
				val, err := os.ReadFile(filepath.Join(parent, file))
				if err == nil {
					err = os.WriteFile(filepath.Join(child, file), val, 0)
				}
				if err != nil {
					lay.remove(i+1, time.Second)
					return fmt.Errorf("copy %s to %s: %w", file, child, err)
				}
			}
		}
	}
	return nil
}

// removeStale removes harness cgroups under parent left by test processes
// that died without Close (corral-harness-<pid>-<n> whose pid is gone).
// Errors are ignored: a busy one is retried at the next Boot.
func removeStale(parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "corral-harness-")
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat("/proc/" + pidStr); err == nil {
			continue // its owner still runs
		}
		_ = removeTree(filepath.Join(parent, e.Name()))
	}
}

// procsFiles are the cgroup.procs files of the child cgroups.
func (lay *cgroupLayout) procsFiles() []string {
	out := make([]string, 0, len(lay.hierarchies))
	for _, h := range lay.hierarchies {
		out = append(out, filepath.Join(h.child, "cgroup.procs"))
	}
	return out
}

// kill writes cgroup.kill in v2 child cgroups where the kernel has it.
func (lay *cgroupLayout) kill() {
	for _, h := range lay.hierarchies {
		if h.v2 {
			_ = os.WriteFile(filepath.Join(h.child, "cgroup.kill"), []byte("1"), 0)
		}
	}
}

// remove removes the child cgroups of the first n hierarchies (and whatever
// systemd created below them), retrying while they still hold dying tasks.
func (lay *cgroupLayout) remove(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var errs []error
	for _, h := range lay.hierarchies[:n] {
		if !strings.HasPrefix(filepath.Base(h.child), "corral-harness-") {
			// Never walk a cgroup we did not create (its siblings are not ours).
			errs = append(errs, fmt.Errorf("refuse to remove cgroup %s: not a harness cgroup", h.child))
			continue
		}
		for {
			err := removeTree(h.child)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", h.child, err))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// removeTree rmdirs a cgroup directory depth first. A cgroup directory holds
// only kernel files, which rmdir of the directory removes.
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return os.NewSyscallError("rmdir "+dir, err)
	}
	return nil
}

// mountScript is the shell that mounts the cgroup filesystems afresh inside
// the new cgroup and mount namespaces, mirroring the host's layout.
func (lay *cgroupLayout) mountScript() string {
	var b strings.Builder
	if lay.rootIsV2 {
		// The same filesystem cannot be mounted right on top of itself
		// (EBUSY); drop the host's mount first (private mount namespace).
		fmt.Fprintf(&b, "umount -l %s\n", cgroupRoot)
		fmt.Fprintf(&b, "mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 %s\n", cgroupRoot)
		return b.String()
	}
	fmt.Fprintf(&b, "mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs %s\n", cgroupRoot)
	for _, h := range lay.hierarchies {
		fmt.Fprintf(&b, "mkdir -p %s\n", shellQuote(h.mountpoint))
		if h.v2 {
			fmt.Fprintf(&b, "mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 %s\n", shellQuote(h.mountpoint))
		} else {
			fmt.Fprintf(&b, "mount -t cgroup -o nosuid,nodev,noexec,%s cgroup %s\n", h.opts, shellQuote(h.mountpoint))
		}
	}
	for name, target := range lay.symlinks {
		fmt.Fprintf(&b, "ln -s %s %s\n", shellQuote(target), shellQuote(filepath.Join(cgroupRoot, name)))
	}
	return b.String()
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
