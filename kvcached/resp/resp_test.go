package resp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/shoenig/test/must"
)

func reader(s string, l Limits) *Reader {
	return NewReader(bufio.NewReaderSize(strings.NewReader(s), 4096), l)
}

func strs(args [][]byte) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = string(a)
	}
	return out
}

func TestReadCommand(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want [][]string
		err  string // substring of the error after the commands
	}{
		{name: "multibulk", in: "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", want: [][]string{{"GET", "k"}}},
		{name: "pipelined", in: "*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$1\r\na\r\n$0\r\n\r\n", want: [][]string{{"PING"}, {"SET", "a", ""}}},
		{name: "binary value", in: "*2\r\n$4\r\nECHO\r\n$4\r\n\r\n\x00\xff\r\n", want: [][]string{{"ECHO", "\r\n\x00\xff"}}},
		{name: "inline", in: "SET k \"a b\\x41\\n\" 'c\\'d'\r\nPING\n", want: [][]string{{"SET", "k", "a bA\n", "c'd"}, {"PING"}}},
		{name: "empty inline and empty array", in: "\r\n*0\r\nPING\r\n", want: [][]string{nil, nil, {"PING"}}},
		{name: "bad bulk prefix", in: "*1\r\n+PING\r\n", err: "expected '$'"},
		{name: "bad length", in: "*x\r\n", err: "invalid length"},
		{name: "negative bulk", in: "*1\r\n$-5\r\n", err: "invalid bulk length"},
		{name: "too many args", in: "*9999999\r\n", err: "invalid multibulk length"},
		{name: "missing crlf", in: "*1\r\n$4\r\nPINGxx", err: "not terminated by CRLF"},
		{name: "truncated", in: "*2\r\n$3\r\nGET\r\n$5\r\nab", err: "unexpected EOF"},
		{name: "unbalanced quotes", in: "SET \"abc\r\n", err: "unbalanced quotes"},
		{name: "text after quote", in: "SET \"a\"b\r\n", err: "unbalanced quotes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := reader(tc.in, Limits{MaxBulk: 1 << 20, MaxArgs: 1000, MaxInline: 1024})
			var got [][]string
			var err error
			for {
				var args [][]byte
				args, err = r.ReadCommand()
				if err != nil {
					break
				}
				if args == nil {
					got = append(got, nil)
				} else {
					got = append(got, strs(args))
				}
			}
			must.Eq(t, tc.want, got)
			if tc.err == "" {
				must.ErrorIs(t, err, io.EOF)
			} else {
				must.ErrorContains(t, err, tc.err)
			}
		})
	}
}

// A large value read through a stream that yields a few KiB at a time: the
// receive low-water mark is raised only to what the value still owes (never
// more, or a client that has sent all but a little would never wake the
// reader), and is back at one byte when the command is returned.
func TestLargeValueLowWaterMark(t *testing.T) {
	val := bytes.Repeat([]byte("abcdefgh"), (1<<20)/8)
	in := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$" + strconv.Itoa(len(val)) + "\r\n" + string(val) + "\r\n*1\r\n$4\r\nPING\r\n"
	src := strings.NewReader(in)
	r := NewReader(bufio.NewReaderSize(iotest.HalfReader(src), 64<<10), Limits{MaxArgs: 16, MaxBulk: 4 << 20, MaxInline: 64 << 10})
	var marks []int
	r.SetLowWater(func(n int) {
		// What the value still owes: the unread stream less its CRLF and the PING.
		owed := src.Len() + r.Buffered() - len("\r\n*1\r\n$4\r\nPING\r\n")
		must.LessEq(t, max(owed, 1), n, must.Sprintf("mark %d with %d bytes owed", n, owed))
		marks = append(marks, n)
	})
	args, err := r.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, 3, len(args))
	must.Eq(t, string(val), string(args[2]))
	must.Positive(t, len(marks))
	must.Greater(t, 1, marks[0])
	must.Eq(t, 1, marks[len(marks)-1])
	args, err = r.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, "PING", string(args[0]))
}

