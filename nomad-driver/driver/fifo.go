package driver

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// openFIFOWriter opens one of the task's log FIFOs (which Nomad's logmon
// created and reads) for writing; it blocks until the reader is there.
func openFIFOWriter(path string) (*os.File, error) {
	f, err := os.OpenFile(path, unix.O_WRONLY, os.ModeNamedPipe)
	if err != nil {
		return nil, fmt.Errorf("opening log fifo %s: %w", path, err)
	}
	return f, nil
}

// cpuTotalTicks is the node's compute in MHz (the sum of every core's
// clock), the unit of Nomad's CPU "ticks"; read once.
func (d *Driver) cpuTotalTicks() float64 {
	d.ticksOnce.Do(func() {
		d.ticks = cpuMHzSum("/proc/cpuinfo")
	})
	return d.ticks
}

// cpuMHzSum sums the "cpu MHz" lines of a cpuinfo file; where there are
// none (or the file is unreadable) it counts 1,000 MHz per CPU.
func cpuMHzSum(path string) float64 {
	fallback := float64(runtime.NumCPU()) * 1000
	b, err := os.ReadFile(path)
	if err != nil {
		return fallback
	}
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok || string(bytes.TrimSpace(k)) != "cpu MHz" {
			continue
		}
		if mhz, err := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64); err == nil {
			sum += mhz
		}
	}
	if sum == 0 {
		return fallback
	}
	return sum
}
