//go:build !(386 || arm)

package shim

import "golang.org/x/sys/unix"

// setuid(2) and setgid(2) take 32-bit ids here.
const (
	sysSetuid = unix.SYS_SETUID
	sysSetgid = unix.SYS_SETGID
)
