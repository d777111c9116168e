// Command goholder is the Go variant of scope_holder.c for the bound of
// corral's benchmark (f): a Go process (as corrald's pooled shim is)
// blocked in a read of stdin that, given one byte, execs /bin/true
// (syscall.Exec: the kernel ends the runtime's other threads first).
// stdin closed without a byte makes it exit 3 without exec. Built by the
// suite with go build (CGO_ENABLED=0).
package main

import (
	"os"
	"syscall"
)

func main() {
	var b [1]byte
	if n, _ := os.Stdin.Read(b[:]); n != 1 {
		os.Exit(3)
	}
	_ = syscall.Exec("/bin/true", []string{"/bin/true"}, os.Environ())
	os.Exit(127)
}
