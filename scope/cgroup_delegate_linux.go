package scope

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

// controllerFS is the slice of the cgroup filesystem enableControllers needs, so
// tests can play a pure v2 host with controllers.
type controllerFS interface {
	Read(dir, name string) ([]byte, error)
	Write(dir, name, value string) error
	Mkdir(dir string) error // EEXIST is not an error
}

type realControllerFS struct{}

func (realControllerFS) Read(dir, name string) ([]byte, error) { return cgroupv2.Dir(dir).Read(name) }
func (realControllerFS) Write(dir, name, value string) error {
	return cgroupv2.Dir(dir).Write(name, value)
}
func (realControllerFS) Mkdir(dir string) error {
	if err := unix.Mkdir(dir, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return os.NewSyscallError("mkdir", err)
	}
	return nil
}

// enableControllers enables the wanted controllers the host offers in
// cgroup.subtree_control of every cgroup from the daemon's own (ownDir) down
// to base, so that base's children get them. When base is not inside ownDir
// it touches base only. It returns the controllers the children of base get.
//
// The "no internal processes" rule of cgroup v2: a non-root cgroup that holds
// processes cannot enable controllers for its children (the write fails with
// EBUSY). The daemon's own cgroup holds the daemon, so on EBUSY there the
// daemon moves itself into the leaf <own>/supervisor and tries again. That
// only moves the daemon's process; if other processes share its cgroup, the
// controllers stay off and the failure is logged.
func enableControllers(fs controllerFS, ownDir, base string, pid int, log zerolog.Logger) map[string]bool {
	chain := []string{base}
	if rel, err := filepath.Rel(ownDir, base); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		chain = []string{ownDir}
		if rel != "." {
			d := ownDir
			for _, part := range strings.Split(rel, "/") {
				d = filepath.Join(d, part)
				chain = append(chain, d)
			}
		}
	}
	moved := false
	want := slices.Clone(wantedControllers)
	for _, dir := range chain {
		avail := fieldSet(fs.Read(dir, "cgroup.controllers"))
		on := fieldSet(fs.Read(dir, "cgroup.subtree_control"))
		var next []string
		for _, c := range want {
			if !avail[c] {
				continue
			}
			if on[c] {
				next = append(next, c)
				continue
			}
			err := fs.Write(dir, "cgroup.subtree_control", "+"+c)
			if errors.Is(err, unix.EBUSY) && dir == ownDir && !moved {
				moved = true
				leaf := filepath.Join(ownDir, supervisorLeaf)
				if merr := moveInto(fs, leaf, pid); merr != nil {
					log.Warn().Err(merr).Str("cgroup", leaf).Msg("cannot move the daemon into a leaf cgroup; controllers stay off")
				} else {
					log.Info().Str("cgroup", leaf).Msg("moved the daemon into a leaf cgroup so its own cgroup can delegate controllers")
					err = fs.Write(dir, "cgroup.subtree_control", "+"+c)
				}
			}
			if err != nil {
				log.Warn().Err(err).Str("cgroup", dir).Str("controller", c).Msg("cannot enable controller for scopes")
				continue
			}
			next = append(next, c)
		}
		want = next
	}
	// The truth is what base now delegates.
	on := fieldSet(fs.Read(base, "cgroup.subtree_control"))
	got := map[string]bool{}
	for _, c := range wantedControllers {
		if on[c] {
			got[c] = true
		}
	}
	return got
}

func moveInto(fs controllerFS, leaf string, pid int) error {
	if err := fs.Mkdir(leaf); err != nil {
		return err
	}
	return fs.Write(leaf, "cgroup.procs", strconv.Itoa(pid))
}

// fieldSet splits a space-separated controller list into a set; a read
// error gives the empty set.
func fieldSet(data []byte, err error) map[string]bool {
	set := map[string]bool{}
	if err != nil {
		return set
	}
	for _, f := range strings.Fields(string(data)) {
		set[f] = true
	}
	return set
}