func TestTooLargeKeepsStreamInSync(t *testing.T) {
	big := strings.Repeat("x", 100)
	in := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\n" + big + "\r\n*1\r\n$4\r\nPING\r\n"
	r := reader(in, Limits{MaxBulk: 10, MaxArgs: 10, MaxInline: 100})
	_, err := r.ReadCommand()
	var tl *TooLargeError
	must.True(t, errors.As(err, &tl))
	must.Eq(t, int64(100), tl.Len)
	args, err := r.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, []string{"PING"}, strs(args))
}

func TestInlineTooLong(t *testing.T) {
	r := reader(strings.Repeat("a", 200)+"\r\n", Limits{MaxBulk: 10, MaxArgs: 10, MaxInline: 100})
	_, err := r.ReadCommand()
	var pe *ProtocolError
	must.True(t, errors.As(err, &pe))
}

func TestWriter(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, 4096)
	w.OK()
	w.Int(-3)
	w.Bulk([]byte("hi"))
	w.Null()
	w.Map(1)
	w.Error("ERR bad\r\nthing")
	w.Verbatim("a")
	w.SetProtocol(3)
	w.Null()
	w.Map(1)
	w.Verbatim("a")
	must.Eq(t, 3, w.Protocol())
	must.NoError(t, w.Flush())
	must.Eq(t, "+OK\r\n:-3\r\n$2\r\nhi\r\n$-1\r\n*2\r\n-ERR bad  thing\r\n$1\r\na\r\n_\r\n%1\r\n=5\r\ntxt:a\r\n", buf.String())
}

// TestWriterLargeBulk checks a bulk reply sent around the buffer (one writev)
// keeps the byte order of the replies before and after it.
func TestWriterLargeBulk(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, 4096)
	big := bytes.Repeat([]byte("v"), 100<<10)
	w.OK()
	w.Bulk(big)
	w.Int(7)
	w.BulkString(strings.Repeat("s", 8000))
	must.NoError(t, w.Flush())
	want := "+OK\r\n$102400\r\n" + string(big) + "\r\n:7\r\n$8000\r\n" + strings.Repeat("s", 8000) + "\r\n"
	must.Eq(t, want, buf.String())
}

// FuzzReadCommand feeds arbitrary bytes to the parser: it must never panic,
// never return arguments past its limits, and a command it accepts must
// round-trip through the multibulk encoding.
func FuzzReadCommand(f *testing.F) {
	for _, s := range []string{
		"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n",
		"PING\r\n",
		"SET k \"v\\x00\" 'q'\r\n",
		"*1\r\n$-1\r\n",
		"*-1\r\n",
		"*1\r\n$99999999999999999999\r\n",
		"*2\r\n$3\r\nGET\r\n$40\r\nab",
		"\r\n\r\n*0\r\n",
		"HELLO 3\r\nAUTH default secret\r\n",
	} {
		f.Add([]byte(s))
	}
	limits := Limits{MaxBulk: 1024, MaxArgs: 64, MaxInline: 512}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bufio.NewReaderSize(bytes.NewReader(data), 64), limits)
		for i := 0; i < 1000; i++ {
			args, err := r.ReadCommand()
			var tl *TooLargeError
			if errors.As(err, &tl) {
				continue
			}
			if err != nil {
				return
			}
			if len(args) > limits.MaxArgs {
				t.Fatalf("%d args over the limit", len(args))
			}
			if args == nil {
				continue
			}
			var enc bytes.Buffer
			w := NewWriter(&enc, 4096)
			w.Array(len(args))
			for _, a := range args {
				if int64(len(a)) > limits.MaxBulk {
					t.Fatalf("argument of %d bytes over the limit", len(a))
				}
				w.Bulk(a)
			}
			must.NoError(t, w.Flush())
			again, err := NewReader(bufio.NewReader(&enc), limits).ReadCommand()
			must.NoError(t, err)
			must.Eq(t, strs(args), strs(again))
		}
	})
}

