package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"filippo.io/age"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	fleettemplate "github.com/flotilla-gitops/flotilla/fleet-template"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
)

func newFleetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Create a fleet repository",
	}
	cmd.AddCommand(newFleetInitCommand())
	return cmd
}

type fleetInitOptions struct {
	tenant     string
	hubURL     string
	recipients []string
	// managedComponents: the agents install Kueue and JobSet.
	managedComponents bool
}

func newFleetInitCommand() *cobra.Command {
	var o fleetInitOptions
	cmd := &cobra.Command{
		Use:   "init DIR --tenant T --hub-url wss://HUB --age-recipient age1...",
		Short: "Create a fleet repository from flotilla's template",
		Long: "init writes a new fleet repository into DIR, which must not exist or be empty:\n" +
			"fleet.yaml for the tenant and hub, the scheduling presets, a .sops.yaml that\n" +
			"encrypts enrollment tokens to the hub's age recipients, and a CI workflow that\n" +
			"runs `flotilla validate` on pull requests. Add clusters with `flotilla cluster add`.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if err := o.check(); err != nil {
				return err
			}
			if err := emptyOrMissing(dir); err != nil {
				return err
			}
			created, err := o.write(dir)
			if err != nil {
				removeCreated(created)
				return err
			}
			f := fleet.Load(fleet.DirFS(dir))
			if errs := f.AllErrors(); len(errs) > 0 {
				removeCreated(created)
				return fmt.Errorf("the new fleet repository does not validate; nothing was kept:\n%s", errs.Error())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Created fleet repository %s for tenant %q.\n"+
				"Next: `git init` it, push it where the hub can read it, and add clusters with\n"+
				"  flotilla cluster add NAME --region R --residency D --preset P   (in %s)\n", dir, o.tenant, dir)
			if _, err := protocol.CheckHubURL(o.hubURL, false); errors.Is(err, protocol.ErrInsecureLoopback) {
				fmt.Fprintf(cmd.OutOrStdout(), "Agents dial the unencrypted %s only when started with --allow-insecure-loopback.\n", o.hubURL)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.tenant, "tenant", "", "tenant that owns the fleet's clusters (a DNS label)")
	cmd.Flags().StringVar(&o.hubURL, "hub-url", "", "URL agents dial, wss://host[:port][/path] (ws:// only to a loopback host)")
	cmd.Flags().StringArrayVar(&o.recipients, "age-recipient", nil, "age public key of the hub (repeatable)")
	cmd.Flags().BoolVar(&o.managedComponents, "manage-components", true, "agents install and upgrade Kueue and JobSet on the workers (false: the workers' teams run them)")
	for _, f := range []string{"tenant", "hub-url", "age-recipient"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

func (o *fleetInitOptions) check() error {
	if errs := validation.IsDNS1123Label(o.tenant); len(errs) > 0 {
		return fmt.Errorf("--tenant %q: %s", o.tenant, strings.Join(errs, "; "))
	}
	// The agent's own rule, so that every URL written here is one an agent dials. A
	// fleet may name a hub on the agents' loopback, as a demo does; its agents then
	// dial it only with --allow-insecure-loopback.
	if _, err := protocol.CheckHubURL(o.hubURL, true); err != nil {
		return fmt.Errorf("--hub-url: %w", err)
	}
	for _, r := range o.recipients {
		if _, err := parseRecipient(r); err != nil {
			return fmt.Errorf("--age-recipient %q: %w", r, err)
		}
	}
	return nil
}

// parseRecipient accepts the native age recipients the hub can hold identities for.
func parseRecipient(s string) (age.Recipient, error) {
	if strings.HasPrefix(s, "age1pq1") {
		return age.ParseHybridRecipient(s)
	}
	r, err := age.ParseX25519Recipient(s)
	if err != nil {
		return nil, errors.New("not an age public key (age1...)")
	}
	return r, nil
}

func emptyOrMissing(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case len(entries) > 0:
		return fmt.Errorf("%s is not empty; fleet init only writes into a new or empty directory", dir)
	}
	return nil
}

// write copies the template into dir, leaving out the example cluster (its enrollment
// file is a placeholder no hub can decrypt), and fills in the tenant, hub and recipients.
// It returns what it created, so that a failure can take it back.
func (o *fleetInitOptions) write(dir string) ([]string, error) {
	var created []string
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		created = append(created, dir)
	}
	tmpl := fleettemplate.FS()
	err := fs.WalkDir(tmpl, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		if p == fleet.ClustersDir {
			return fs.SkipDir
		}
		dst := filepath.Join(dir, filepath.FromSlash(p))
		if d.IsDir() {
			if err := os.Mkdir(dst, 0o755); err != nil {
				return err
			}
			created = append(created, dst)
			return nil
		}
		data, err := fs.ReadFile(tmpl, p)
		if err != nil {
			return err
		}
		switch path.Clean(p) {
		case fleet.FleetFile:
			if data, err = setScalar(data, o.tenant, "spec", "tenant"); err == nil {
				data, err = setScalar(data, o.hubURL, "spec", "hubURL")
			}
			if err == nil {
				data, err = setRawScalar(data, strconv.FormatBool(o.managedComponents), "spec", "components", "managed")
			}
		case ".sops.yaml":
			data, err = setScalar(data, strings.Join(o.recipients, ","), "creation_rules", "0", "age")
		}
		if err != nil {
			return fmt.Errorf("template %s: %w", p, err)
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return err
		}
		created = append(created, dst)
		return nil
	})
	return created, err
}

// removeCreated undoes write, newest first.
func removeCreated(paths []string) {
	for i := len(paths) - 1; i >= 0; i-- {
		os.Remove(paths[i])
	}
}
