package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/secrets"
)

func newClusterCommand(hub *hubFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Change a fleet's worker clusters, and see them on the hub",
	}
	cmd.AddCommand(newClusterAddCommand(), newClusterRotateTokenCommand(), newClusterCordonCommand(), newClusterRemoveCommand(),
		newClusterListCommand(hub), newClusterStatusCommand(hub))
	return cmd
}

type clusterAddOptions struct {
	dir       string
	region    string
	zone      string
	residency string
	preset    string
	cordoned  bool
	gpus      int
}

func newClusterAddCommand() *cobra.Command {
	var o clusterAddOptions
	cmd := &cobra.Command{
		Use:   "add NAME --region R --residency D --preset P",
		Short: "Add a worker cluster with a new enrollment token",
		Long: "add creates clusters/NAME/ with cluster.yaml and enrollment.sops.yaml, a new\n" +
			"enrollment token encrypted with the rules of .sops.yaml, and writes the agent's\n" +
			"values file values.NAME.local.yaml (mode 0600, ignored by git), the one place the\n" +
			"token is readable. It changes nothing when the name is taken or invalid, the preset\n" +
			"does not exist, or the cluster would not validate.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.OutOrStdout(), args[0])
		},
	}
	cmd.Flags().StringVar(&o.dir, "dir", ".", "the fleet repository's checkout")
	cmd.Flags().StringVar(&o.region, "region", "", "the cluster's cloud region")
	cmd.Flags().StringVar(&o.zone, "zone", "", "the cluster's zone, if it lives in one")
	cmd.Flags().StringVar(&o.residency, "residency", "", "where the cluster's data may reside (one of fleet.yaml's allowedResidencies)")
	cmd.Flags().StringVar(&o.preset, "preset", "", "the scheduling preset under presets/")
	cmd.Flags().BoolVar(&o.cordoned, "cordoned", false, "enroll the cluster cordoned: no new jobs until uncordoned")
	cmd.Flags().IntVar(&o.gpus, "gpus", 0, "the cluster's nvidia.com/gpu quota (0: the preset's)")
	for _, f := range []string{"region", "residency", "preset"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

func (o *clusterAddOptions) run(out io.Writer, name string) error {
	f, err := loadFleetForEdit(o.dir)
	if err != nil {
		return err
	}
	if err := checkClusterName(name); err != nil {
		return err
	}
	clusterDir := filepath.Join(o.dir, fleet.ClustersDir, name)
	if _, err := os.Lstat(clusterDir); err == nil {
		return fmt.Errorf("%s already exists; rotate its token with `flotilla cluster rotate-token %s`", filepath.Join(fleet.ClustersDir, name), name)
	}
	for _, c := range f.Clusters {
		if c.Object != nil && c.Object.Name == name {
			return fmt.Errorf("%s already declares a cluster named %q", filepath.Join(c.Dir, fleet.ClusterFile), name)
		}
	}
	if _, ok := f.Presets[o.preset]; !ok {
		return fmt.Errorf("--preset %q does not exist under presets/ (have: %s)", o.preset, strings.Join(f.PresetNames(), ", "))
	}
	if o.gpus < 0 {
		return fmt.Errorf("--gpus %d: must not be negative", o.gpus)
	}
	valuesFile, err := checkValuesIgnored(o.dir, name)
	if err != nil {
		return err
	}
	tok, err := secrets.NewToken()
	if err != nil {
		return err
	}
	enrollment, err := encryptFor(o.dir, name, tok)
	if err != nil {
		return err
	}

	// From here on the only change is the new directory, which a failure removes whole.
	if err := os.MkdirAll(filepath.Join(o.dir, fleet.ClustersDir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(clusterDir, 0o755); err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(clusterDir)
		}
	}()
	if err := os.WriteFile(filepath.Join(clusterDir, fleet.ClusterFile), o.clusterYAML(name), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(clusterDir, fleet.EnrollmentFile), enrollment, 0o644); err != nil {
		return err
	}
	if c := f.LoadCluster(os.DirFS(o.dir), name); c == nil || len(c.Errors) > 0 {
		var msgs fleet.ErrorList
		if c != nil {
			msgs = c.Errors
		}
		return fmt.Errorf("the new cluster does not validate; nothing was written:\n%s", msgs.Error())
	}
	if err := writeValues(filepath.Join(o.dir, valuesFile), f, name, tok); err != nil {
		return err
	}
	keep = true
	printHandover(out, "Added", f, name, valuesFile, tok)
	return nil
}

func newClusterRotateTokenCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "rotate-token NAME",
		Short: "Give a cluster a new enrollment token",
		Long: "rotate-token replaces clusters/NAME/enrollment.sops.yaml with a new token and\n" +
			"writes a new values.NAME.local.yaml. Once the hub has read the commit, only the new\n" +
			"token enrolls the cluster.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			f, err := loadFleetForEdit(dir)
			if err != nil {
				return err
			}
			if err := checkClusterName(name); err != nil {
				return err
			}
			if _, ok := f.Clusters[name]; !ok {
				return fmt.Errorf("no cluster %q under %s/; add it with `flotilla cluster add`", name, fleet.ClustersDir)
			}
			valuesFile, err := checkValuesIgnored(dir, name)
			if err != nil {
				return err
			}
			tok, err := secrets.NewToken()
			if err != nil {
				return err
			}
			enrollment, err := encryptFor(dir, name, tok)
			if err != nil {
				return err
			}
			if err := writeFileAtomic(filepath.Join(dir, fleet.ClustersDir, name, fleet.EnrollmentFile), enrollment, 0o644); err != nil {
				return err
			}
			if err := writeValues(filepath.Join(dir, valuesFile), f, name, tok); err != nil {
				return err
			}
			printHandover(cmd.OutOrStdout(), "Rotated the token of", f, name, valuesFile, tok)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "the fleet repository's checkout")
	return cmd
}

