package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/shim"
)

// shimName is the shim program's file name, looked for next to corrald.
const shimName = "corral-shim"

// pinShim chooses what corrald starts its children through and pins it.
// flag is --shim: "" looks for corral-shim next to corrald's own binary
// and falls back to re-executing corrald when there is none (or it is not
// safe to run); "self" always re-executes corrald; anything else is a path
// that must be usable. The file is opened once, here, and the children
// exec that open file (shim.UseBinary), so replacing it on disk later has
// no effect until corrald restarts. It returns what daemon.info reports.
func pinShim(flag string, log zerolog.Logger) (string, error) {
	path, explicit := flag, flag != ""
	switch flag {
	case "self":
		return "self", nil
	case "":
		exe, err := os.Executable()
		if err != nil {
			log.Warn().Err(err).Msg("cannot find corrald's own binary; children start through corrald itself")
			return "self", nil
		}
		path = filepath.Join(filepath.Dir(exe), shimName)
	}
	f, err := openShim(path)
	if err != nil {
		if explicit {
			return "", fmt.Errorf("--shim %s: %w", path, err)
		}
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn().Err(err).Str("shim", path).Msg("not using corral-shim; children start through corrald itself (slower)")
		}
		return "self", nil
	}
	err = shim.UseBinary(f, func(err error) {
		// A bug elsewhere in corrald: something closed a descriptor it did
		// not own. Name it, so that the start that follows is not the
		// first sign of it (EACCES from exec /proc/self/fd/N).
		log.Error().Err(err).Str("shim", path).Msg("pinned corral-shim lost")
	})
	f.Close() // UseBinary keeps its own descriptor
	if err != nil {
		return "", err
	}
	log.Info().Str("shim", path).Msg("children start through corral-shim")
	return path, nil
}

// openShim opens path for exec and checks it as sudo checks what it runs
// as root: a regular, executable file that only root can change (owned by
// root, not writable by group or others), since every child starts
// through it with root's rights before dropping to its user.
func openShim(path string) (*os.File, error) {
	if !filepath.IsAbs(path) {
		return nil, errors.New("not an absolute path")
	}
	f, err := os.Open(path) // close-on-exec, as every fd os opens
	if err != nil {
		// The caller names the path: keep only the reason (which
		// errors.Is still matches against os.ErrNotExist).
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, pe.Err
		}
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, os.NewSyscallError("fstat", err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = errors.New("not a regular file")
	case st.Mode&0o111 == 0:
		err = errors.New("not executable")
	case os.Geteuid() == 0 && st.Uid != 0:
		err = fmt.Errorf("owned by uid %d, not root", st.Uid)
	case os.Geteuid() == 0 && st.Mode&0o022 != 0:
		err = fmt.Errorf("writable by group or others (mode %#o)", st.Mode&0o777)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
