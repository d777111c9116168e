package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// outputChunk is how much exec.output asks for at a time.
const outputChunk = 256 << 10

// noteBuffer is how many notifications wait for the writer before more are
// dropped (and later fetched with exec.output).
const noteBuffer = 256

// streamer copies an execution's output to local writers while it runs:
// exec.output notifications of exec.follow are written as they come, and
// whatever was skipped — by the daemon for a slow connection, or here when
// the local writer is slow — is fetched with exec.output, so the bytes
// written are the stream as the daemon kept it, in order, each once.
//
// Ownership: onNote runs on the client's reader goroutine and only queues;
// everything else, including the writes, happens on the goroutine that
// called follow.
type streamer struct {
	c     *ipc.Client
	id    string
	out   map[string]io.Writer // stream name -> where it goes; absent streams are skipped
	warn  io.Writer            // notes about bytes the daemon did not keep
	next  map[string]int64     // next offset to write, per stream
	notes chan json.RawMessage
}

func newStreamer(c *ipc.Client, id string, out map[string]io.Writer, warn io.Writer) *streamer {
	return &streamer{
		c:     c,
		id:    id,
		out:   out,
		warn:  warn,
		next:  map[string]int64{"stdout": 0, "stderr": 0},
		notes: make(chan json.RawMessage, noteBuffer),
	}
}

// onNote is the Follow callback; it never blocks.
func (s *streamer) onNote(method string, params json.RawMessage) {
	if method != api.NotifyOutput {
		return
	}
	select {
	case s.notes <- params:
	default: // dropped here; the gap is fetched when the next chunk shows it
	}
}

// follow streams from the current offsets until the execution is cleaned
// and returns the final record. All of the kept output has been written when
// it returns without error.
func (s *streamer) follow(ctx context.Context) (api.Record, error) {
	type result struct {
		rec api.Record
		err error
	}
	done := make(chan result, 1)
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		rec, err := s.c.Follow(fctx, api.FollowParams{
			ID:           s.id,
			StdoutOffset: s.next["stdout"],
			StderrOffset: s.next["stderr"],
		}, s.onNote)
		done <- result{rec, err}
	}()

	for {
		select {
		case p := <-s.notes:
			if err := s.write(ctx, p); err != nil {
				return api.Record{}, err
			}
		case r := <-done:
			// Follow has returned, so no more notes arrive: write what is
			// queued, then whatever was dropped at the end.
			for {
				select {
				case p := <-s.notes:
					if err := s.write(ctx, p); err != nil {
						return api.Record{}, err
					}
					continue
				default:
				}
				break
			}
			if r.err != nil {
				return api.Record{}, r.err
			}
			for stream, info := range map[string]api.StreamInfo{"stdout": r.rec.Stdout, "stderr": r.rec.Stderr} {
				if s.out[stream] != nil && s.next[stream] < info.TotalBytes {
					if err := s.fetch(ctx, stream, info.TotalBytes); err != nil {
						return api.Record{}, err
					}
				}
			}
			return r.rec, nil
		}
	}
}

// write handles one exec.output notification.
func (s *streamer) write(ctx context.Context, params json.RawMessage) error {
	var n api.OutputNotification
	if err := json.Unmarshal(params, &n); err != nil {
		return fmt.Errorf("decode exec.output notification: %w", err)
	}
	w := s.out[n.Stream]
	if w == nil || n.ID != s.id {
		return nil
	}
	end := n.Offset + int64(len(n.Data))
	if end <= s.next[n.Stream] {
		return nil // already written
	}
	if n.Offset > s.next[n.Stream] {
		if err := s.fetch(ctx, n.Stream, n.Offset); err != nil {
			return err
		}
	}
	data := n.Data[max(0, s.next[n.Stream]-n.Offset):]
	if _, err := w.Write(data); err != nil {
		return &localWriteError{stream: n.Stream, err: err}
	}
	s.next[n.Stream] = end
	return nil
}

// fetch writes stream from the current offset up to (not including) to,
// with exec.output; to < 0 means to the end of what the daemon has.
// Afterwards the offset is to even where the daemon kept nothing.
func (s *streamer) fetch(ctx context.Context, stream string, to int64) error {
	w := s.out[stream]
	for to < 0 || s.next[stream] < to {
		from := s.next[stream]
		limit := int64(outputChunk)
		if to >= 0 {
			limit = min(limit, to-from)
		}
		res, err := s.c.Output(ctx, api.OutputParams{ID: s.id, Stream: stream, Offset: from, Limit: limit})
		if err != nil {
			return fmt.Errorf("fetch %s of %s from offset %d: %w", stream, s.id, from, err)
		}
		data, start := res.Data, res.Offset
		if start < from {
			// Never write a byte twice.
			data = data[min(int64(len(data)), from-start):]
			start = from
		}
		nextOff := start + int64(len(data))
		if to >= 0 && nextOff > to {
			// Only up to to: the caller has the bytes from there on.
			nextOff = to
			data = data[:max(0, to-start)]
		}
		if start > from && s.warn != nil {
			fmt.Fprintf(s.warn, "corralctl: [%s bytes %d-%d of %s were not kept by the daemon]\n", stream, from, min(start, nextOff), s.id)
		}
		if len(data) > 0 {
			if _, err := w.Write(data); err != nil {
				return &localWriteError{stream: stream, err: err}
			}
		}
		if nextOff <= from {
			// Nothing more to be had: the daemon's end of stream.
			if to >= 0 {
				s.next[stream] = to
			}
			return nil
		}
		s.next[stream] = nextOff
		if to < 0 && res.EOF {
			return nil
		}
	}
	return nil
}

// localWriteError is a failure to write output locally (a closed pipe), as
// opposed to a failure talking to the daemon.
type localWriteError struct {
	stream string
	err    error
}

func (e *localWriteError) Error() string { return fmt.Sprintf("write %s: %v", e.stream, e.err) }
func (e *localWriteError) Unwrap() error { return e.err }
