//go:build 386 || arm

package shim

import "golang.org/x/sys/unix"

// The 32-bit id calls (the plain ones take 16-bit ids here).
const (
	sysSetuid = unix.SYS_SETUID32
	sysSetgid = unix.SYS_SETGID32
)
