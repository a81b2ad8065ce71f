// Package resp reads Redis protocol (RESP2/RESP3) commands and writes replies.
//
// Clients send commands as arrays of bulk strings ("multibulk") or as inline
// lines (what telnet and redis-cli in some modes send); both are accepted. The
// reader never trusts a length it has not checked against its limits, so a
// hostile or broken client costs at most the configured bulk limit in memory.
package resp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/oasis-llm/oasis/kvcached/internal/bufpool"
)

// Limits bound what one command may make the reader allocate.
type Limits struct {
	// MaxBulk is the largest bulk string accepted (Redis's proto-max-bulk-len).
	MaxBulk int64
	// MaxArgs is the most arguments one command may have.
	MaxArgs int
	// MaxInline is the longest inline command line.
	MaxInline int
	// MaxSkip is the longest bulk string skipped, with a TooLargeError, to
	// keep the connection; a longer one is a ProtocolError that closes it,
	// since skipping it would tie the connection up for that many bytes.
	// 0: the larger of MaxBulk and Redis's default proto-max-bulk-len.
	MaxSkip int64
}

// redisMaxBulk is Redis's default proto-max-bulk-len.
const redisMaxBulk = 512 << 20

// Before a connection authenticates, commands are limited as Redis limits
// them (redis/redis src/networking.c, processMultibulkBuffer: "ll > 10 &&
// authRequired(c)" and "ll > 16384 && authRequired(c)", added in 6.2.6 and
// 6.0.16 for CVE-2021-32675 and unchanged since, 7.2 and 8.x included): a
// client without the password can make the server hold no more than a few
// small arguments, enough for AUTH, HELLO and QUIT.
const (
	unauthMaxArgs = 10
	unauthMaxBulk = 16384
)

func (l Limits) maxSkip() int64 {
	if l.MaxSkip > 0 {
		return max(l.MaxSkip, l.MaxBulk)
	}
	return max(redisMaxBulk, l.MaxBulk)
}

// DefaultLimits returns limits allowing 64 MiB values, LMCache's largest chunk with headroom.
func DefaultLimits() Limits {
	return Limits{MaxBulk: 64<<20 + 4096, MaxArgs: 1 << 20, MaxInline: 64 << 10}
}

// ProtocolError is a malformed stream the reader cannot resynchronise on: the
// server replies with it and closes the connection.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Msg }

// TooLargeError reports a bulk argument over Limits.MaxBulk. The reader has
// skipped the argument's bytes and the rest of the command, so the stream is
// still in sync: the server replies with an error and carries on.
type TooLargeError struct{ Len, Max int64 }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("value of %d bytes exceeds the %d-byte limit (proto-max-bulk-len)", e.Len, e.Max)
}

// smallArg is the size up to which arguments are carved from a shared slab
// instead of allocated one by one: command names, keys and options.
const smallArg = 64

// Reader parses commands from a client stream.
type Reader struct {
	br     *bufio.Reader
	limits Limits
	args   [][]byte      // reused between commands
	slab   []byte        // backing for small arguments; a fresh slab when full
	budget *Budget       // optional, shared by all readers
	pool   *bufpool.Pool // optional: large arguments' buffers
	held   int64         // budget held for the current command
	// overdraft: the current command went past the budget (see Budget).
	overdraft bool
	// reading: counted in the budget's holders, from the command's first
	// budgeted argument until ReadCommand returns. A command being run is
	// not counted: it may wait for the budget itself (a peer fetch on a
	// miss), and counting it would keep stuck readers from the overdraft.
	reading bool
	// unauthenticated applies Redis's limits for clients that have not
	// authenticated (unauthMaxArgs, unauthMaxBulk).
	unauthenticated bool
	// allowance, when set, is where an unauthenticated command's large
	// arguments take their bytes from instead of the budget (allowanceHeld
	// of them for the current command).
	allowance     Allowance
	allowanceHeld int64
	// lowWater, when set, asks the socket to report readability only once n
	// bytes are queued (SO_RCVLOWAT); n = 1 restores the default.
	lowWater func(n int)
}

// Large values are read with the socket's receive low-water mark raised to
// what is still owed (up to lowWaterMax): the reader is then woken once per
// lowWaterMax bytes instead of at every segment, each wake-up costing a read
// that finds the socket empty and a trip through the scheduler. The mark is set
// before every read that may block and never above the bytes the client must
// still send for this value, so a well-formed stream cannot stall on it.
const (
	lowWaterMin = 128 << 10
	lowWaterMax = 512 << 10
)

// SetLowWater installs the socket's receive low-water mark setter.
func (r *Reader) SetLowWater(f func(n int)) { r.lowWater = f }