// FuzzReaderPathsAgree checks that parsing a stream out of a large buffer
// (arguments taken whole from it) and one byte at a time (the general path
// only) yields the same commands and the same kinds of error.
func FuzzReaderPathsAgree(f *testing.F) {
	for _, s := range []string{
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$70\r\n" + strings.Repeat("v", 70) + "\r\n",
		"*2\r\n$3\r\nGET\r\n$03\r\nabc\r\n",
		"*2\r\n$3\r\nGET\r\n$3\r\nabcd\r\n",
		"*2\r\n$3\r\nGET\r\n$2000\r\nab\r\n*1\r\n$4\r\nPING\r\n",
		"*1\r\n$+4\r\nPING\r\n",
	} {
		f.Add([]byte(s))
	}
	limits := Limits{MaxBulk: 1024, MaxArgs: 64, MaxInline: 512}
	type result struct {
		args []string
		err  string
	}
	parse := func(br *bufio.Reader) []result {
		r := NewReader(br, limits)
		var out []result
		for i := 0; i < 1000; i++ {
			args, err := r.ReadCommand()
			res := result{args: strs(args)}
			var tl *TooLargeError
			var pe *ProtocolError
			switch {
			case errors.As(err, &tl):
				res.err = "too large"
			case errors.As(err, &pe):
				res.err = "protocol"
			case err != nil:
				res.err = "io"
			}
			out = append(out, res)
			if err != nil && res.err != "too large" {
				break
			}
		}
		return out
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		whole := parse(bufio.NewReaderSize(bytes.NewReader(data), 4096))
		bytewise := parse(bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(data)), 4096))
		must.Eq(t, bytewise, whole)
	})
}

func TestBudgetBoundsLargeArgumentsAcrossReaders(t *testing.T) {
	b := NewBudget(1500)
	val := strings.Repeat("v", 1000)
	cmd := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1000\r\n" + val + "\r\n"
	limits := Limits{MaxBulk: 1 << 20, MaxArgs: 10, MaxInline: 100}
	a := reader(cmd, limits)
	a.SetBudget(b)
	_, err := a.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, int64(1000), b.InUse())

	// A second reader waits until the first is done with its command.
	second := reader(cmd, limits)
	second.SetBudget(b)
	done := make(chan struct{})
	go func() {
		_, err := second.ReadCommand()
		must.NoError(t, err)
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("second reader was not held back by the budget")
	case <-time.After(50 * time.Millisecond):
	}
	a.Done()
	<-done
	must.Eq(t, int64(1000), b.InUse())
	second.Done()
	must.Eq(t, int64(0), b.InUse())

	// One value bigger than the whole budget still goes through, alone.
	huge := reader("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2000\r\n"+strings.Repeat("v", 2000)+"\r\n", limits)
	huge.SetBudget(b)
	_, err = huge.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, int64(2000), b.InUse())
	huge.Done()
	must.Eq(t, int64(0), b.InUse())
}

// A command whose arguments together need more than the whole budget is
// refused as soon as the argument that would cross it is announced, before
// its bytes are allocated; the rest of the command is skipped and the next
// command is read normally.
func TestBudgetBoundsOneCommandsArguments(t *testing.T) {
	b := NewBudget(1500)
	val := strings.Repeat("v", 1000)
	limits := Limits{MaxBulk: 1 << 20, MaxArgs: 100, MaxInline: 100}
	var sb strings.Builder
	sb.WriteString("*33\r\n$4\r\nMSET\r\n")
	for i := 0; i < 16; i++ {
		sb.WriteString("$1\r\nk\r\n$1000\r\n" + val + "\r\n")
	}
	sb.WriteString("*1\r\n$4\r\nPING\r\n")
	var peak int64
	src := &peakReader{r: strings.NewReader(sb.String()), b: b, peak: &peak}
	r := NewReader(bufio.NewReaderSize(src, 512), limits)
	r.SetBudget(b)
	_, err := r.ReadCommand()
	var ob *OverBudgetError
	must.True(t, errors.As(err, &ob), must.Sprint(err))
	must.Eq(t, int64(2000), ob.Need)
	must.Eq(t, int64(0), b.InUse())
	must.LessEq(t, int64(1000), peak)
	r.Done()
	args, err := r.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, []string{"PING"}, strs(args))
}

// peakReader records the budget's use at every read of the stream.
type peakReader struct {
	r    io.Reader
	b    *Budget
	peak *int64
}

func (p *peakReader) Read(buf []byte) (int, error) {
	if u := p.b.InUse(); u > *p.peak {
		*p.peak = u
	}
	return p.r.Read(buf)
}

