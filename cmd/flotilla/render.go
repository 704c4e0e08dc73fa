package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/reconciler/render"
)

func newRenderCommand() *cobra.Command {
	var cluster, output string
	cmd := &cobra.Command{
		Use:   "render [DIR] --cluster NAME",
		Short: "Print the objects the hub sends to one worker cluster",
		Long: "render prints exactly what the hub sends to the named cluster's agent: the\n" +
			"sorted object list and its hash, the cluster's desired generation.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "yaml" && output != "json" {
				return fmt.Errorf("--output must be yaml or json, not %q", output)
			}
			f, err := loadDir(dirArg(args))
			if err != nil {
				return err
			}
			if _, ok := f.Clusters[cluster]; !ok {
				return fmt.Errorf("no cluster %q in the fleet (have %d clusters under clusters/)", cluster, len(f.Clusters))
			}
			res, err := render.New().Render(f, cluster)
			if err != nil {
				for _, e := range asErrorList(err, cluster) {
					fmt.Fprintln(cmd.ErrOrStderr(), e.Error())
				}
				return errReported
			}
			var data []byte
			if output == "json" {
				data, err = res.JSON()
			} else {
				data, err = res.YAML()
			}
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", "name of the cluster (its directory under clusters/)")
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "output format: yaml or json")
	_ = cmd.MarkFlagRequired("cluster")
	return cmd
}