// checkClusterName refuses a name that cannot be a cluster directory before anything
// else is looked at.
func checkClusterName(name string) error {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("cluster name %q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// loadFleetForEdit loads the checkout and insists on a valid fleet.yaml: a cluster's
// identity and values file depend on it.
func loadFleetForEdit(dir string) (*fleet.Fleet, error) {
	f, err := loadDir(dir)
	if err != nil {
		return nil, err
	}
	if f.Spec == nil || !f.Valid() {
		return nil, fmt.Errorf("fix the fleet's own files first:\n%s", f.Errors.Error())
	}
	if _, err := os.Stat(filepath.Join(dir, ".sops.yaml")); err != nil {
		return nil, fmt.Errorf("%s: no .sops.yaml; it says whom enrollment tokens are encrypted to (see `flotilla fleet init`)", dir)
	}
	return f, nil
}

func encryptFor(dir, name string, tok secrets.Token) ([]byte, error) {
	return secrets.EncryptEnrollment(filepath.Join(dir, ".sops.yaml"), filepath.Join(dir, fleet.ClustersDir, name, fleet.EnrollmentFile), tok)
}

// checkValuesIgnored refuses to write a values file that git would pick up: it holds the
// token in plaintext.
func checkValuesIgnored(dir, name string) (string, error) {
	file := "values." + name + ".local.yaml"
	m, err := gitIgnored(dir)
	if err != nil {
		return "", err
	}
	if !m.Match([]string{file}, false) {
		return "", fmt.Errorf("%s would not be ignored by git, and it holds the enrollment token; add `*.local.yaml` to .gitignore", file)
	}
	return file, nil
}

// gitIgnored reads the checkout's .gitignore files and .git/info/exclude.
func gitIgnored(dir string) (gitignore.Matcher, error) {
	ps, err := gitignore.ReadPatterns(osfs.New(dir), nil)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading .gitignore: %w", err)
	}
	return gitignore.NewMatcher(ps), nil
}

func (o *clusterAddOptions) clusterYAML(name string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Worker cluster %s. The directory's name is the worker's name.\n", name)
	b.WriteString("apiVersion: flotilla.dev/v1alpha1\nkind: WorkerCluster\nmetadata:\n")
	fmt.Fprintf(&b, "  name: %s\nspec:\n", yamlScalar(name))
	fmt.Fprintf(&b, "  region: %s\n", yamlScalar(o.region))
	if o.zone != "" {
		fmt.Fprintf(&b, "  zone: %s\n", yamlScalar(o.zone))
	}
	fmt.Fprintf(&b, "  residency: %s\n", yamlScalar(o.residency))
	fmt.Fprintf(&b, "  preset: %s\n", yamlScalar(o.preset))
	if o.gpus > 0 {
		fmt.Fprintf(&b, "  quota:\n    nvidia.com/gpu: %d\n", o.gpus)
	}
	b.WriteString("  # Set to true to stop new jobs from reaching this cluster; running jobs carry on.\n")
	fmt.Fprintf(&b, "  cordoned: %t\n", o.cordoned)
	return []byte(b.String())
}

// writeValues writes the agent chart's values: the one file that holds the token.
func writeValues(path string, f *fleet.Fleet, name string, tok secrets.Token) error {
	tenant := f.Spec.Spec.Tenant
	var b strings.Builder
	fmt.Fprintf(&b, "# Values of the flotilla-agent chart for worker cluster %s of tenant %s.\n", name, tenant)
	b.WriteString("# This file holds the cluster's one-shot enrollment token in plaintext: hand it to the\n" +
		"# worker's administrator over a channel you trust, and never commit it.\n")
	fmt.Fprintf(&b, "hub:\n  url: %s\n", yamlScalar(f.Spec.Spec.HubURL))
	fmt.Fprintf(&b, "cluster:\n  tenant: %s\n  name: %s\n  identity: %s\n", yamlScalar(tenant), yamlScalar(name), yamlScalar(fleet.Identity(tenant, name)))
	fmt.Fprintf(&b, "enrollment:\n  token: %s\n", tok.Reveal())
	return writeFileAtomic(path, []byte(b.String()), 0o600)
}

func printHandover(out io.Writer, what string, f *fleet.Fleet, name, valuesFile string, tok secrets.Token) {
	dir := fleet.ClustersDir + "/" + name
	fmt.Fprintf(out, "%s cluster %s (identity %s, token fingerprint %s).\n\n", what, name, fleet.Identity(f.Spec.Spec.Tenant, name), tok.Hash().Fingerprint())
	fmt.Fprintf(out, "Commit and open a pull request:\n  git add %s && git commit -m \"Enroll %s\"\n\n", dir, name)
	fmt.Fprintf(out, "Hand %s to the administrator of %s; it holds the token, is\n"+
		"ignored by git, and must not be committed:\n"+
		"  helm install flotilla-agent <flotilla-agent chart> --namespace flotilla-system --create-namespace -f %s\n\n", valuesFile, name, valuesFile)
	fmt.Fprintln(out, "The token works once: the agent redeems it for its own credential when it first dials the hub.")
}