// Readers that each hold part of the budget wait for more like everyone
// else, rather than all going past the limit; when every holder is waiting,
// one goes through (the overdraft), so they cannot deadlock.
func TestBudgetHoldersWaitAndCannotDeadlock(t *testing.T) {
	b := NewBudget(1500)
	val := strings.Repeat("v", 700)
	cmd := "*5\r\n$4\r\nMSET\r\n$1\r\na\r\n$700\r\n" + val + "\r\n$1\r\nb\r\n$700\r\n" + val + "\r\n"
	limits := Limits{MaxBulk: 1 << 20, MaxArgs: 10, MaxInline: 100}
	const n = 4
	var mu sync.Mutex
	var peak int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := reader(cmd, limits)
			r.SetBudget(b)
			args, err := r.ReadCommand()
			must.NoError(t, err)
			must.SliceLen(t, 5, args)
			mu.Lock()
			peak = max(peak, b.InUse())
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // the input: a command held while others arrive
			r.Done()
		}()
	}
	wg.Wait()
	must.Eq(t, int64(0), b.InUse())
	// Without the wait every reader's second value lands past the limit
	// (n × 1400 bytes); with it, at most one command overdraws.
	must.LessEq(t, int64(1500+1400), peak)
}

// A command being run (read, not yet Done) no longer counts among the
// readers that could progress: a reader stuck for more budget takes the
// overdraft rather than waiting for it, and the running command's own wait
// for budget (a peer fetch) ends with its context.
func TestBudgetRunningCommandDoesNotBlockTheOverdraft(t *testing.T) {
	b := NewBudget(1000)
	limits := Limits{MaxBulk: 1 << 20, MaxArgs: 10, MaxInline: 100}
	key := strings.Repeat("k", 100)
	get := reader("*2\r\n$3\r\nGET\r\n$100\r\n"+key+"\r\n", limits)
	get.SetBudget(b)
	_, err := get.ReadCommand()
	must.NoError(t, err)
	must.Eq(t, int64(100), b.InUse())

	val := strings.Repeat("v", 500)
	mset := reader("*5\r\n$4\r\nMSET\r\n$1\r\na\r\n$500\r\n"+val+"\r\n$1\r\nb\r\n$500\r\n"+val+"\r\n", limits)
	mset.SetBudget(b)
	done := make(chan error, 1)
	go func() {
		_, err := mset.ReadCommand()
		done <- err
	}()
	select {
	case err := <-done:
		must.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("a reader stuck for budget waited for a command being run")
	}
	must.Eq(t, int64(1100), b.InUse())

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	must.ErrorIs(t, b.AcquireContext(ctx, 1000), context.DeadlineExceeded)
	must.Eq(t, int64(1100), b.InUse())
	mset.Done()
	get.Done()
	must.Eq(t, int64(0), b.InUse())
}

// A bulk length past what is worth skipping closes the connection.
func TestHugeBulkLengthIsAProtocolError(t *testing.T) {
	r := reader("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$9223372036854775807\r\n", DefaultLimits())
	_, err := r.ReadCommand()
	var pe *ProtocolError
	must.True(t, errors.As(err, &pe), must.Sprint(err))
	must.StrContains(t, pe.Error(), "invalid bulk length")
}

// BenchmarkReadCommandSet1KiB parses what redis-benchmark -d 1024 sends for
// SET, the 1 KiB pipelined case's hot path.
func BenchmarkReadCommandSet1KiB(b *testing.B) {
	cmd := "*3\r\n$3\r\nSET\r\n$16\r\nkey:__rand_int__\r\n$1024\r\n" + strings.Repeat("x", 1024) + "\r\n"
	stream := strings.Repeat(cmd, 64)
	src := strings.NewReader(stream)
	br := bufio.NewReaderSize(src, 64<<10)
	r := NewReader(br, DefaultLimits())
	r.SetBudget(NewBudget(1 << 30))
	b.SetBytes(int64(len(cmd)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%64 == 0 {
			src.Reset(stream)
			br.Reset(src)
		}
		if _, err := r.ReadCommand(); err != nil {
			b.Fatal(err)
		}
		r.Done()
	}
}
