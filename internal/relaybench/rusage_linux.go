package relaybench

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// cpuTime is the process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// resetPeakRSS resets the kernel's peak resident set size of this process
// (VmHWM) to the current one, so that peakRSS measures a phase. It reports
// whether the kernel allowed it.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// peakRSS returns VmHWM in bytes, or getrusage's lifetime maximum when
// /proc is not readable.
func peakRSS() int64 {
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmHWM:")); ok {
				f := bytes.Fields(rest)
				if len(f) > 0 {
					if kb, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil {
						return kb << 10
					}
				}
			}
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Maxrss << 10 // kilobytes on Linux
}
