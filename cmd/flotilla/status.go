package main

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/status/gitnotes"
)

// gitAuthFlags are the credentials for reading a repository. Secrets come from files,
// never from the command line, where other users of the machine could read them.
type gitAuthFlags struct {
	username     string
	passwordFile string
	sshKey       string
	knownHosts   string
}

func (f *gitAuthFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.username, "username", "", "HTTP user (with --password-file) or SSH user (default git)")
	cmd.Flags().StringVar(&f.passwordFile, "password-file", "", "file holding the HTTP password or forge token")
	cmd.Flags().StringVar(&f.sshKey, "ssh-key", "", "file holding the SSH private key")
	cmd.Flags().StringVar(&f.knownHosts, "known-hosts", "", "known_hosts file for SSH (default ~/.ssh/known_hosts)")
}

func (f *gitAuthFlags) auth() (transport.AuthMethod, error) {
	switch {
	case f.passwordFile != "" && f.sshKey != "":
		return nil, fmt.Errorf("--password-file and --ssh-key exclude each other")
	case f.passwordFile != "":
		pw, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return nil, err
		}
		return gitsource.HTTPAuth(cmp.Or(f.username, "git"), strings.TrimSpace(string(pw))), nil
	case f.sshKey != "":
		key, err := os.ReadFile(f.sshKey)
		if err != nil {
			return nil, err
		}
		hostsFile := f.knownHosts
		if hostsFile == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return nil, err
			}
			hostsFile = home + "/.ssh/known_hosts"
		}
		hosts, err := os.ReadFile(hostsFile)
		if err != nil {
			return nil, fmt.Errorf("the server's host key must be known: %w", err)
		}
		return gitsource.SSHAuth(f.username, key, nil, hosts)
	}
	return nil, nil
}

func newStatusCommand() *cobra.Command {
	var (
		repo, branch, commit, ref string
		auth                      gitAuthFlags
	)
	cmd := &cobra.Command{
		Use:   "status --repo URL [--commit SHA]",
		Short: "Show the commit statuses the hub recorded as git notes",
		Long: "status reads the statuses a hub without a forge keeps in the fleet repository, as\n" +
			"git notes under refs/notes/flotilla, for one commit: by default the head of the\n" +
			"branch.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			a, err := auth.auth()
			if err != nil {
				return err
			}
			if commit == "" {
				src, err := gitsource.New(gitsource.Options{URL: repo, Branch: branch, Auth: a})
				if err != nil {
					return err
				}
				h, err := src.RemoteHead(ctx)
				if err != nil {
					return err
				}
				commit = h.String()
			}
			b, err := gitnotes.New(gitnotes.Options{URL: repo, Auth: a, Ref: ref})
			if err != nil {
				return err
			}
			note, err := b.Read(ctx, commit)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "commit %s\n", commit)
			if len(note.Statuses) == 0 {
				fmt.Fprintln(out, "no statuses")
				return nil
			}
			names := make([]string, 0, len(note.Statuses))
			for name := range note.Statuses {
				names = append(names, name)
			}
			slices.Sort(names)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CONTEXT\tSTATE\tUPDATED\tDESCRIPTION")
			for _, name := range names {
				e := note.Statuses[name]
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, e.State, e.Updated.Format(time.RFC3339), e.Description)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&repo, "repo", "", "URL of the fleet repository (required)")
	cmd.Flags().StringVar(&branch, "branch", "main", "branch whose head is shown when --commit is not given")
	cmd.Flags().StringVar(&commit, "commit", "", "full hash of the commit to show")
	cmd.Flags().StringVar(&ref, "notes-ref", gitnotes.DefaultRef, "notes ref the hub writes")
	auth.register(cmd)
	_ = cmd.MarkFlagRequired("repo")
	return cmd
}
