package harness

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// openConsole opens a pseudo-terminal pair for systemd's /dev/console.
// PID 1 systemd always reopens /dev/console for its own log, even in a
// container, and refuses a console that is not a tty; without a pty of our
// own it would write to the host's console. The caller owns both files and
// must keep reading master (copyConsole) or systemd blocks on its log.
//
// The caller also keeps the returned slave open until systemd is gone: a
// master whose slave was never opened (or all of whose slaves are closed)
// reads EIO, the copier would stop and close the master, and every later open
// of the slave fails with EIO, which systemd retries for a second per log
// line (a 30 s boot).
func openConsole() (master, slave *os.File, ptsPath string, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, "", fmt.Errorf("open console pty: %w", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, "", fmt.Errorf("unlock console pty: %w", os.NewSyscallError("ioctl TIOCSPTLCK", err))
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		m.Close()
		return nil, nil, "", fmt.Errorf("console pty number: %w", os.NewSyscallError("ioctl TIOCGPTN", err))
	}
	// No "\r\n" translation or echo in the log file.
	if t, err := unix.IoctlGetTermios(fd, unix.TCGETS); err == nil {
		t.Oflag &^= unix.OPOST
		t.Lflag &^= unix.ECHO | unix.ICANON
		_ = unix.IoctlSetTermios(fd, unix.TCSETS, t)
	}
	ptsPath = fmt.Sprintf("/dev/pts/%d", n)
	sl, err := os.OpenFile(ptsPath, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		m.Close()
		return nil, nil, "", fmt.Errorf("open console pty slave: %w", err)
	}
	return m, sl, ptsPath, nil
}

// copyConsole copies the console's output to w until the last slave side
// closes (read returns EIO), then closes master. Run it in its own goroutine.
func copyConsole(master *os.File, w io.Writer, done chan<- struct{}) {
	defer close(done)
	defer master.Close()
	_, _ = io.Copy(w, master)
}
