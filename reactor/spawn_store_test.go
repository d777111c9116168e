package reactor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
	"github.com/corral-dev/corral/tests/testenv"
)

// slowFailingStore delays every Create and then fails it: spawn prepares
// the workspace and pipes while the store commits, and must start nothing
// when the commit fails.
type slowFailingStore struct {
	*store.Memory
}

func (s slowFailingStore) Create(api.Record, []byte) <-chan error {
	ch := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		ch <- errors.New("disk full")
	}()
	return ch
}

// TestCreateNotDurableNothingStarts: when the created record cannot be
// stored, exec.start fails with an internal error, the command never ran,
// and the workspace and pipes made meanwhile are gone.
func TestCreateNotDurableNothingStarts(t *testing.T) {
	testenv.CheckFDs(t) // no pipe made meanwhile is left open
	stateDir := t.TempDir()
	tr := newTestReactor(t, func(c *Config) {
		c.Store = slowFailingStore{store.NewMemory()}
		c.StateDir = stateDir
	})
	marker := filepath.Join(t.TempDir(), "ran")
	for _, p := range []api.StartParams{
		{Argv: []string{"/bin/sh", "-c", "touch " + marker}},
		{Argv: []string{"/bin/sh", "-c", "touch " + marker}, Stdin: []byte("x")},
		{Argv: []string{"no-such-command-corral"}}, // would be a failed start
	} {
		_, err := tr.Start(context.Background(), root, p)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeInternal {
			t.Errorf("Start(%v) = %v, want an internal error", p.Argv, err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran although its record was never stored")
	}
	if ents, _ := os.ReadDir(WorkspaceRoot(stateDir)); len(ents) != 0 {
		t.Errorf("workspaces left: %d", len(ents))
	}
}
