package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/secrets"
)

func newValidateCommand() *cobra.Command {
	var ageKey string
	cmd := &cobra.Command{
		Use:   "validate [DIR]",
		Short: "Check a fleet repository the way the hub will",
		Long: "validate loads the fleet repository in DIR (default: the current directory),\n" +
			"checks every file, renders every cluster and scans every file that git would\n" +
			"track for plaintext enrollment tokens. With --age-key it also decrypts every\n" +
			"enrollment file with the hub's age identities and checks its MAC and token.\n" +
			"Each problem is printed as file:line:column: message; the exit status is 1 when\n" +
			"there is any.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := dirArg(args)
			var dec *secrets.Decryptor
			if ageKey != "" {
				ids, err := readIdentities(ageKey)
				if err != nil {
					return err
				}
				dec = secrets.NewDecryptor(secrets.DecryptorOptions{Identities: ids})
			}
			f, err := loadDir(dir)
			if err != nil {
				return err
			}
			errs := f.AllErrors()
			r := render.New()
			valid := 0
			for _, name := range f.ClusterNames() {
				c := f.Clusters[name]
				if dec != nil && c.Enrollment() != nil && !hasErrorIn(c.Errors, path.Join(c.Dir, fleet.EnrollmentFile)) {
					errs = append(errs, checkEnrollment(cmd, dec, c)...)
				}
				if !f.Valid() || !c.Valid() {
					continue
				}
				if _, err := r.Render(f, name); err != nil {
					errs = append(errs, asErrorList(err, name)...)
					continue
				}
				valid++
			}
			leaks, err := scanForTokens(dir)
			if err != nil {
				return err
			}
			errs = append(errs, leaks...)
			if len(errs) > 0 {
				errs.Sort()
				for _, e := range errs {
					fmt.Fprintln(cmd.ErrOrStderr(), e.Error())
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d %s\n", dir, len(errs), plural(len(errs), "error", "errors"))
				return errReported
			}
			decrypted := ""
			if dec != nil {
				decrypted = ", every enrollment file decrypted"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: fleet %q is valid: %d %s, %d %s%s\n", dir, f.Spec.Spec.Tenant,
				valid, plural(valid, "cluster", "clusters"), len(f.Presets), plural(len(f.Presets), "preset", "presets"), decrypted)
			return nil
		},
	}
	cmd.Flags().StringVar(&ageKey, "age-key", "", "age key file of the hub: decrypt and check every enrollment file")
	return cmd
}

func readIdentities(file string) (*secrets.Identities, error) {
	fh, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	ids, err := secrets.ParseIdentities(file, fh)
	if err != nil {
		return nil, err
	}
	if ids.Len() == 0 {
		return nil, fmt.Errorf("%s holds no age identity", file)
	}
	return ids, nil
}

func checkEnrollment(cmd *cobra.Command, dec *secrets.Decryptor, c *fleet.Cluster) fleet.ErrorList {
	file := path.Join(c.Dir, fleet.EnrollmentFile)
	if _, err := dec.TokenHash(cmd.Context(), file, c.Enrollment()); err != nil {
		msg := err.Error()
		var fe *secrets.FileError
		if errors.As(err, &fe) {
			msg = fe.Reason()
		}
		return fleet.ErrorList{{File: file, Cluster: c.Name, Message: msg}}
	}
	return nil
}

func hasErrorIn(list fleet.ErrorList, file string) bool {
	for _, e := range list {
		if e.File == file {
			return true
		}
	}
	return false
}

// scanForTokens reports plaintext tokens in every file git would track: the .git
// directory and ignored files, such as the agent's values files, are left out.
func scanForTokens(dir string) (fleet.ErrorList, error) {
	ignored, err := gitIgnored(dir)
	if err != nil {
		return nil, err
	}
	leaks, err := secrets.ScanFS(os.DirFS(dir), func(p string, isDir bool) bool {
		return p == ".git" || ignored.Match(strings.Split(p, "/"), isDir)
	})
	if err != nil {
		return nil, err
	}
	var list fleet.ErrorList
	for _, l := range leaks {
		list = append(list, fleet.Error{File: l.File, Line: l.Line, Column: l.Column, Message: l.Message()})
	}
	return list, nil
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
