package reactor

// The child's environment and the lookup of its command with the child's
// PATH, not the daemon's.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// defaultPath is the child's PATH unless the request sets one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// childEnv is the child's whole environment: a minimal base for the run-as
// user plus the request's variables. Nothing of the daemon's leaks.
func childEnv(req map[string]string, ra runAs) []string {
	base := map[string]string{
		"PATH":    defaultPath,
		"HOME":    ra.home,
		"USER":    ra.name,
		"LOGNAME": ra.name,
		"LANG":    "C.UTF-8",
	}
	for k, v := range req {
		base[k] = v
	}
	env := make([]string, 0, len(base))
	for k, v := range base {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return kv[len(key)+1:]
		}
	}
	return ""
}

// lookPath resolves argv0 with the child's PATH (not the daemon's); a name
// with a slash is taken relative to the child's working directory.
func lookPath(argv0, dir, pathEnv string) (string, error) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := executable(p); err != nil {
			return "", fmt.Errorf("exec %q: %w", argv0, err)
		}
		return p, nil
	}
	var firstErr error
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, argv0)
		err := executable(p)
		if err == nil {
			return p, nil
		}
		if firstErr == nil && !errors.Is(err, syscall.ENOENT) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return "", fmt.Errorf("exec %q: %w", argv0, firstErr)
	}
	return "", fmt.Errorf("exec %q: not found in PATH: %w", argv0, syscall.ENOENT)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return pe.Err
		}
		return err
	}
	if fi.IsDir() {
		return syscall.EACCES
	}
	if fi.Mode()&0o111 == 0 {
		return syscall.EACCES
	}
	return nil
}
