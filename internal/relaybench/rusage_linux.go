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

// clockTicks is the kernel's USER_HZ, the unit of /proc's CPU times: 100
// on every Linux architecture Go builds for.
const clockTicks = 100

// serverCPU is the CPU time the PostgreSQL server whose postmaster is pid
// has used so far: the postmaster's own and its ended children's (cutime,
// cstime), plus that of its children still running. ok is false when the
// server's processes cannot be read (another host, another PID
// namespace).
func serverCPU(postmaster int) (cpu time.Duration, ok bool) {
	own, ppid, ok := procCPU(strconv.Itoa(postmaster), true)
	if !ok || ppid < 0 {
		return 0, false
	}
	total := own
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if c, parent, ok := procCPU(e.Name(), false); ok && parent == postmaster {
			total += c
		}
	}
	return total, true
}

// procCPU reads process pid's user and system time from /proc (with its
// ended children's when children is set) and its parent's pid.
func procCPU(pid string, children bool) (cpu time.Duration, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing parenthesis (field 3, state, is f[0]).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || !bytes.HasPrefix(b[bytes.IndexByte(b, '(')+1:], []byte("postgres")) {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 15 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(string(f[1]))
	last := 12 // utime (14) and stime (15)
	if children {
		last = 14 // and cutime (16), cstime (17)
	}
	var ticks int64
	for _, s := range f[11 : last+1] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, ppid, true
}
