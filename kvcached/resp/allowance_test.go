package resp

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

type testAllowance struct{ limit, used int64 }

func (a *testAllowance) Take(n int64) bool {
	if a.used+n > a.limit {
		return false
	}
	a.used += n
	return true
}

func (a *testAllowance) Give(n int64) { a.used -= n }

// Unauthenticated arguments take their bytes from the allowance, not the
// budget, and are refused with ErrUnauthenticatedMemory past it.
func TestUnauthenticatedArgumentsTakeTheAllowance(t *testing.T) {
	arg := strings.Repeat("a", 10000)
	in := "*2\r\n$4\r\nECHO\r\n$10000\r\n" + arg + "\r\n" + "*3\r\n$4\r\nECHO\r\n$10000\r\n" + arg + "\r\n$10000\r\n" + arg + "\r\n"
	r := NewReader(bufio.NewReaderSize(strings.NewReader(in), 4096), DefaultLimits())
	b := NewBudget(1 << 20)
	a := &testAllowance{limit: 15000}
	r.SetBudget(b)
	r.SetAllowance(a)
	r.SetUnauthenticated(true)
	args, err := r.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, arg, string(args[1]))
	must.Eq(t, int64(10000), a.used)
	must.Eq(t, int64(0), b.InUse())
	r.Done()
	must.Eq(t, int64(0), a.used)
	_, err = r.ReadCommand()
	must.True(t, errors.Is(err, ErrUnauthenticatedMemory))
	var pe *ProtocolError
	must.True(t, errors.As(err, &pe))
	r.Done()
	must.Eq(t, int64(0), a.used)
}

// Grow keeps the bytes already buffered: a command pipelined behind AUTH is
// read whole after the buffer grows.
func TestGrowKeepsBufferedBytes(t *testing.T) {
	val := bytes.Repeat([]byte("v"), 100000)
	src := strings.NewReader("*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100000\r\n" + string(val) + "\r\n*1\r\n$4\r\nPING\r\n")
	r := NewReader(bufio.NewReaderSize(src, 64), DefaultLimits())
	args, err := r.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, "AUTH", string(args[0]))
	must.Positive(t, r.Buffered())
	r.Grow(src, 64<<10)
	must.Eq(t, 64<<10, r.BufferSize())
	args, err = r.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, 3, len(args))
	must.True(t, bytes.Equal(val, args[2]))
	args, err = r.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, "PING", string(args[0]))

	var out bytes.Buffer
	w := NewWriter(&out, 16)
	w.Simple("OK")
	w.Grow(1024)
	must.Eq(t, 1024, w.BufferSize())
	w.Simple("PONG")
	must.NoError(t, w.Flush())
	must.Eq(t, "+OK\r\n+PONG\r\n", out.String())
}
