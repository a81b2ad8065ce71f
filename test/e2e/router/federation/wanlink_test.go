package federation

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"github.com/shoenig/test/must"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// wanLink is a network namespace joined to the host by a veth pair. The
// federation traffic between the two routers crosses it through relays
// bound inside, so cutting the namespace's side of the pair cuts the WAN:
// datagrams vanish, with no ICMP and no reset, as on a dead long-haul link.
type wanLink struct {
	name         string // namespace
	hostIf, nsIf string // veth ends
	hostIP, nsIP string // a private /30
	ns           netns.NsHandle
	drop         *ebpf.Program // returns TC_ACT_SHOT for every packet
}

var wanLinks atomic.Int32

// newWANLink creates the namespace and its veth pair, removed at cleanup.
// It needs root (skipped otherwise, failed under CI).
func newWANLink(t *testing.T) *wanLink {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.SkipUnlessCI(t, "network namespaces need root")
	}
	sweepWANLinks()
	// Names and addresses unique per process, so concurrent runs do not meet.
	pid, n := os.Getpid(), wanLinks.Add(1)
	l := &wanLink{name: fmt.Sprintf("oasis-wan-%d-%d", pid, n),
		hostIf: fmt.Sprintf("ow%dh%d", pid%100000, n), nsIf: fmt.Sprintf("ow%dn%d", pid%100000, n)}
	third, fourth := pid%250+1, int(n%63)*4
	l.hostIP, l.nsIP = fmt.Sprintf("10.213.%d.%d", third, fourth+1), fmt.Sprintf("10.213.%d.%d", third, fourth+2)
	ip(t, "netns", "add", l.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", l.name).Run() })
	ip(t, "link", "add", l.hostIf, "type", "veth", "peer", "name", l.nsIf)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", l.hostIf).Run() })
	ip(t, "link", "set", l.nsIf, "netns", l.name)
	ip(t, "addr", "add", l.hostIP+"/30", "dev", l.hostIf)
	ip(t, "link", "set", l.hostIf, "up")
	ip(t, "-n", l.name, "addr", "add", l.nsIP+"/30", "dev", l.nsIf)
	ip(t, "-n", l.name, "link", "set", l.nsIf, "up")
	ip(t, "-n", l.name, "link", "set", "lo", "up")
	h, err := netns.GetFromName(l.name)
	must.NoError(t, err)
	l.ns = h
	t.Cleanup(func() { _ = h.Close() })
	// Loaded with the link, not at the first cut: a subtest's cleanup
	// would close it while later subtests still cut with it.
	must.NoError(t, rlimit.RemoveMemlock())
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* TC_ACT_SHOT */), asm.Return()}})
	must.NoError(t, err)
	l.drop = prog
	t.Cleanup(func() { _ = prog.Close() })
	return l
}

// sweepWANLinks deletes the namespaces of test processes that died before
// their cleanup ran (a test binary killed at its timeout runs none);
// deleting a namespace deletes its veth pair.
func sweepWANLinks() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(line, " ")
		var pid, n int
		if _, err := fmt.Sscanf(name, "oasis-wan-%d-%d", &pid, &n); err != nil || pid == os.Getpid() {
			continue
		}
		if unix.Kill(pid, 0) == unix.ESRCH {
			_ = exec.Command("ip", "netns", "del", name).Run()
		}
	}
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	must.NoError(t, err, must.Sprintf("ip %s: %s", strings.Join(args, " "), out))
}

// listenUDP binds a UDP socket on the namespace's address: a socket keeps
// the namespace it was created in, whichever thread uses it later.
func (l *wanLink) listenUDP(t *testing.T) net.PacketConn {
	t.Helper()
	type result struct {
		c   net.PacketConn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is released only when it is back in the host's
		// namespace; otherwise it ends with this goroutine.
		orig, err := netns.Get()
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		if err := netns.Set(l.ns); err != nil {
			ch <- result{err: err}
			return
		}
		c, err := net.ListenPacket("udp", net.JoinHostPort(l.nsIP, "0"))
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	must.NoError(t, r.err)
	t.Cleanup(func() { _ = r.c.Close() })
	return r.c
}

// cut drops every packet entering or leaving the namespace's veth end with
// an eBPF program on its clsact qdisc: a silent cut in both directions.
func (l *wanLink) cut(t *testing.T) {
	t.Helper()
	h, link := l.handle(t)
	defer h.Close()
	qd := &netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	must.NoError(t, h.QdiscReplace(qd))
	for _, f := range l.filters(link) {
		err := h.FilterReplace(f)
		must.NoError(t, err, must.Sprintf("adding the drop filter: %v", err))
	}
}

// restore removes the drop filters; the qdisc stays, empty.
func (l *wanLink) restore(t *testing.T) {
	t.Helper()
	h, link := l.handle(t)
	defer h.Close()
	for _, f := range l.filters(link) {
		err := h.FilterDel(f)
		must.NoError(t, err, must.Sprintf("removing the drop filter: %v", err))
	}
}

// filters are the drop program on the link's ingress and egress hooks.
func (l *wanLink) filters(link netlink.Link) []*netlink.BpfFilter {
	var out []*netlink.BpfFilter
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		out = append(out, &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: link.Attrs().Index,
			Parent: parent, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
			Fd: l.drop.FD(), Name: "oasis-wan-cut", DirectAction: true})
	}
	return out
}

