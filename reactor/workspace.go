package reactor

import "path/filepath"

// The workspace layout, defined once: the reactor makes and deletes
// workspaces, and corrald's start-up sweeps what an earlier run left.

// WorkspaceRoot is the directory that holds every execution's workspace:
// <stateDir>/work.
func WorkspaceRoot(stateDir string) string { return filepath.Join(stateDir, "work") }

// WorkspaceDir is the workspace of execution id: <stateDir>/work/<id>.
func WorkspaceDir(stateDir, id string) string { return filepath.Join(WorkspaceRoot(stateDir), id) }
