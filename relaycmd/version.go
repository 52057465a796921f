package relaycmd

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/internal/buildinfo"
)

// newVersionCommand prints version (WithVersion) or, when it is empty, the
// module version Go recorded (go install …@v1.2.3), and for a build from a
// git checkout the commit.
func newVersionCommand(version string) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the relay's version, the commit it was built from and its Go version",
		Long: `Print the relay's version: the release of go install …/cmd/relay@v1.2.3,
or for a build from a git checkout the pseudo-version Go gives it with the
commit, the commit's time and whether the tree had uncommitted changes.`,
		Args: cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "relay %s\n", buildInfo(version))
		},
	}
}

// buildInfo is what the build recorded, with version, when set, in place
// of the module's.
func buildInfo(version string) buildinfo.Info {
	info := buildinfo.Read()
	if version != "" {
		info.Version = version
	}
	return info
}