func (l *wanLink) handle(t *testing.T) (*netlink.Handle, netlink.Link) {
	t.Helper()
	h, err := netlink.NewHandleAt(l.ns)
	must.NoError(t, err)
	link, err := h.LinkByName(l.nsIf)
	must.NoError(t, err)
	return h, link
}

// relay forwards UDP datagrams between clients on its front socket and
// target, each one after the current delay: a WAN's latency in user space
// (this kernel has no netem). Each client gets its own socket towards
// target, so target sees distinct peers.
type relay struct {
	front  net.PacketConn
	target *net.UDPAddr
	delay  atomic.Int64 // one way, nanoseconds

	mu    sync.Mutex
	backs map[string]*net.UDPConn // by client address
	out   *delayer                // towards target
	in    *delayer                // towards clients
}

func startRelay(t *testing.T, front net.PacketConn, target string) *relay {
	t.Helper()
	ta, err := net.ResolveUDPAddr("udp", target)
	must.NoError(t, err)
	r := &relay{front: front, target: ta, backs: map[string]*net.UDPConn{}, out: newDelayer(), in: newDelayer()}
	t.Cleanup(func() {
		_ = front.Close()
		r.mu.Lock()
		for _, b := range r.backs {
			_ = b.Close()
		}
		r.mu.Unlock()
		r.out.close()
		r.in.close()
	})
	go r.serve()
	return r
}

// Addr is where clients send to.
func (r *relay) Addr() string { return r.front.LocalAddr().String() }

// SetDelay sets the one-way delay added to every datagram from now on.
func (r *relay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

func (r *relay) serve() {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := r.front.ReadFrom(buf)
		if err != nil {
			return
		}
		b := r.back(from)
		if b == nil {
			continue
		}
		p := append([]byte(nil), buf[:n]...)
		r.out.send(time.Now().Add(time.Duration(r.delay.Load())), func() { _, _ = b.Write(p) })
	}
}

// back returns from's socket towards target, starting its return path.
func (r *relay) back(from net.Addr) *net.UDPConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.backs[from.String()]; b != nil {
		return b
	}
	b, err := net.DialUDP("udp", nil, r.target)
	if err != nil {
		return nil
	}
	r.backs[from.String()] = b
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := b.Read(buf)
			if err != nil {
				return
			}
			p := append([]byte(nil), buf[:n]...)
			r.in.send(time.Now().Add(time.Duration(r.delay.Load())), func() { _, _ = r.front.WriteTo(p, from) })
		}
	}()
	return b
}

// delayer sends datagrams at their due times, in order.
type delayer struct {
	ch   chan delayed
	once sync.Once
}

type delayed struct {
	due  time.Time
	send func()
}

func newDelayer() *delayer {
	d := &delayer{ch: make(chan delayed, 8192)}
	go func() {
		for x := range d.ch {
			time.Sleep(time.Until(x.due)) // the input: the simulated link's delay
			x.send()
		}
	}()
	return d
}

// send queues one datagram; a full queue drops it, as a full router
// buffer would.
func (d *delayer) send(due time.Time, f func()) {
	defer func() { _ = recover() }() // closed at cleanup while a reader still ran
	select {
	case d.ch <- delayed{due, f}:
	default:
	}
}

func (d *delayer) close() { d.once.Do(func() { close(d.ch) }) }

// TestWANLink checks the helper itself: datagrams cross the link, vanish
// while it is cut, and cross again once it is restored, twice over.
func TestWANLink(t *testing.T) {
	l := newWANLink(t)
	srv := l.listenUDP(t)
	cli, err := net.ListenPacket("udp", "0.0.0.0:0")
	must.NoError(t, err)
	defer cli.Close()
	crosses := func() bool {
		_, err := cli.WriteTo([]byte("x"), srv.LocalAddr())
		must.NoError(t, err)
		must.NoError(t, srv.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
		buf := make([]byte, 16)
		_, _, err = srv.ReadFrom(buf)
		return err == nil
	}
	for range 2 {
		must.True(t, crosses())
		l.cut(t)
		must.False(t, crosses())
		l.restore(t)
	}
	must.True(t, crosses())
}
