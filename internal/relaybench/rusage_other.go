//go:build !linux

package relaybench

import "time"

// cpuTime is not measured outside Linux.
func cpuTime() time.Duration { return 0 }

// resetPeakRSS is not possible outside Linux.
func resetPeakRSS() bool { return false }

// peakRSS is not measured outside Linux.
func peakRSS() int64 { return 0 }

// serverCPU is not measured outside Linux.
func serverCPU(int) (time.Duration, bool) { return 0, false }
