// Command corral-shim is the small program corrald starts each child
// through: it holds the child until its scope exists, sets up the user,
// groups, no_new_privs, directory, rlimits and network namespace the
// request asks for, and execs the command (package shim). corrald finds it
// next to its own binary, or takes --shim; without it corrald re-executes
// itself, which works the same but starts slower (every shim would run
// corrald's package initialisation).
//
// It is not meant to be run by hand.
package main

import (
	"fmt"
	"os"

	"github.com/corral-dev/corral/shim"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == shim.Arg {
		shim.Main() // never returns
	}
	fmt.Fprintln(os.Stderr, "corral-shim: started by corrald for each command; not meant to be run by hand")
	os.Exit(2)
}
