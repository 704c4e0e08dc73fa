package main

// The `cluster` commands that edit a checkout of the fleet repository: add,
// rotate-token, cordon and remove. They change files and stop there: what reaches the hub
// is decided by the pull request a person opens, never by the CLI running git. The
// `cluster` commands that read the hub are in clusterhub.go.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
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
	if c := f.LoadCluster(fleet.DirFS(o.dir), name); c == nil || len(c.Errors) > 0 {
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
	var (
		dir    string
		revoke bool
	)
	cmd := &cobra.Command{
		Use:   "rotate-token NAME [--revoke]",
		Short: "Give a cluster a new enrollment token, and with --revoke cut off its agent's credential",
		Long: "rotate-token replaces clusters/NAME/enrollment.sops.yaml with a new token and\n" +
			"writes a new values.NAME.local.yaml. Once the hub has read the commit, only the new\n" +
			"token enrolls the cluster; the running agent keeps its credential until then.\n\n" +
			"--revoke also raises spec.revocation in clusters/NAME/cluster.yaml: once merged, the\n" +
			"hub refuses and disconnects every agent credential it issued before, whoever holds\n" +
			"it, until the agent is installed with the new values file. Use it when a credential\n" +
			"or a worker may be compromised. Nothing else of the cluster changes: its jobs keep\n" +
			"running, nothing is drained or pruned.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return rotateToken(cmd.OutOrStdout(), dir, args[0], revoke)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "the fleet repository's checkout")
	cmd.Flags().BoolVar(&revoke, "revoke", false, "raise spec.revocation too, so that the hub refuses and disconnects the agent's current credential at the merge")
	return cmd
}

func rotateToken(out io.Writer, dir, name string, revoke bool) error {
	f, err := loadFleetForEdit(dir)
	if err != nil {
		return err
	}
	if err := checkClusterName(name); err != nil {
		return err
	}
	c, ok := f.Clusters[name]
	if !ok {
		return fmt.Errorf("no cluster %q under %s/; add it with `flotilla cluster add`", name, fleet.ClustersDir)
	}
	valuesFile, err := checkValuesIgnored(dir, name)
	if err != nil {
		return err
	}
	var revocation int64
	if revoke {
		// The revocation is written first: a token rotated without it would leave the
		// credential it was asked to cut off in force.
		if revocation, err = raiseRevocation(f, c, dir); err != nil {
			return err
		}
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
	printHandover(out, "Rotated the token of", f, name, valuesFile, tok)
	if revoke {
		fmt.Fprintf(out, "\nRaised spec.revocation to %d in %s. Once merged, the hub refuses and disconnects\n"+
			"the agent's current credential, wherever it is used; the worker keeps running what it\n"+
			"has, and its status says it needs %s until the agent is installed with it.\n", revocation, path.Join(c.Dir, fleet.ClusterFile), valuesFile)
	}
	return nil
}

// raiseRevocation raises spec.revocation in the cluster's cluster.yaml by one, keeping
// every other byte, and returns the new count. The edit is judged by the loader the hub
// uses; what it does not accept is undone.
func raiseRevocation(f *fleet.Fleet, c *fleet.Cluster, dir string) (int64, error) {
	rel := path.Join(c.Dir, fleet.ClusterFile)
	if !c.Valid() {
		return 0, fmt.Errorf("%s does not validate; fix it first:\n%s", c.Dir, c.Errors.Error())
	}
	file := filepath.Join(dir, filepath.FromSlash(rel))
	info, err := os.Lstat(file)
	if err != nil {
		return 0, err
	}
	if !info.Mode().IsRegular() {
		return 0, fmt.Errorf("%s:1:1: not a regular file; raise spec.revocation by hand", rel)
	}
	want := c.Object.Spec.Revocation + 1
	old, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	data, err := setSpecScalar(old, "revocation", strconv.FormatInt(want, 10), "0")
	if err != nil {
		return 0, fmt.Errorf("%s: %w", rel, err)
	}
	if err := writeFileAtomic(file, data, info.Mode().Perm()); err != nil {
		return 0, err
	}
	if got := f.LoadCluster(fleet.DirFS(dir), path.Base(c.Dir)); got == nil || !got.Valid() || got.Object.Spec.Revocation != want {
		if err := writeFileAtomic(file, old, info.Mode().Perm()); err != nil {
			return 0, fmt.Errorf("%s: the edit did not validate and restoring the file failed: %w", rel, err)
		}
		var msgs fleet.ErrorList
		if got != nil {
			msgs = got.Errors
		}
		return 0, fmt.Errorf("%s: setting revocation: %d does not give a valid cluster; the file is unchanged:\n%s", rel, want, msgs.Error())
	}
	return want, nil
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
	if !readGitIgnore(dir).match([]string{file}, false) {
		return "", fmt.Errorf("%s would not be ignored by git, and it holds the enrollment token; add `*.local.yaml` to .gitignore", file)
	}
	return file, nil
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

func newClusterCordonCommand() *cobra.Command {
	var (
		dir      string
		uncordon bool
	)
	cmd := &cobra.Command{
		Use:   "cordon NAME [--uncordon]",
		Short: "Stop (or, with --uncordon, resume) dispatching new jobs to a cluster",
		Long: "cordon sets cordoned: true in clusters/NAME/cluster.yaml, and --uncordon sets it to\n" +
			"false, changing nothing else in the file. Once the change is merged the hub stops\n" +
			"dispatching new jobs to the cluster; running jobs carry on. It refuses a cluster\n" +
			"that does not validate, and never runs git.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cordon(cmd.OutOrStdout(), dir, args[0], !uncordon)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "the fleet repository's checkout")
	cmd.Flags().BoolVar(&uncordon, "uncordon", false, "set cordoned: false, so that new jobs reach the cluster again")
	return cmd
}

// loadFleetForChange loads the checkout for an edit of one cluster: fleet.yaml and the
// presets must be valid, since the hub reads nothing of a fleet whose own files are broken.
func loadFleetForChange(dir string) (*fleet.Fleet, error) {
	f, err := loadDir(dir)
	if err != nil {
		return nil, err
	}
	if !f.Valid() {
		return nil, fmt.Errorf("fix the fleet's own files first:\n%s", f.Errors.Error())
	}
	return f, nil
}

// fleetCluster is the cluster directory NAME of the fleet in dir, refused with the
// problems of its files when it is not a cluster the hub could read.
func fleetCluster(f *fleet.Fleet, dir, name string) (*fleet.Cluster, error) {
	if err := checkClusterName(name); err != nil {
		return nil, err
	}
	c, ok := f.Clusters[name]
	if !ok {
		have := ""
		if names := f.ClusterNames(); len(names) > 0 {
			have = " (have: " + strings.Join(names, ", ") + ")"
		}
		return nil, fmt.Errorf("no cluster %q under %s/ of %s%s", name, fleet.ClustersDir, dir, have)
	}
	// The loader follows symbolic links; an edit must not write or delete through one.
	for _, p := range []string{fleet.ClustersDir, c.Dir} {
		info, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			return nil, fmt.Errorf("%s is a symbolic link or not a directory; change it by hand", p)
		}
	}
	return c, nil
}

func cordon(out io.Writer, dir, name string, want bool) error {
	f, err := loadFleetForChange(dir)
	if err != nil {
		return err
	}
	c, err := fleetCluster(f, dir, name)
	if err != nil {
		return err
	}
	rel := path.Join(c.Dir, fleet.ClusterFile)
	if !c.Valid() {
		return fmt.Errorf("%s does not validate; fix it first:\n%s", c.Dir, c.Errors.Error())
	}
	file := filepath.Join(dir, filepath.FromSlash(rel))
	info, err := os.Lstat(file)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s:1:1: not a regular file; set cordoned by hand", rel)
	}
	action, title := "cordon", "Cordon"
	if !want {
		action, title = "uncordon", "Uncordon"
	}
	if c.Object.Spec.Cordoned == want {
		fmt.Fprintf(out, "Cluster %s is already %sed in %s; nothing changed.\n", name, action, rel)
		return nil
	}
	old, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	data, err := setCordoned(old, want)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if err := writeFileAtomic(file, data, info.Mode().Perm()); err != nil {
		return err
	}
	// The edit is judged by the loader the hub uses; what it does not accept is undone.
	if c := f.LoadCluster(fleet.DirFS(dir), name); c == nil || !c.Valid() || c.Object.Spec.Cordoned != want {
		if err := writeFileAtomic(file, old, info.Mode().Perm()); err != nil {
			return fmt.Errorf("%s: the edit did not validate and restoring the file failed: %w", rel, err)
		}
		var msgs fleet.ErrorList
		if c != nil {
			msgs = c.Errors
		}
		return fmt.Errorf("%s: setting cordoned: %t does not give a valid cluster; the file is unchanged:\n%s", rel, want, msgs.Error())
	}

	fmt.Fprintf(out, "Set cordoned: %t in %s.\n", want, rel)
	if want {
		fmt.Fprintf(out, "Once merged, the hub dispatches no new jobs to %s; running jobs carry on.\n\n", name)
	} else {
		fmt.Fprintf(out, "Once merged, the hub dispatches new jobs to %s again.\n\n", name)
	}
	printNextStep(out, action+"-"+name, "add "+rel, title+" "+name)
	return nil
}

// setCordoned sets spec.cordoned in a cluster.yaml, keeping every other byte.
func setCordoned(data []byte, want bool) ([]byte, error) {
	return setSpecScalar(data, "cordoned", strconv.FormatBool(want), "false")
}

// setSpecScalar sets spec.KEY to value in a cluster.yaml, keeping every other byte. A
// file that does not say KEY has it at absent, and is left alone for that value;
// otherwise the key is added as the first of spec, so that no comment above another
// key is separated from it.
func setSpecScalar(data []byte, key, value, absent string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("not a single YAML mapping")
	}
	specKey, spec := mappingEntry(doc.Content[0], "spec")
	if spec == nil || spec.Kind != yaml.MappingNode {
		return nil, errors.New("no spec mapping")
	}
	if k, _ := mappingEntry(spec, key); k != nil {
		return setRawScalar(data, value, "spec", key)
	}
	if value == absent {
		return data, nil
	}
	if spec.Style&yaml.FlowStyle != 0 || len(spec.Content) == 0 || spec.Content[0].Line <= specKey.Line {
		return nil, fmt.Errorf("%d:%d: spec is not a block mapping; add %s: %s to it by hand", specKey.Line, specKey.Column, key, value)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	after := lines[specKey.Line-1]
	eol := "\n"
	if bytes.HasSuffix(after, []byte("\r\n")) {
		eol = "\r\n"
	}
	first := spec.Content[0]
	firstLine := lines[first.Line-1]
	indent := firstLine[:first.Column-1]
	if len(bytes.Trim(indent, " ")) > 0 {
		return nil, fmt.Errorf("%d:%d: spec is not indented with spaces; add %s: %s to it by hand", first.Line, first.Column, key, value)
	}
	inserted := string(indent) + key + ": " + value + eol
	return bytes.Join(slices.Insert(lines, specKey.Line, []byte(inserted)), nil), nil
}

// mappingEntry is the key and value nodes of key in mapping m, or nils.
func mappingEntry(m *yaml.Node, key string) (*yaml.Node, *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i], m.Content[i+1]
		}
	}
	return nil, nil
}

func newClusterRemoveCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a cluster's directory: merging it decommissions the cluster",
		Long: "remove deletes clusters/NAME/ and every file in it, and nothing else. Once the\n" +
			"change is merged the hub decommissions the cluster: its agent prunes the objects it\n" +
			"applied on the worker (the fleet keeps those marked " + v1alpha1.PruneAnnotation + ": " + v1alpha1.PruneDisabled + ",\n" +
			"such as the workload namespaces), the agent's credential is revoked and the\n" +
			"WorkerCluster deleted. It never runs git.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return removeCluster(cmd.OutOrStdout(), dir, args[0])
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".", "the fleet repository's checkout")
	return cmd
}

func removeCluster(out io.Writer, dir, name string) error {
	f, err := loadFleetForChange(dir)
	if err != nil {
		return err
	}
	c, err := fleetCluster(f, dir, name)
	if err != nil {
		return err
	}
	// Only a directory that declares a WorkerCluster is one of the fleet's clusters; any
	// other directory under clusters/ is not for this command to delete.
	rel := path.Join(c.Dir, fleet.ClusterFile)
	if _, ok := c.Files[rel]; !ok {
		return fmt.Errorf("%s:1:1: no cluster.yaml, so %s is not a cluster of this fleet; remove it by hand", c.Dir, c.Dir)
	}
	if c.Object == nil {
		return fmt.Errorf("%s does not declare a WorkerCluster, so it is not removed:\n%s", rel, c.Errors.Error())
	}

	root := filepath.Join(dir, filepath.FromSlash(c.Dir))
	var files, dirs []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		} else {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing %s: %w", c.Dir, err)
	}
	// Files first, then directories deepest first: a symbolic link is removed itself,
	// never what it points to.
	var removed []string
	for _, p := range files {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("%w (already removed: %s)", err, strings.Join(removed, ", "))
		}
		r, _ := filepath.Rel(dir, p)
		removed = append(removed, filepath.ToSlash(r))
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil {
			return err
		}
	}

	fmt.Fprintf(out, "Removed cluster %s (identity %s):\n", name, fleet.Identity(f.Spec.Spec.Tenant, name))
	for _, r := range removed {
		fmt.Fprintf(out, "  %s\n", r)
	}
	fmt.Fprintf(out, "\nMerging this decommissions %s: the hub asks its agent to prune every object it\n"+
		"applied on the worker, except those the fleet keeps (%s: %s, such as the\n"+
		"workload namespaces), then revokes the agent's credential and deletes the WorkerCluster.\n"+
		"If the agent is not connected then, nothing is pruned on the worker.\n\n",
		name, v1alpha1.PruneAnnotation, v1alpha1.PruneDisabled)
	values := "values." + name + ".local.yaml"
	if _, err := os.Lstat(filepath.Join(dir, values)); err == nil {
		ignored := "it is ignored by git"
		if !readGitIgnore(dir).match([]string{values}, false) {
			ignored = "git does NOT ignore it: make sure it was never committed"
		}
		fmt.Fprintf(out, "%s is still here (%s). It holds the cluster's\n"+
			"enrollment token: destroy it, e.g. shred -u %s\n\n", values, ignored, values)
	}
	printNextStep(out, "remove-"+name, "add -A "+c.Dir, "Decommission "+name)
	return nil
}

// printNextStep tells how the change reaches the hub: through review, on a branch.
func printNextStep(out io.Writer, branch, add, message string) {
	fmt.Fprintf(out, "Commit on a branch and open a pull request:\n"+
		"  git switch -c %s\n"+
		"  git %s && git commit -m %q\n"+
		"  git push -u origin %s\n", branch, add, message, branch)
}
