package h1

import (
	"bufio"
	"bytes"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// TestIsTokenChar checks every byte against RFC 9110's tchar definition.
func TestIsTokenChar(t *testing.T) {
	const tchar = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	for c := 0; c < 256; c++ {
		want := strings.IndexByte(tchar, byte(c)) >= 0
		if got := isTokenChar(byte(c)); got != want {
			t.Errorf("isTokenChar(%q) = %v, want %v", byte(c), got, want)
		}
	}
	if IsToken("") || !IsToken("Content-Type") || IsToken("Bad Name") || IsToken([]byte("a:b")) {
		t.Error("IsToken disagrees on a whole name")
	}
}

// writeHeaders (lines built at once, checked by counting) writes exactly the
// lines writeHeadersChecked (each value checked) does, whether h fits the
// writer's free space or not, and notes Date and Connection: close alike.
func TestWriteHeadersMatchesChecked(t *testing.T) {
	for _, h := range []http.Header{
		{"Content-Type": {"text/event-stream"}, "X-Request-Id": {"abc"}, "Cache-Control": {"no-cache"}},
		{"X-A": {"1", "2"}, "Date": nil, "Connection": {"keep-alive, Close"}, "Keep-Alive": {"timeout=5"}},
		{"X-A": {"ok"}, "X-Bad": {"a\r\nInjected: 1"}, "X-Cr": {"a\rb"}, "X-Lf": {"a\nb"}, "X-Nul": {"a\x00"}},
		{"X-A": {"ok"}, "Bad Key": {"v"}, "Transfer-Encoding": {"chunked"}, "Date": {"Mon, 02 Jan 2006 15:04:05 GMT"}},
		{"X-Long": {strings.Repeat("v", 300)}, "X-B": {"1"}},
	} {
		for _, size := range []int{4096, 64} {
			var fast, checked bytes.Buffer
			fw, cw := bufio.NewWriterSize(&fast, size), bufio.NewWriterSize(&checked, size)
			d1, c1 := writeHeaders(fw, h)
			d2, c2 := writeHeadersChecked(cw, h)
			_, _ = fw.Flush(), cw.Flush()
			if d1 != d2 || c1 != c2 || !sameLines(fast.String(), checked.String()) {
				t.Errorf("%q (buffer %d): writeHeaders %q %v %v, checked %q %v %v", h, size, fast.String(), d1, c1, checked.String(), d2, c2)
			}
			if strings.Contains(fast.String(), "Injected") || strings.Contains(fast.String(), "\x00") {
				t.Errorf("%q: bad value written: %q", h, fast.String())
			}
		}
	}
}

func sameLines(a, b string) bool {
	la, lb := strings.SplitAfter(a, "\r\n"), strings.SplitAfter(b, "\r\n")
	slices.Sort(la)
	slices.Sort(lb)
	return slices.Equal(la, lb)
}

func TestLinesSafe(t *testing.T) {
	for _, tc := range []struct {
		b     string
		lines int
		want  bool
	}{
		{"A: b\r\nC: d\r\n", 2, true},
		{"", 0, true},
		{"A: b\r\nC: d\r\n", 1, false},       // more line ends than lines built
		{"A: b\nX: y\r\nC: d\r\n", 2, false}, // an LF inside a value
		{"A: b\rX\r\nC: d\r\n", 2, false},    // a lone CR inside a value
		{"A: b\x00\r\nC: d\r\n", 2, false},   // a NUL
		{"A: b\r\n", 1, true},
	} {
		if got := LinesSafe([]byte(tc.b), tc.lines); got != tc.want {
			t.Errorf("LinesSafe(%q, %d) = %v, want %v", tc.b, tc.lines, got, tc.want)
		}
	}
}
