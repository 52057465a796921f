// Package buildinfo says which Herald a binary holds, from what the Go
// toolchain records in it (runtime/debug.ReadBuildInfo): the module
// version of `go install …@v1.2.3`, and for a build from a git checkout
// the commit, its time and whether the tree had uncommitted changes.
// `relay version` prints it and the metrics export it as herald_build_info.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// ModulePath is Herald's module.
const ModulePath = "github.com/heraldhq/herald"

// Info is what a build recorded of Herald.
type Info struct {
	// Version is Herald's module version: a release (v1.2.3), the
	// pseudo-version Go gives a build from a checkout
	// (v0.0.0-20261203195259-5a619bb239dd+dirty), or "" when the build
	// recorded none (Go's "(devel)").
	Version string
	// Revision is the commit Herald was built from, in full; "" when
	// unknown. Go records it only when Herald is the main module, built in
	// its git checkout.
	Revision string
	// Time is the commit's time; zero when unknown.
	Time time.Time
	// Modified says the checkout had uncommitted changes.
	Modified bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Read returns what the running binary recorded.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{GoVersion: runtime.Version()}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo returns what bi records of Herald: the main module's
// version and VCS settings when Herald is the main module (the relay
// binary), else the version of Herald as a dependency (an embedding
// program, whose VCS settings are its own, not Herald's).
func FromBuildInfo(bi *debug.BuildInfo) Info {
	info := Info{GoVersion: bi.GoVersion}
	if info.GoVersion == "" {
		info.GoVersion = runtime.Version()
	}
	if bi.Main.Path != ModulePath {
		for _, d := range bi.Deps {
			if d.Path != ModulePath {
				continue
			}
			if d.Replace != nil {
				d = d.Replace
			}
			info.Version = version(d.Version)
		}
		return info
	}
	info.Version = version(bi.Main.Version)
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time, _ = time.Parse(time.RFC3339, s.Value) // left zero when Go wrote something else
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// version is a module version, "" for none: Go writes "(devel)" for a
// main module built without a version, and "" for a replacement by a
// directory.
func version(v string) string {
	if v == "(devel)" {
		return ""
	}
	return v
}

// VersionOrDevel is Version, or "devel" when the build recorded none.
func (i Info) VersionOrDevel() string {
	if i.Version == "" {
		return "devel"
	}
	return i.Version
}

// String is the version and what the build recorded of its source, on one
// line:
//
//	v1.2.3 (go1.26.8)
//	v0.0.0-20261203195259-5a619bb239dd+dirty (commit 5a619bb239dd…, 2026-12-03T19:52:59Z, uncommitted changes; go1.26.8)
//	devel (no version or commit recorded: …; go1.26.8)
func (i Info) String() string {
	var source []string
	if i.Revision != "" {
		source = append(source, "commit "+i.Revision)
		if !i.Time.IsZero() {
			source = append(source, i.Time.UTC().Format(time.RFC3339))
		}
		if i.Modified {
			source = append(source, "uncommitted changes")
		}
	} else if i.Version == "" {
		// Go records a commit only for `go build` in a git checkout (not a
		// linked worktree) without -buildvcs=false, and a version only for
		// `go install module@version`: say so rather than print "(devel)".
		source = append(source, "no version or commit recorded: built with -buildvcs=false, from a git worktree or outside a git checkout")
	}
	if len(source) == 0 {
		return fmt.Sprintf("%s (%s)", i.VersionOrDevel(), i.GoVersion)
	}
	return fmt.Sprintf("%s (%s; %s)", i.VersionOrDevel(), strings.Join(source, ", "), i.GoVersion)
}
