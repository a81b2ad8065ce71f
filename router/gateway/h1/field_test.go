package h1

import (
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
