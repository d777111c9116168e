package eventloop

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func runLoop(t *testing.T) (*Loop, context.CancelFunc) {
	t.Helper()
	l, err := New()
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
		l.Close()
	})
	return l, cancel
}

// do runs f on the loop and waits for it.
func do(t *testing.T, l *Loop, f func()) {
	t.Helper()
	ch := make(chan struct{})
	if err := l.Post(func() { f(); close(ch) }); err != nil {
		t.Fatalf("Post() = %v", err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("posted function did not run")
	}
}

func TestPostOrderFromManyGoroutines(t *testing.T) {
	l, _ := runLoop(t)
	const writers, each = 8, 1000
	var wg sync.WaitGroup
	got := make([][]int, writers) // loop goroutine only
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				i := i
				if err := l.Post(func() { got[w] = append(got[w], i) }); err != nil {
					t.Errorf("Post() = %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	do(t, l, func() {
		for w := range got {
			if len(got[w]) != each {
				t.Errorf("writer %d: %d posts ran, want %d", w, len(got[w]), each)
			}
			for i, v := range got[w] {
				if v != i {
					t.Errorf("writer %d: post %d ran as %d: order lost", w, i, v)
					break
				}
			}
		}
	})
}

func TestTimersFireInOrderAndStop(t *testing.T) {
	l, _ := runLoop(t)
	var fired []string
	done := make(chan struct{})
	start := time.Now()
	do(t, l, func() {
		l.AfterFunc(30*time.Millisecond, func() { fired = append(fired, "b") })
		l.AfterFunc(10*time.Millisecond, func() { fired = append(fired, "a") })
		stopped := l.AfterFunc(20*time.Millisecond, func() { fired = append(fired, "stopped") })
		if !l.StopTimer(stopped) {
			t.Error("StopTimer(pending) = false, want true")
		}
		if l.StopTimer(stopped) {
			t.Error("StopTimer(stopped) = true, want false")
		}
		l.AfterFunc(40*time.Millisecond, func() { close(done) })
	})
	<-done
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Errorf("last timer fired after %v, want >= 40ms", el)
	}
	do(t, l, func() {
		if len(fired) != 2 || fired[0] != "a" || fired[1] != "b" {
			t.Errorf("fired = %v, want [a b]", fired)
		}
	})
}

func TestFdReadableAndRemove(t *testing.T) {
	l, _ := runLoop(t)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	got := make(chan string, 1)
	do(t, l, func() {
		err := l.Add(p[0], Readable, func(ev Events) {
			buf := make([]byte, 16)
			n, _ := unix.Read(p[0], buf)
			got <- string(buf[:n])
			if err := l.Remove(p[0]); err != nil {
				t.Errorf("Remove() = %v", err)
			}
		})
		if err != nil {
			t.Errorf("Add() = %v", err)
		}
		if err := l.Add(p[0], Readable, func(Events) {}); err == nil {
			t.Error("second Add of the same fd succeeded")
		}
	})
	unix.Write(p[1], []byte("hi"))
	select {
	case s := <-got:
		if s != "hi" {
			t.Errorf("read %q, want hi", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler not called")
	}
	do(t, l, func() {
		if n := l.Registered(); n != 0 {
			t.Errorf("Registered() = %d after Remove, want 0", n)
		}
	})
}

// An event for an fd that an earlier handler removed must not run its old
// handler, whether it was fetched in the same round or not.
func TestEventForRemovedFdDropped(t *testing.T) {
	l, _ := runLoop(t)
	var a, b [2]int
	unix.Pipe2(a[:], unix.O_CLOEXEC|unix.O_NONBLOCK)
	unix.Pipe2(b[:], unix.O_CLOEXEC|unix.O_NONBLOCK)
	t.Cleanup(func() {
		for _, fd := range []int{a[0], a[1], b[0], b[1]} {
			unix.Close(fd)
		}
	})
	calls := make(chan int, 10)
	do(t, l, func() {
		// Whichever of the two runs first removes the other: the second's
		// event in the same round must be dropped.
		l.Add(a[0], Readable, func(Events) {
			calls <- a[0]
			l.Remove(b[0])
			l.Remove(a[0])
		})
		l.Add(b[0], Readable, func(Events) {
			calls <- b[0]
			l.Remove(a[0])
			l.Remove(b[0])
		})
	})
	unix.Write(a[1], []byte("x"))
	unix.Write(b[1], []byte("x"))
	time.Sleep(50 * time.Millisecond)
	do(t, l, func() {})
	if n := len(calls); n != 1 {
		t.Errorf("%d handlers ran, want 1 (the other was removed in the same round)", n)
	}
}

func TestPostAfterCloseFails(t *testing.T) {
	l, err := New()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if err := l.Post(func() {}); err != ErrClosed {
		t.Errorf("Post after Close = %v, want ErrClosed", err)
	}
}

// A goroutine that a round of the loop made runnable runs before the loop
// blocks in epoll_wait again, even with one P: the loop yields its thread
// first. Without the yield the goroutine waits on the loop's P until sysmon
// takes it back from the system call (0 of the rounds). With it, nearly
// every round: the yielded loop goes to the global run queue, which the
// scheduler serves first once in 61 of its ticks (schedtick%61), so about
// 1 round in 61 the loop runs on first; hence a share, not every round.
func TestReadiedGoroutineRunsBeforeTheLoopBlocks(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var (
		ran    atomic.Int64 // the last round whose goroutine ran
		round  atomic.Int64
		armed  atomic.Bool
		atWait = make(chan bool, 1)
	)
	beforeWait = func() {
		if armed.CompareAndSwap(true, false) {
			atWait <- ran.Load() == round.Load()
		}
	}
	t.Cleanup(func() { beforeWait = nil }) // after the loop stopped: cleanups run last first
	l, cancel := runLoop(t)
	defer cancel()
	do(t, l, func() {}) // the loop is running
	const rounds = 200
	first := 0
	for i := int64(1); i <= rounds; i++ {
		round.Store(i)
		if err := l.Post(func() {
			go func() { ran.Store(i) }()
			armed.Store(true)
		}); err != nil {
			t.Fatalf("Post() = %v", err)
		}
		select {
		case r := <-atWait:
			if r {
				first++
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the loop did not wait again within 5 s")
		}
	}
	t.Logf("the goroutine ran first in %d of %d rounds", first, rounds)
	if first < rounds*9/10 {
		t.Errorf("in %d of %d rounds the goroutine the loop's round started ran before the loop went back to epoll_wait, want at least 90%%", first, rounds)
	}
}