// newArg returns room for an argument of l bytes: carved from the shared
// slab when small, else taken from the budget and from the pool (allocated
// without zeroing: the caller fills every byte). It refuses an argument that
// would make the command hold more than the whole budget, before anything is
// allocated.
func (r *Reader) newArg(l int64) ([]byte, error) {
	if l <= smallArg {
		if len(r.slab) < int(l) {
			r.slab = make([]byte, 4096)
		}
		arg := r.slab[:l:l]
		r.slab = r.slab[l:]
		return arg, nil
	}
	if r.unauthenticated && r.allowance != nil {
		if !r.allowance.Take(l) {
			return nil, ErrUnauthenticatedMemory
		}
		r.allowanceHeld += l
		return r.pool.Get(int(l)), nil
	}
	if r.budget != nil {
		if !r.fits(l) {
			return nil, &OverBudgetError{Need: r.held + l, Limit: r.budget.limit}
		}
		if r.budget.acquire(l, r.held) {
			r.overdraft = true
		}
		// Counted once it holds bytes: a reader waiting with nothing held
		// is not one the stuck readers wait for.
		if !r.reading {
			r.reading = true
			r.budget.holders.Add(1)
		}
		r.held += l
	}
	return r.pool.Get(int(l)), nil
}

// fits reports whether the command may take l more bytes of the budget: one
// argument larger than the whole budget goes through alone, but a command
// already holding bytes may not grow past the budget.
func (r *Reader) fits(l int64) bool {
	return r.budget == nil || (r.unauthenticated && r.allowance != nil) || l <= smallArg || r.held == 0 || r.held+l <= r.budget.limit
}

// readArg fills arg from the stream, a large one with the socket's low-water
// mark raised (see lowWaterMin).
func (r *Reader) readArg(arg []byte) error {
	if r.lowWater == nil || len(arg) < lowWaterMin {
		_, err := io.ReadFull(r.br, arg)
		return err
	}
	mark := 1
	defer func() {
		if mark != 1 {
			r.lowWater(1)
		}
	}()
	for got := 0; got < len(arg); {
		if r.br.Buffered() == 0 {
			want := 1
			if owed := len(arg) - got; owed >= lowWaterMin {
				want = min(owed, lowWaterMax)
			}
			if want != mark {
				r.lowWater(want)
				mark = want
			}
		}
		n, err := r.br.Read(arg[got:])
		got += n
		if err != nil {
			if err == io.EOF && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			if got < len(arg) {
				return err
			}
		}
	}
	return nil
}

// SetUnauthenticated makes the following commands subject to the limits of
// a connection that has not authenticated (true) or lifts them (false).
func (r *Reader) SetUnauthenticated(on bool) { r.unauthenticated = on }

// SetPool makes the reader take large arguments' buffers from p (which the
// store they are given to hands back).
func (r *Reader) SetPool(p *bufpool.Pool) { r.pool = p }

// SetBudget makes the reader take large arguments' bytes from b; the caller
// gives them back with Done once it has finished with each command.
func (r *Reader) SetBudget(b *Budget) { r.budget = b }

// Done returns the budget (and allowance) held for the last command (a
// no-op without one).
func (r *Reader) Done() {
	r.doneReading()
	if r.allowanceHeld > 0 {
		r.allowance.Give(r.allowanceHeld)
		r.allowanceHeld = 0
	}
	if r.budget == nil || r.held == 0 {
		return
	}
	r.budget.release(r.held)
	r.held = 0
	if r.overdraft {
		r.overdraft = false
		r.budget.endOverdraft()
	}
}

// doneReading takes the reader out of the budget's holders (see reading).
func (r *Reader) doneReading() {
	if r.reading {
		r.reading = false
		r.budget.leave()
	}
}

// Allowance bounds the bytes of unauthenticated connections' arguments,
// all connections together, without waiting: Take reports false when n more
// bytes do not fit.
type Allowance interface {
	Take(n int64) bool
	Give(n int64)
}

// ErrUnauthenticatedMemory refuses an unauthenticated command's argument
// that does not fit in the Allowance; the connection is closed.
var ErrUnauthenticatedMemory = &ProtocolError{Msg: "unauthenticated connections' memory limit reached"}

// SetAllowance makes unauthenticated commands take their large arguments'
// bytes from a instead of the budget, so clients without the password can
// neither hold nor wait for the budget authenticated clients' values need.
func (r *Reader) SetAllowance(a Allowance) { r.allowance = a }

