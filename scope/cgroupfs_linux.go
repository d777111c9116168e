package scope

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// This file holds the cgroup filesystem helpers shared by the cgroup backend
// and Detect. Names start with "cg" so they cannot clash with the systemd
// backend's helpers in the same package.

// cgMount is one line of /proc/self/mountinfo that matters to us.
type cgMount struct {
	Root      string // root of the mount within its filesystem
	Point     string // mount point
	FSType    string // "cgroup2", "cgroup", "tmpfs", ...
	SuperOpts string // per-superblock options: a v1 hierarchy's controllers ("rw,cpuacct", "rw,name=systemd")
}

// cgParseMountinfo returns the mounts listed in a /proc/self/mountinfo text.
// Lines it cannot parse are skipped.
func cgParseMountinfo(data []byte) []cgMount {
	var out []cgMount
	for line := range bytes.Lines(data) {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		fields := strings.Fields(string(line))
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 6 || sep+1 >= len(fields) {
			continue
		}
		out = append(out, cgMount{
			Root:   cgUnescapeMount(fields[3]),
			Point:  cgUnescapeMount(fields[4]),
			FSType: fields[sep+1],
		})
		if sep+3 < len(fields) {
			out[len(out)-1].SuperOpts = fields[sep+3]
		}
	}
	return out
}

// cgUnescapeMount undoes the octal escapes (\040 for a space, ...) the
// kernel uses in mountinfo paths.
func cgUnescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cgPickCgroup2 chooses the cgroup2 mount to use: /sys/fs/cgroup on a pure
// v2 host, /sys/fs/cgroup/unified on a hybrid one, else the first cgroup2
// mount. It returns false when there is none.
func cgPickCgroup2(mounts []cgMount) (cgMount, bool) {
	var found []cgMount
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			found = append(found, m)
		}
	}
	for _, want := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		for _, m := range found {
			if m.Point == want {
				return m, true
			}
		}
	}
	if len(found) > 0 {
		return found[0], true
	}
	return cgMount{}, false
}

// cgModeOf names the host's cgroup layout from its mounts: "v2" when
// /sys/fs/cgroup is cgroup2, "hybrid" when v1 hierarchies and a cgroup2
// mount coexist, "v1" when there are only v1 hierarchies, "" when there is no
// cgroup filesystem at all.
func cgModeOf(mounts []cgMount) string {
	var v1, v2, rootV2 bool
	for _, m := range mounts {
		switch m.FSType {
		case "cgroup":
			v1 = true
		case "cgroup2":
			v2 = true
			if m.Point == "/sys/fs/cgroup" {
				rootV2 = true
			}
		}
	}
	switch {
	case rootV2 || (v2 && !v1):
		return "v2"
	case v2 && v1:
		return "hybrid"
	case v1:
		return "v1"
	}
	return ""
}

// cgParseOwn returns the cgroup v2 path ("0::" line) of a /proc/<pid>/cgroup
// text.
func cgParseOwn(data []byte) (string, bool) {
	for line := range bytes.Lines(data) {
		if rest, ok := bytes.CutPrefix(bytes.TrimRight(line, "\n"), []byte("0::")); ok {
			return string(rest), true
		}
	}
	return "", false
}

// cgOwnDir returns the directory of the daemon's own cgroup under mount m,
// given its path from /proc/self/cgroup. The path is relative to the root of
// the cgroup namespace, which is the mount's root for a mount made inside
// that namespace; a mount whose root is a subtree is accounted for.
func cgOwnDir(m cgMount, own string) (string, error) {
	rel := own
	if m.Root != "/" && m.Root != "" {
		r, ok := strings.CutPrefix(own, m.Root)
		if !ok || (r != "" && r[0] != '/') {
			return "", fmt.Errorf("own cgroup %q is outside the cgroup2 mount %s (root %q)", own, m.Point, m.Root)
		}
		rel = r
	}
	if strings.HasPrefix(rel, "/..") {
		// A cgroup outside our namespace shows as "/../..."; we cannot reach it.
		return "", fmt.Errorf("own cgroup %q is outside this cgroup namespace", own)
	}
	return filepath.Join(m.Point, rel), nil
}

// cgRead reads a small cgroup interface file.
func cgRead(dir, name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(dir, name))
}

// cgWrite writes value to a cgroup interface file in one write(2), as the
// kernel wants; it does not create the file.
func cgWrite(dir, name, value string) error {
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(value)
	cerr := f.Close()
	if werr != nil {
		return werr
	}
	return cerr
}

// cgKeyed returns the value of key in a flat-keyed file ("key value" per
// line) such as cgroup.events, cpu.stat or memory.events.
func cgKeyed(data []byte, key string) (int64, bool) {
	for line := range bytes.Lines(data) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(" "))
		if !ok || string(k) != key {
			continue
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// cgReadInt reads a single-value file such as pids.current or memory.peak.
// "max" reads as -1.
func cgReadInt(dir, name string) (int64, error) {
	data, err := cgRead(dir, name)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(data))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", filepath.Join(dir, name), err)
	}
	return n, nil
}

// cgIsCgroup2 reports whether dir is on a cgroup2 filesystem.
func cgIsCgroup2(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC
}

// cgSubdirs lists the child cgroups of dir (directories only).
func cgSubdirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// cgRemoveTree removes the cgroup dir and every child cgroup below it,
// deepest first. A missing dir is not an error; a populated one is (EBUSY).
func cgRemoveTree(dir string) error {
	subs, err := cgSubdirs(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, s := range subs {
		if err := cgRemoveTree(filepath.Join(dir, s)); err != nil {
			return err
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("rmdir %s: %w", dir, err)
	}
	return nil
}
