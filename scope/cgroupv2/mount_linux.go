package cgroupv2

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Mount is one line of /proc/self/mountinfo that matters here.
type Mount struct {
	Root      string // root of the mount within its filesystem
	Point     string // mount point
	FSType    string // "cgroup2", "cgroup", "tmpfs", ...
	SuperOpts string // per-superblock options: a v1 hierarchy's controllers ("rw,cpuacct", "rw,name=systemd")
}

// ParseMountinfo returns the mounts listed in a /proc/self/mountinfo text.
// Lines it cannot parse are skipped.
func ParseMountinfo(data []byte) []Mount {
	var out []Mount
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
		m := Mount{Root: unescapeMount(fields[3]), Point: unescapeMount(fields[4]), FSType: fields[sep+1]}
		if sep+3 < len(fields) {
			m.SuperOpts = fields[sep+3]
		}
		out = append(out, m)
	}
	return out
}

// unescapeMount undoes the octal escapes (\040 for a space, ...) the kernel
// uses in mountinfo paths.
func unescapeMount(s string) string {
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

// FindUnified chooses the cgroup2 mount to use: /sys/fs/cgroup on a pure v2
// host, /sys/fs/cgroup/unified on a hybrid one, else the first cgroup2
// mount. It returns false when there is none.
func FindUnified(mounts []Mount) (Mount, bool) {
	var found []Mount
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
	return Mount{}, false
}

// Mode names the host's cgroup layout from its mounts: "v2" when
// /sys/fs/cgroup is cgroup2, "hybrid" when v1 hierarchies and a cgroup2
// mount coexist, "v1" when there are only v1 hierarchies, "" when there is
// no cgroup filesystem at all.
func Mode(mounts []Mount) string {
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

// ParseOwn returns the cgroup v2 path (the "0::" line) of a
// /proc/<pid>/cgroup text.
func ParseOwn(data []byte) (string, bool) {
	for line := range bytes.Lines(data) {
		if rest, ok := bytes.CutPrefix(bytes.TrimRight(line, "\n"), []byte("0::")); ok {
			return string(rest), true
		}
	}
	return "", false
}

// Dir returns the directory of cgroup cg in this mount. cg is a path as
// /proc/<pid>/cgroup or systemd's ControlGroup property gives it: relative
// to the root of the cgroup namespace, which is the mount's root for a
// mount made inside that namespace; a mount whose root is a subtree is
// accounted for. It fails when the mount is absent (zero Mount) or cg lies
// outside what it shows.
func (m Mount) Dir(cg string) (string, error) {
	if m.Point == "" {
		return "", errors.New("cgroup hierarchy not mounted")
	}
	if strings.HasPrefix(cg, "/..") {
		// A cgroup outside our namespace shows as "/../..."; we cannot reach it.
		return "", fmt.Errorf("cgroup %q is outside this cgroup namespace", cg)
	}
	rel := path.Clean("/" + cg)
	if root := path.Clean("/" + m.Root); root != "/" {
		r, ok := strings.CutPrefix(rel, root)
		if !ok || (r != "" && r[0] != '/') {
			return "", fmt.Errorf("cgroup %q is outside the mount %s (root %q)", cg, m.Point, m.Root)
		}
		rel = r
	}
	return filepath.Join(m.Point, rel), nil
}
