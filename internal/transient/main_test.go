package transient

import (
	"os"
	"testing"

	"github.com/corral-dev/corral/tests/testenv"
)

// TestMain fails the package when fds or goroutines outlive the tests.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
