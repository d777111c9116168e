package testenv

import (
	"os"
	"testing"
)

// TestMain fails the package when fds or goroutines outlive the tests.
func TestMain(m *testing.M) { os.Exit(Main(m)) }
