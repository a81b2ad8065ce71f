package rawsock

import (
	"io"
	"net"
	"testing"
)

// BenchmarkRoundTrip is a request written and its answer awaited and read,
// as the router's engine transport does, against an echoing peer (the
// peer's cost included: compare runs).
func BenchmarkRoundTrip(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		p, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(p, p)
			p.Close()
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	c, ok := Wrap(nc).(*Conn)
	if !ok {
		b.Skip("raw socket I/O is Linux only")
	}
	defer c.Close()
	req := make([]byte, 256)
	buf := make([]byte, 4096)
	flush := flushFunc(func() error { _, err := c.Write(req); return err })
	b.ReportAllocs()
	for b.Loop() {
		if err := c.WriteThenAwaitRead(flush); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < len(req); {
			n, err := c.Read(buf)
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
}
