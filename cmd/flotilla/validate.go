package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
)

func newValidateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "validate [DIR]",
		Short: "Check a fleet repository the way the hub will",
		Long: "validate loads the fleet repository in DIR (default: the current directory),\n" +
			"checks every file and renders every cluster. Each problem is printed as\n" +
			"file:line:column: message; the exit status is 1 when there is any.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := dirArg(args)
			f, err := loadDir(dir)
			if err != nil {
				return err
			}
			errs := f.AllErrors()
			r := render.New()
			valid := 0
			for _, name := range f.ClusterNames() {
				if !f.Valid() || !f.Clusters[name].Valid() {
					continue
				}
				if _, err := r.Render(f, name); err != nil {
					errs = append(errs, asErrorList(err, name)...)
					continue
				}
				valid++
			}
			if len(errs) > 0 {
				errs.Sort()
				for _, e := range errs {
					fmt.Fprintln(cmd.ErrOrStderr(), e.Error())
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d %s\n", dir, len(errs), plural(len(errs), "error", "errors"))
				return errReported
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: fleet %q is valid: %d %s, %d %s\n", dir, f.Spec.Spec.Tenant,
				valid, plural(valid, "cluster", "clusters"), len(f.Presets), plural(len(f.Presets), "preset", "presets"))
			return nil
		},
	}
}

func dirArg(args []string) string {
	if len(args) == 1 {
		return args[0]
	}
	return "."
}

// loadDir loads a fleet repository from disk. Only a missing directory is an error
// here; everything wrong inside it is in the fleet's error list.
func loadDir(dir string) (*fleet.Fleet, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	return fleet.Load(os.DirFS(dir)), nil
}

func asErrorList(err error, cluster string) fleet.ErrorList {
	if list, ok := err.(fleet.ErrorList); ok {
		return list
	}
	return fleet.ErrorList{{File: fleet.ClustersDir + "/" + cluster, Cluster: cluster, Message: err.Error()}}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
