package main

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/corral-dev/corral/api"
)

// This file turns an execution's output into text for a model: a byte
// budget kept as head and tail with the dropped middle marked, cuts only at
// UTF-8 boundaries, and bytes that are not text shown as escapes or, when a
// piece is mostly binary, summarised.

// piece is a run of output bytes that starts at stream offset off.
type piece struct {
	off  int64
	data []byte
}

func (p piece) end() int64 { return p.off + int64(len(p.data)) }

// outputReader reads one stream of one execution; the MCP session passes
// its daemon client's exec.output.
type outputReader func(ctx context.Context, p api.OutputParams) (api.OutputResult, error)

// collect reads stream from offset from until it has max bytes or reaches
// the end of what is kept. Kept output has a dropped middle when it outgrew
// output_limit_bytes, so one call may stop at the head's end and the next
// answer start later (gap): each contiguous run is its own piece. It returns
// the pieces, the stream's total bytes at the last call and whether the
// stream has ended.
func collect(ctx context.Context, read outputReader, id, stream string, from, max int64) ([]piece, int64, bool, error) {
	var ps []piece
	var total int64
	cur, n := from, int64(0)
	for n < max {
		r, err := read(ctx, api.OutputParams{ID: id, Stream: stream, Offset: cur, Limit: max - n})
		if err != nil {
			return nil, 0, false, err
		}
		total = r.TotalBytes
		if len(r.Data) == 0 {
			return ps, total, r.EOF, nil
		}
		if k := len(ps); k > 0 && ps[k-1].end() == r.Offset {
			ps[k-1].data = append(ps[k-1].data, r.Data...)
		} else {
			ps = append(ps, piece{off: r.Offset, data: r.Data})
		}
		n += int64(len(r.Data))
		cur = r.NextOffset
		if r.EOF {
			return ps, total, true, nil
		}
	}
	return ps, total, false, nil
}

// streamText is one stream rendered for a tool result.
type streamText struct {
	text  string
	total int64 // the stream's total bytes when read
	next  int64 // offset after the last byte consumed (shown or omitted)
	eof   bool
}

// readBudgeted reads stream from offset from and renders at most budget
// bytes of it: all of it when it fits, else the first and last halves of
// the budget with "[... N bytes omitted ...]" between. Bytes the daemon
// itself dropped (its kept head and tail) are marked the same way.
func readBudgeted(ctx context.Context, read outputReader, id, stream string, from, budget int64) (streamText, error) {
	if budget < 64 {
		budget = 64
	}
	ps, total, eof, err := collect(ctx, read, id, stream, from, budget)
	if err != nil {
		return streamText{}, err
	}
	next := from
	if len(ps) > 0 {
		next = ps[len(ps)-1].end()
	}
	if next < total {
		// It did not fit: keep the first half, then read the last half.
		half := budget / 2
		ps = headOf(ps, half)
		tailFrom := max(total-(budget-half), from)
		if len(ps) > 0 {
			tailFrom = max(tailFrom, ps[len(ps)-1].end())
		}
		tps, t2, eof2, err := collect(ctx, read, id, stream, tailFrom, budget-half)
		if err != nil {
			return streamText{}, err
		}
		ps = append(ps, tps...)
		total, eof = max(total, t2), eof2
		if len(ps) > 0 {
			next = ps[len(ps)-1].end()
		}
	}
	if len(ps) > 0 && ps[0].off > from {
		// The session's offset fell in the daemon's dropped middle.
		ps = append([]piece{{off: from}}, ps...)
	}
	if !eof && len(ps) > 0 {
		// The writer may be in the middle of a character: leave its first
		// bytes for the next read rather than show them broken.
		last := &ps[len(ps)-1]
		last.data = last.data[:len(last.data)-partialRuneSuffix(last.data)]
		next = last.end()
	}
	return streamText{text: render(ps), total: total, next: next, eof: eof && next >= total}, nil
}

// headOf keeps the first n bytes of ps.
func headOf(ps []piece, n int64) []piece {
	var out []piece
	for _, p := range ps {
		if n <= 0 {
			break
		}
		if int64(len(p.data)) > n {
			p.data = p.data[:n]
		}
		out = append(out, p)
		n -= int64(len(p.data))
	}
	return out
}

// render joins pieces, marking the bytes between non-adjacent pieces as
// omitted. Each cut is moved to a character boundary first: a partial
// character before a cut or after it is counted as omitted, not shown.
func render(ps []piece) string {
	norm := make([]piece, len(ps))
	copy(norm, ps)
	for i := range norm {
		if i > 0 && ps[i-1].end() != ps[i].off {
			skip := leadingContinuation(norm[i].data)
			norm[i] = piece{off: norm[i].off + int64(skip), data: norm[i].data[skip:]}
		}
		if i+1 < len(ps) && ps[i].end() != ps[i+1].off {
			norm[i].data = norm[i].data[:len(norm[i].data)-partialRuneSuffix(norm[i].data)]
		}
	}
	var b strings.Builder
	for i, p := range norm {
		if i > 0 {
			if gap := p.off - norm[i-1].end(); gap > 0 {
				if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
					b.WriteByte('\n')
				}
				fmt.Fprintf(&b, "[... %d bytes omitted ...]\n", gap)
			}
		}
		b.WriteString(safeText(p.data))
	}
	return b.String()
}

// partialRuneSuffix is the length of an incomplete UTF-8 sequence at the end
// of b (0 when b ends on a boundary or with bytes that cannot start one).
func partialRuneSuffix(b []byte) int {
	for n := 1; n <= utf8.UTFMax-1 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c < 0x80 {
			return 0
		}
		if utf8.RuneStart(c) {
			need := 0
			switch {
			case c&0xE0 == 0xC0:
				need = 2
			case c&0xF0 == 0xE0:
				need = 3
			case c&0xF8 == 0xF0:
				need = 4
			}
			if need > n {
				return n
			}
			return 0
		}
	}
	return 0
}

// leadingContinuation is the number of UTF-8 continuation bytes (at most 3)
// at the start of b: the end of a character whose start was cut off.
func leadingContinuation(b []byte) int {
	n := 0
	for n < len(b) && n < utf8.UTFMax-1 && !utf8.RuneStart(b[n]) {
		n++
	}
	return n
}

// binaryPreview is how many bytes of a binary piece are shown in hex.
const binaryPreview = 32

// safeText renders b as text a model and a terminal can take: valid UTF-8
// stays as it is (newlines and tabs too; a CR before a LF is dropped, as a
// terminal's output has them), other control bytes and invalid bytes
// become \xNN. When more than a tenth of a longer piece would need escaping
// it is binary: a one-line summary with a hex preview replaces it.
func safeText(b []byte) string {
	bad := 0
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if (r == utf8.RuneError && size == 1) || (r < 0x20 && r != '\n' && r != '\t' && r != '\r' && r != 0x1b) || r == 0x7f {
			bad++
		}
		i += size
	}
	if len(b) >= 16 && bad*10 > len(b) {
		n := min(len(b), binaryPreview)
		return fmt.Sprintf("[binary output: %d bytes, not shown as text; first %d bytes: % x]\n", len(b), n, b[:n])
	}
	var s strings.Builder
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&s, `\x%02x`, b[i])
		case r == '\r' && i+1 < len(b) && b[i+1] == '\n':
		case r == '\n' || r == '\t' || r == '\r' || r == 0x1b:
			s.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&s, `\x%02x`, b[i])
		default:
			s.Write(b[i : i+size])
		}
		i += size
	}
	return s.String()
}
