package main

// `commit status` reads the commit statuses the hub keeps as git notes in the fleet
// repository; `status` is its former name.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
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

// auth reads the files the flags name; without --known-hosts an SSH key is checked
// against ~/.ssh/known_hosts, as ssh does.
func (f *gitAuthFlags) auth() (transport.AuthMethod, error) {
	fa := gitsource.FileAuth{Username: f.username, PasswordFile: f.passwordFile, SSHKeyFile: f.sshKey, KnownHostsFile: f.knownHosts}
	if fa.SSHKeyFile != "" && fa.KnownHostsFile == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, fmt.Errorf("--known-hosts is not given and the home directory is unknown: %w", err)
		}
		fa.KnownHostsFile = filepath.Join(home, ".ssh", "known_hosts")
	}
	return gitsource.AuthFromFiles(fa)
}

func newCommitCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "commit",
		Short: "Read what the hub recorded on the fleet repository's commits",
	}
	cmd.AddCommand(newCommitStatusCommand())
	return cmd
}

func newCommitStatusCommand() *cobra.Command {
	var (
		repo, branch, commit, ref string
		auth                      gitAuthFlags
	)
	cmd := &cobra.Command{
		Use:   "status --repo URL [--commit SHA]",
		Short: "Show the commit statuses the hub recorded as git notes",
		Long: "status reads the statuses a hub without a forge keeps in the fleet repository, as\n" +
			"git notes under refs/notes/flotilla, for one commit: by default the head of the\n" +
			"branch. On GitHub, Gitea or GitLab the hub posts them to the forge instead, which\n" +
			"shows them on the commit. What the hub knows of a cluster now is\n" +
			"`flotilla cluster status NAME`.",
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

// newDeprecatedStatusCommand keeps `flotilla status`, the name `commit status` had, for
// one release. It is hidden from help, and says so on stderr rather than through cobra's
// Deprecated, which writes to stdout, where scripts read the statuses.
func newDeprecatedStatusCommand() *cobra.Command {
	cmd := newCommitStatusCommand()
	cmd.Hidden = true
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		fmt.Fprintln(cmd.ErrOrStderr(), "flotilla: `flotilla status` is deprecated and will be removed in the next release; use `flotilla commit status`")
		return run(cmd, args)
	}
	return cmd
}
