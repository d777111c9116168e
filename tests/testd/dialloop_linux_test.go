package testd

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestDialLoop: with no socket file every attempt counts as refused; with a
// listener none does; stop called again reports the same.
func TestDialLoop(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	stop := DialLoop(t, sock)
	time.Sleep(50 * time.Millisecond)
	tries, refused := stop()
	if tries == 0 || refused != tries {
		t.Errorf("DialLoop on a missing socket = %d tries, %d refused; want every try refused", tries, refused)
	}
	if t2, r2 := stop(); t2 != tries || r2 != refused {
		t.Errorf("stop() again = %d, %d; want %d, %d", t2, r2, tries, refused)
	}

	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	stop = DialLoop(t, sock)
	time.Sleep(50 * time.Millisecond)
	if tries, refused := stop(); tries == 0 || refused != 0 {
		t.Errorf("DialLoop on a listening socket = %d tries, %d refused; want some tries, none refused", tries, refused)
	}
}
