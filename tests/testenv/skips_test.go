package testenv

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// skipCall is a call of testing's Skip, Skipf or SkipNow on a test's t, tb
// or b.
var skipCall = regexp.MustCompile(`\b(t|tb|b)\.Skip(f|Now)?\(`)

// notEnvironment marks a plain skip that is not about the machine
// (testing.Short, an opt-in, a fuzz input out of range).
const notEnvironment = "// not an environment skip"

// TestEverySkipGoesThroughTestenv keeps CORRAL_STRICT=1 meaningful: a skip
// that bypassed Skip would let CI pass with a suite unrun.
func TestEverySkipGoesThroughTestenv(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && p != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || filepath.Base(filepath.Dir(p)) == "testenv" {
			return nil // this package's own Skip is the one allowed
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			for range skipCall.FindAllString(line, -1) {
				if strings.Contains(line, notEnvironment) {
					continue
				}
				t.Errorf("%s:%d: %s: an environment skip goes through testenv.Skip (or mark the line %q)", p, i+1, strings.TrimSpace(line), notEnvironment)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEveryPackageChecksLeaks: every package with tests has a TestMain that
// runs them through Main (directly, or inside a harness systemd through
// harness.RunInside or harness.RunInsideWithBinaries, which ends in it),
// so that no test package leaks fds or goroutines unseen.
func TestEveryPackageChecksLeaks(t *testing.T) {
	root := filepath.Join("..", "..")
	tests := map[string][]byte{} // directory -> its _test.go files, concatenated
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && p != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		tests[filepath.Dir(p)] = append(tests[filepath.Dir(p)], b...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, src := range tests {
		s := string(src)
		own := filepath.Base(dir) == "testenv" && strings.Contains(s, "os.Exit(Main(m))")
		if !strings.Contains(s, "func TestMain(") || !(own || strings.Contains(s, "testenv.Main(") || strings.Contains(s, "harness.RunInside(") || strings.Contains(s, "harness.RunInsideWithBinaries(")) {
			t.Errorf("%s: no TestMain running the tests through testenv.Main, harness.RunInside or harness.RunInsideWithBinaries", dir)
		}
	}
}
