package reactor

import (
	"os"
	"path/filepath"
)

// The workspace layout, defined once: the reactor makes and deletes
// workspaces, and corrald's start-up sweeps what an earlier run left.

// WorkspaceRoot is the directory that holds every execution's workspace:
// <stateDir>/work.
func WorkspaceRoot(stateDir string) string { return filepath.Join(stateDir, "work") }

// WorkspaceDir is the workspace of execution id: <stateDir>/work/<id>.
func WorkspaceDir(stateDir, id string) string { return filepath.Join(WorkspaceRoot(stateDir), id) }

// makeWorkspace creates <stateDir>/work/<id>, mode 0700, owned by the run-as
// user.
func makeWorkspace(stateDir, id string, ra runAs) (string, error) {
	if err := os.MkdirAll(WorkspaceRoot(stateDir), 0o711); err != nil {
		return "", err
	}
	dir := WorkspaceDir(stateDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Chown(dir, int(ra.uid), int(ra.gid)); err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

// removeWorkspace deletes a workspace. os.RemoveAll works with *at
// syscalls relative to directory fds and never follows symlinks (it
// unlinks them), and the daemon's CAP_DAC_OVERRIDE lets it remove
// read-only subdirectories. There is deliberately no chmod-and-retry
// fallback: a chmod by path could follow a symlink a surviving process
// swapped in.
func removeWorkspace(dir string) error {
	return os.RemoveAll(dir)
}