// Grow replaces the read buffer by one of size bytes, unless it is already
// that large, keeping the bytes it holds; src must be the stream the reader
// reads (the bufio.Reader's own source).
func (r *Reader) Grow(src io.Reader, size int) {
	if r.br.Size() >= size {
		return
	}
	if n := r.br.Buffered(); n > 0 {
		p, _ := r.br.Peek(n)
		src = io.MultiReader(bytes.NewReader(bytes.Clone(p)), src)
	}
	r.br = bufio.NewReaderSize(src, size)
}

// BufferSize is the size of the read buffer.
func (r *Reader) BufferSize() int { return r.br.Size() }

// NewReader returns a Reader over br with the given limits.
func NewReader(br *bufio.Reader, limits Limits) *Reader {
	return &Reader{br: br, limits: limits}
}

// Buffered reports how many bytes are already read and waiting: zero means the
// client has no more pipelined commands queued, so replies should be flushed.
func (r *Reader) Buffered() int { return r.br.Buffered() }

// ReadCommand returns the next command's arguments. An empty inline line
// yields a nil command and no error (Redis ignores it). Errors are io errors,
// *ProtocolError (close the connection) or *TooLargeError (reply, continue).
//
// The returned slice is reused by the next call; the arguments themselves
// stay valid. Arguments of up to 64 bytes share a slab with other small
// arguments: a caller keeping one for long should copy it.
func (r *Reader) ReadCommand() ([][]byte, error) {
	defer r.doneReading()
	b, err := r.br.ReadByte()
	if err != nil {
		return nil, err
	}
	if b != '*' {
		if err := r.br.UnreadByte(); err != nil {
			return nil, err
		}
		return r.readInline()
	}
	n, err := r.readInt()
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		// "*0" and "*-1" are empty commands; Redis ignores them.
		return nil, nil
	}
	if n > int64(r.limits.MaxArgs) {
		return nil, &ProtocolError{Msg: fmt.Sprintf("invalid multibulk length %d", n)}
	}
	if r.unauthenticated && n > unauthMaxArgs {
		return nil, &ProtocolError{Msg: "unauthenticated multibulk length"}
	}
	// Grow the slice as arguments arrive rather than trusting n up front.
	args := r.args[:0]
	defer func() { r.args = args[:0] }()
	// refused: the command is answered with this error once its remaining
	// arguments are skipped (read and dropped, never allocated).
	var refused error
	for i := int64(0); i < n; i++ {
		if refused == nil {
			if arg, ok := r.bufferedArg(); ok {
				args = append(args, arg)
				continue
			}
		}
		c, err := r.br.ReadByte()
		if err != nil {
			return nil, unexpectedEOF(err)
		}
		if c != '$' {
			return nil, &ProtocolError{Msg: fmt.Sprintf("expected '$', got %q", c)}
		}
		l, err := r.readInt()
		if err != nil {
			return nil, err
		}
		if l < 0 {
			return nil, &ProtocolError{Msg: fmt.Sprintf("invalid bulk length %d", l)}
		}
		if max := r.limits.maxSkip(); l > max {
			return nil, &ProtocolError{Msg: fmt.Sprintf("invalid bulk length %d", l)}
		}
		if r.unauthenticated && l > unauthMaxBulk {
			return nil, &ProtocolError{Msg: "unauthenticated bulk length"}
		}
		if refused == nil && l > r.limits.MaxBulk {
			refused = &TooLargeError{Len: l, Max: r.limits.MaxBulk}
		}
		if refused == nil && !r.fits(l) {
			refused = &OverBudgetError{Need: r.held + l, Limit: r.budget.limit}
		}
		if refused != nil {
			// What the command already holds is of no more use: give it
			// back before skipping what may be many more bytes.
			args = args[:0]
			r.Done()
			if _, err := io.CopyN(io.Discard, r.br, l); err != nil {
				return nil, unexpectedEOF(err)
			}
		} else {
			arg, err := r.newArg(l)
			if err != nil {
				return nil, err
			}
			if err := r.readArg(arg); err != nil {
				return nil, unexpectedEOF(err)
			}
			args = append(args, arg)
		}
		if err := r.expectCRLF(); err != nil {
			return nil, err
		}
	}
	if refused != nil {
		return nil, refused
	}
	return args, nil
}

