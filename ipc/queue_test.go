package ipc

import (
	"bytes"
	"testing"
)

// A push onto an idle queue is written at once; what the socket does not
// take, and everything pushed while anything is queued or being written,
// goes through the writer in order.
func TestOutQueueDirectWriteKeepsOrder(t *testing.T) {
	var wire bytes.Buffer
	room := 1 << 20 // bytes the fake socket takes now
	q := newOutQueue(16, 1<<20)
	q.direct = func(b []byte) int {
		n := min(len(b), room)
		wire.Write(b[:n])
		room -= n
		return n
	}
	q.pushResponse([]byte("A\n"))
	if wire.String() != "A\n" {
		t.Fatalf("idle queue: wire %q, want the response written at once", wire.String())
	}
	room = 2
	q.pushNote([]byte("BBBB\n")) // the socket takes "BB"
	q.pushResponse([]byte("C\n"))
	room = 1 << 20
	q.pushNote([]byte("D\n")) // queued: something is waiting
	if wire.String() != "A\nBB" {
		t.Fatalf("wire %q, want %q: nothing written past a queued remainder", wire.String(), "A\nBB")
	}
	for i, want := range []string{"BB\n", "C\n", "D\n", "E\n"} {
		it, ok := q.pop()
		if !ok || string(it.b) != want {
			t.Fatalf("pop: %q %v, want %q", it.b, ok, want)
		}
		if i == 0 {
			q.pushResponse([]byte("E\n")) // while the writer writes: queued, last
		}
		wire.Write(it.b)
		q.written()
	}
	q.pushResponse([]byte("F\n")) // idle again: direct
	if got, want := wire.String(), "A\nBBBB\nC\nD\nE\nF\n"; got != want {
		t.Fatalf("wire %q, want %q", got, want)
	}
	if q.responses != 0 || q.notes != 0 || q.noteBytes != 0 {
		t.Fatalf("counts after everything was written: %d responses, %d notes, %d note bytes", q.responses, q.notes, q.noteBytes)
	}
}
