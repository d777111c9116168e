package sysfile

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestReadIsReadFile: Read gives what os.ReadFile gives, bytes and errors:
// a file past Read's first buffer whole, an empty one, /proc files, and
// the same *os.PathError for a missing file and a directory.
func TestReadIsReadFile(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("abcdefghijklmnopqrstuvwxyz", 2700) // 70200 bytes
	for name, data := range map[string]string{"long": long, "empty": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// status changes between two reads only in its values: compare the
	// names of its lines.
	names := func(b []byte) string {
		var n []string
		for _, l := range strings.Split(string(b), "\n") {
			n = append(n, strings.SplitN(l, ":", 2)[0])
		}
		return strings.Join(n, ",")
	}
	same := func(b []byte) string { return string(b) }
	for _, tc := range []struct {
		path string
		key  func([]byte) string
	}{
		{filepath.Join(dir, "long"), same},
		{filepath.Join(dir, "empty"), same},
		{"/proc/self/status", names},
		{"/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/children", same},
	} {
		got, err := Read(tc.path)
		want, werr := os.ReadFile(tc.path)
		if err != nil || werr != nil || tc.key(got) != tc.key(want) {
			t.Errorf("Read(%s) = %d bytes, %v; os.ReadFile %d bytes, %v", tc.path, len(got), err, len(want), werr)
		}
	}
	for _, tc := range []struct {
		path string
		op   string
		is   error
	}{
		{filepath.Join(dir, "missing"), "open", os.ErrNotExist},
		{dir, "read", nil}, // EISDIR comes from read(2), as in os.ReadFile
	} {
		_, err := Read(tc.path)
		_, werr := os.ReadFile(tc.path)
		var pe *os.PathError
		if !errors.As(err, &pe) || pe.Op != tc.op || werr == nil || err.Error() != werr.Error() {
			t.Errorf("Read(%s) = %v; want a *os.PathError of %s, as os.ReadFile's %v", tc.path, err, tc.op, werr)
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("Read(%s) = %v; want errors.Is %v", tc.path, err, tc.is)
		}
	}
}
