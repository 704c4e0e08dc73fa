// Package version reports the build of a flotilla binary.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is set at build time with -ldflags "-X .../version.Version=v1.2.3"; otherwise
// it comes from the module information Go records in the binary.
var Version = ""

// String describes the binary: program name, version, VCS revision and Go version.
func String(program string) string {
	v, rev := Version, ""
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				rev = s.Value
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	s := fmt.Sprintf("%s %s", program, v)
	if rev != "" {
		s += " " + rev
	}
	return s + " " + runtime.Version()
}

// Stub is the whole command line of a binary whose work has not landed yet: it answers
// --version and --help and nothing else.
func Stub(program, short string) *cobra.Command {
	cmd := &cobra.Command{
		Use:           program,
		Short:         short,
		Version:       String(program),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.SetVersionTemplate("{{.Version}}\n")
	return cmd
}
