package gateway

import "errors"

// chunkDecoder decodes an HTTP/1.1 chunked body incrementally and in place,
// for the streaming relay: each read's bytes are decoded where they lie and
// the data goes on to the client, without another buffer or a bufio.Reader
// in between. It is stricter than net/http's decoder (size lines are hex
// digits, an optional extension and CRLF; at most 16 digits); what it
// accepts, net/http decodes to the same data (FuzzChunkDecoder).
type chunkDecoder struct {
	state  int
	size   uint64 // data bytes left in the current chunk; digits read, in stSize
	digits int
	line   int // bytes in the current size, extension or trailer line
	budget int // trailer bytes left
}

const (
	stSize    = iota // chunk size digits
	stExt            // chunk extension, up to CR
	stSizeLF         // LF after the size line's CR
	stData           // chunk data
	stDataCR         // CR after data
	stDataLF         // LF after data
	stTrailer        // start of a trailer line (or the final CRLF)
	stTrLine         // inside a trailer line, up to CR
	stTrLF           // LF ending a trailer line
	stEndLF          // LF of the final CRLF
	stDone
)

const (
	maxChunkLine   = 4096
	maxTrailerSize = 8 << 10
)

var errChunked = errors.New("malformed chunked encoding")

// decode decodes p in place: data is the part of p holding the chunk data
// found in it, n the bytes of p consumed (less than len(p) only when the
// body ended before the end of p), done whether the body ended.
func (d *chunkDecoder) decode(p []byte) (data []byte, n int, done bool, err error) {
	// The first chunk's data stays where it lies (data starts at base);
	// only data of later chunks in p is moved, to follow it. An engine
	// writes one event per chunk, so a read usually moves nothing.
	base, w := 0, 0
	i := 0
	for i < len(p) {
		c := p[i]
		switch d.state {
		case stSize:
			v, ok := unhex(c)
			switch {
			case ok:
				if d.digits == 16 {
					return p[base : base+w], i, false, errors.New("chunk size too large")
				}
				d.size = d.size<<4 | uint64(v)
				d.digits++
			case d.digits > 0 && c == ';':
				d.state = stExt
			case d.digits > 0 && c == '\r':
				d.state = stSizeLF
			default:
				return p[base : base+w], i, false, errChunked
			}
			i++
			d.line++
		case stExt:
			switch {
			case c == '\r':
				d.state = stSizeLF
			case c == '\n' || c == 0:
				return p[base : base+w], i, false, errChunked
			}
			i++
			d.line++
			if d.line > maxChunkLine {
				return p[base : base+w], i, false, errChunked
			}
		case stSizeLF:
			if c != '\n' {
				return p[base : base+w], i, false, errChunked
			}
			i++
			d.line, d.digits = 0, 0
			if d.size == 0 {
				d.state, d.budget = stTrailer, maxTrailerSize
			} else {
				d.state = stData
			}
		case stData:
			k := uint64(len(p) - i)
			if k > d.size {
				k = d.size
			}
			if w == 0 {
				base = i
			} else {
				copy(p[base+w:], p[i:i+int(k)])
			}
			w += int(k)
			i += int(k)
			d.size -= k
			if d.size == 0 {
				d.state = stDataCR
			}
		case stDataCR, stDataLF:
			want := byte('\r')
			if d.state == stDataLF {
				want = '\n'
			}
			if c != want {
				return p[base : base+w], i, false, errChunked
			}
			i++
			if d.state == stDataCR {
				d.state = stDataLF
			} else {
				d.state = stSize
			}
		case stTrailer, stTrLine, stTrLF, stEndLF:
			// Trailer fields are dropped (the router forwards none); only
			// their line structure and size are checked.
			if d.budget--; d.budget < 0 {
				return p[base : base+w], i, false, errors.New("chunked trailer too large")
			}
			switch {
			case d.state == stTrailer && c == '\r':
				d.state = stEndLF
			case d.state == stTrailer || d.state == stTrLine:
				if c == '\n' || c == 0 {
					return p[base : base+w], i, false, errChunked
				}
				d.state = stTrLine
				if c == '\r' {
					d.state = stTrLF
				}
			case c != '\n':
				return p[base : base+w], i, false, errChunked
			case d.state == stTrLF:
				d.state = stTrailer
			default: // stEndLF
				d.state = stDone
				return p[base : base+w], i + 1, true, nil
			}
			i++
		case stDone:
			return p[base : base+w], i, true, nil
		}
	}
	return p[base : base+w], i, d.state == stDone, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
