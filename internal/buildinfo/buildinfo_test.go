package buildinfo_test

import (
	"runtime/debug"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/buildinfo"
)

func TestFromBuildInfo(t *testing.T) {
	t.Parallel()
	const rev = "5a619bb239ddc147f89efdbdb8e6941e2bfc70e5"
	vcs := []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
		{Key: "vcs.time", Value: "2026-12-03T19:52:59Z"}, {Key: "vcs.modified", Value: "true"}}
	cases := []struct {
		name string
		bi   debug.BuildInfo
		want buildinfo.Info
		line string
	}{{
		name: "go install at a release",
		bi:   debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: buildinfo.ModulePath, Version: "v1.2.3"}},
		want: buildinfo.Info{Version: "v1.2.3", GoVersion: "go1.26.8"},
		line: "v1.2.3 (go1.26.8)",
	}, {
		name: "go build in a checkout with changes",
		bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: buildinfo.ModulePath,
			Version: "v0.0.0-20261203195259-5a619bb239dd+dirty"}, Settings: vcs},
		want: buildinfo.Info{Version: "v0.0.0-20261203195259-5a619bb239dd+dirty", Revision: rev,
			Time: time.Date(2026, 12, 3, 19, 52, 59, 0, time.UTC), Modified: true, GoVersion: "go1.26.8"},
		line: "v0.0.0-20261203195259-5a619bb239dd+dirty (commit " + rev + ", 2026-12-03T19:52:59Z, uncommitted changes; go1.26.8)",
	}, {
		name: "a commit without a version",
		bi:   debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: buildinfo.ModulePath, Version: "(devel)"}, Settings: vcs[:3]},
		want: buildinfo.Info{Revision: rev, Time: time.Date(2026, 12, 3, 19, 52, 59, 0, time.UTC), GoVersion: "go1.26.8"},
		line: "devel (commit " + rev + ", 2026-12-03T19:52:59Z; go1.26.8)",
	}, {
		name: "nothing recorded",
		bi:   debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: buildinfo.ModulePath, Version: "(devel)"}},
		want: buildinfo.Info{GoVersion: "go1.26.8"},
		line: "devel (no version or commit recorded: built with -buildvcs=false, from a git worktree or outside a git checkout; go1.26.8)",
	}, {
		// An embedding program: its own commit is not Herald's.
		name: "a dependency",
		bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/shop", Version: "v2.0.0"}, Settings: vcs,
			Deps: []*debug.Module{{Path: "golang.org/x/sys", Version: "v0.49.0"}, {Path: buildinfo.ModulePath, Version: "v1.4.0"}}},
		want: buildinfo.Info{Version: "v1.4.0", GoVersion: "go1.26.8"},
		line: "v1.4.0 (go1.26.8)",
	}, {
		name: "a dependency replaced by another version",
		bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/shop"},
			Deps: []*debug.Module{{Path: buildinfo.ModulePath, Version: "v1.4.0", Replace: &debug.Module{Path: "example.com/fork", Version: "v1.4.1"}}}},
		want: buildinfo.Info{Version: "v1.4.1", GoVersion: "go1.26.8"},
		line: "v1.4.1 (go1.26.8)",
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := buildinfo.FromBuildInfo(&c.bi)
			if got != c.want {
				t.Fatalf("FromBuildInfo = %+v, want %+v", got, c.want)
			}
			if s := got.String(); s != c.line {
				t.Fatalf("String() =\n  %s\nwant\n  %s", s, c.line)
			}
		})
	}
}
