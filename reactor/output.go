package reactor

import "github.com/corral-dev/corral/api"

// keptOutput keeps the first and the last limit/2 bytes of a stream and
// counts everything; the bytes in between are dropped. Memory is bounded by
// limit whatever the child writes. Owned by the loop goroutine.
type keptOutput struct {
	half  int    // bytes kept at each end
	head  []byte // bytes [0, len(head)) of the stream
	tail  []byte // ring of the last bytes, capacity half
	tpos  int    // next write position in tail once it is full
	total int64  // bytes written to the stream
	// lost: bytes the child wrote are missing from what is kept and not
	// counted in total (a spool abandoned before a crash of corrald, a
	// read back that failed): the stream is truncated whatever total says.
	lost bool
}

func newKeptOutput(limit int64) *keptOutput {
	half := int(limit / 2)
	return &keptOutput{half: half}
}

// write appends p to the stream.
func (k *keptOutput) write(p []byte) {
	k.total += int64(len(p))
	if room := k.half - len(k.head); room > 0 {
		n := min(room, len(p))
		if k.head == nil {
			k.head = make([]byte, 0, min(k.half, max(n, 4096)))
		}
		k.head = append(k.head, p[:n]...)
		p = p[n:]
	}
	if len(p) == 0 || k.half == 0 {
		return
	}
	if len(p) >= k.half {
		// The chunk alone fills the tail.
		if cap(k.tail) < k.half {
			k.tail = make([]byte, k.half)
		}
		k.tail = k.tail[:k.half]
		copy(k.tail, p[len(p)-k.half:])
		k.tpos = 0
		return
	}
	if len(k.tail) < k.half {
		// Not full yet: grow linearly.
		room := k.half - len(k.tail)
		n := min(room, len(p))
		k.tail = append(k.tail, p[:n]...)
		p = p[n:]
		if len(p) == 0 {
			return
		}
	}
	// Full ring: overwrite the oldest bytes.
	for len(p) > 0 {
		n := copy(k.tail[k.tpos:], p)
		p = p[n:]
		k.tpos = (k.tpos + n) % k.half
	}
}

// tailCopy returns the tail in stream order in a slice of its own: what
// leaves the loop (the store's writer encodes it later) must not alias the
// ring, which the loop overwrites with the next output of a tree still
// writing.
func (k *keptOutput) tailCopy() []byte {
	if len(k.tail) == 0 {
		return nil
	}
	out := make([]byte, 0, len(k.tail))
	out = append(out, k.tail[k.tpos:]...)
	return append(out, k.tail[:k.tpos]...)
}

// tailBytes returns the tail in stream order; it may be the ring itself,
// valid until the next write (loop goroutine only).
func (k *keptOutput) tailBytes() []byte {
	if len(k.tail) < k.half || k.tpos == 0 {
		return k.tail
	}
	out := make([]byte, 0, len(k.tail))
	out = append(out, k.tail[k.tpos:]...)
	return append(out, k.tail[:k.tpos]...)
}

// tailOffset is the stream offset of the first tail byte.
func (k *keptOutput) tailOffset() int64 { return k.total - int64(len(k.tail)) }

func (k *keptOutput) kept() int64 { return int64(len(k.head) + len(k.tail)) }

func (k *keptOutput) truncated() bool { return k.total > k.kept() || k.lost }

func (k *keptOutput) info() api.StreamInfo {
	return api.StreamInfo{TotalBytes: k.total, KeptBytes: k.kept(), Truncated: k.truncated()}
}

// read returns up to limit kept bytes from offset. When offset lies in the
// dropped middle, gap is true and data starts at the first kept byte after
// it; start says where the data begins.
func (k *keptOutput) read(offset, limit int64) (data []byte, start int64, gap bool) {
	if offset < 0 {
		offset = 0
	}
	if offset >= k.total {
		return nil, k.total, false
	}
	headLen := int64(len(k.head))
	if offset < headLen {
		end := min(headLen, offset+limit)
		return append([]byte(nil), k.head[offset:end]...), offset, false
	}
	tOff := k.tailOffset()
	if offset < tOff {
		gap = true
		offset = tOff
	}
	tail := k.tailBytes()
	from := offset - tOff
	end := min(int64(len(tail)), from+limit)
	return append([]byte(nil), tail[from:end]...), offset, gap
}
