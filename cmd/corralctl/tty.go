package main

// `corralctl run -t`: the local side of a terminal execution. When our own
// stdin is a terminal and input is forwarded (-i), it is put in raw mode
// for the run, so every key (Ctrl-C, Ctrl-D, Ctrl-Z included) goes to the
// command's terminal as a byte, and restored on every way out: a normal
// return, an error, a signal (handled, so the restore runs), a panic (the
// deferred restore). Window-size changes (SIGWINCH) become exec.resize.
// Raw mode is done with golang.org/x/sys (TCGETS/TCSETS, as cfmakeraw(3)):
// a dozen lines, not worth a dependency.

import (
	"context"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// fdOf returns the descriptor behind r or w when it is an *os.File.
func fdOf(x any) (int, bool) {
	f, ok := x.(*os.File)
	if !ok || f == nil {
		return -1, false
	}
	return int(f.Fd()), true
}

// isTerminal reports whether fd is a terminal.
func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// termSize returns fd's window size.
func termSize(fd int) (api.TTYSize, bool) {
	ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
	if err != nil || ws.Row == 0 || ws.Col == 0 {
		return api.TTYSize{}, false
	}
	return api.TTYSize{Rows: int(ws.Row), Cols: int(ws.Col)}, true
}

// makeRaw puts terminal fd in raw mode and returns the function that
// restores its previous modes (safe to call more than once).
func makeRaw(fd int) (func(), error) {
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, os.NewSyscallError("ioctl(TCGETS)", err)
	}
	raw := *old
	// cfmakeraw(3).
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN] = 1
	raw.Cc[unix.VTIME] = 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, os.NewSyscallError("ioctl(TCSETS)", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) })
	}, nil
}

// localTerminal is what run -t found and changed on corralctl's side.
type localTerminal struct {
	fd      int    // our stdin, when it is a terminal; else -1
	restore func() // undoes raw mode; a no-op when none was set
}

// setupTerminal inspects our stdin for run -t: the size to start the
// command's terminal with, and raw mode when input is forwarded.
func setupTerminal(e *env, forward bool) (*localTerminal, *api.TTYSize, error) {
	lt := &localTerminal{fd: -1, restore: func() {}}
	fd, ok := fdOf(e.stdin)
	if !ok || !isTerminal(fd) {
		if ofd, ok := fdOf(e.stdout); ok {
			if sz, ok := termSize(ofd); ok {
				return lt, &sz, nil
			}
		}
		return lt, nil, nil
	}
	lt.fd = fd
	var size *api.TTYSize
	if sz, ok := termSize(fd); ok {
		size = &sz
	}
	if forward {
		restore, err := makeRaw(fd)
		if err != nil {
			return nil, nil, err
		}
		lt.restore = restore
	}
	return lt, size, nil
}

// forwardResize sends our window size to the execution's terminal on every
// signal from winch, until ctx ends.
func forwardResize(ctx context.Context, c *ipc.Client, id string, fd int, winch <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-winch:
			if sz, ok := termSize(fd); ok {
				_, _ = c.Resize(ctx, api.ResizeParams{ID: id, Rows: sz.Rows, Cols: sz.Cols})
			}
		}
	}
}

// forwardTerminalInput types r into the execution's terminal with
// exec.write until r ends, then types end-of-file (close). A terminal takes
// a bounded amount at a time: the rest is retried until it is taken.
func forwardTerminalInput(ctx context.Context, c *ipc.Client, id string, r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		data := buf[:n]
		for len(data) > 0 {
			w, werr := c.Write(ctx, api.WriteParams{ID: id, Data: data})
			if werr != nil {
				return
			}
			data = data[w.Written:]
			if w.Written == 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
		if err != nil {
			_, _ = c.Write(ctx, api.WriteParams{ID: id, Close: true})
			return
		}
	}
}