// bufferedArg is ReadCommand's fast path for one bulk argument that is
// already wholly buffered and well formed: it parses it straight out of the
// buffer (one Peek and one Discard instead of a call per byte). It consumes
// nothing and reports false for anything else (partial, oversized or
// malformed), which the general path then reads or rejects.
func (r *Reader) bufferedArg() ([]byte, bool) {
	p, _ := r.br.Peek(r.br.Buffered())
	if len(p) < 4 || p[0] != '$' {
		return nil, false
	}
	var l int64
	i := 1
	for ; i < len(p) && i <= 19 && '0' <= p[i] && p[i] <= '9'; i++ {
		l = l*10 + int64(p[i]-'0')
	}
	if i == 1 || i > 19 || l > r.limits.MaxBulk || !r.fits(l) || (r.unauthenticated && l > unauthMaxBulk) {
		return nil, false
	}
	hdr := i + 2
	end := hdr + int(l) + 2
	if end > len(p) || p[i] != '\r' || p[i+1] != '\n' || p[end-2] != '\r' || p[end-1] != '\n' {
		return nil, false
	}
	arg, err := r.newArg(l)
	if err != nil {
		return nil, false
	}
	copy(arg, p[hdr:end-2])
	r.br.Discard(end)
	return arg, true
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func (r *Reader) expectCRLF() error {
	cr, err := r.br.ReadByte()
	if err != nil {
		return unexpectedEOF(err)
	}
	lf, err := r.br.ReadByte()
	if err != nil {
		return unexpectedEOF(err)
	}
	if cr != '\r' || lf != '\n' {
		return &ProtocolError{Msg: "bulk string not terminated by CRLF"}
	}
	return nil
}

// readLine returns one CRLF-terminated line without the terminator, at most
// max bytes long.
func (r *Reader) readLine(max int) ([]byte, error) {
	line, err := r.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull || len(line) > max+2 {
		return nil, &ProtocolError{Msg: "too big inline request"}
	}
	if err != nil {
		return nil, unexpectedEOF(err)
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

func (r *Reader) readInt() (int64, error) {
	line, err := r.readLine(32)
	if err != nil {
		return 0, err
	}
	if n, ok := parseLen(line); ok {
		return n, nil
	}
	n, err := strconv.ParseInt(string(line), 10, 64)
	if err != nil {
		return 0, &ProtocolError{Msg: fmt.Sprintf("invalid length %q", line)}
	}
	return n, nil
}

// parseLen parses the common case of a length, 1 to 18 decimal digits,
// without the string conversion ParseInt needs; anything else (signs,
// longer numbers, garbage) is left to ParseInt and its errors.
func parseLen(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

func (r *Reader) readInline() ([][]byte, error) {
	line, err := r.readLine(r.limits.MaxInline)
	if err != nil {
		return nil, err
	}
	args, err := splitInline(line)
	if err != nil {
		return nil, err
	}
	if len(args) > r.limits.MaxArgs {
		return nil, &ProtocolError{Msg: "too many inline arguments"}
	}
	if r.unauthenticated && len(args) > unauthMaxArgs {
		return nil, &ProtocolError{Msg: "unauthenticated multibulk length"}
	}
	return args, nil
}

// splitInline splits an inline command on spaces, honouring double and
// single quotes and the escapes redis-cli's own parser understands.
func splitInline(line []byte) ([][]byte, error) {
	var args [][]byte
	i := 0
	for {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i == len(line) {
			return args, nil
		}
		var cur []byte
		switch line[i] {
		case '"':
			i++
			for {
				if i >= len(line) {
					return nil, &ProtocolError{Msg: "unbalanced quotes in request"}
				}
				c := line[i]
				if c == '"' {
					i++
					break
				}
				if c == '\\' && i+1 < len(line) {
					i++
					switch e := line[i]; e {
					case 'n':
						c = '\n'
					case 'r':
						c = '\r'
					case 't':
						c = '\t'
					case 'x':
						if i+2 < len(line) {
							if v, err := strconv.ParseUint(string(line[i+1:i+3]), 16, 8); err == nil {
								c = byte(v)
								i += 2
								break
							}
						}
						c = 'x'
					default:
						c = e
					}
				}
				cur = append(cur, c)
				i++
			}
		case '\'':
			i++
			for {
				if i >= len(line) {
					return nil, &ProtocolError{Msg: "unbalanced quotes in request"}
				}
				c := line[i]
				if c == '\'' {
					i++
					break
				}
				if c == '\\' && i+1 < len(line) && line[i+1] == '\'' {
					i++
					c = '\''
				}
				cur = append(cur, c)
				i++
			}
		default:
			for i < len(line) && line[i] != ' ' && line[i] != '\t' {
				cur = append(cur, line[i])
				i++
			}
		}
		if i < len(line) && line[i] != ' ' && line[i] != '\t' {
			return nil, &ProtocolError{Msg: "unbalanced quotes in request"}
		}
		if cur == nil {
			cur = []byte{}
		}
		args = append(args, cur)
	}
}
