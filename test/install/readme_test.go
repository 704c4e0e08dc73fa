package install

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// sectionTitle is the README section this package runs.
const sectionTitle = "## Run it on your clusters"

// substitution replaces a placeholder of the README, which names the user's world, with
// what stands for it here.
type substitution struct {
	from, to string
	// why this machine cannot use the README's text as it is.
	why string
}

// substitutions is the one table of what the test changes in the README's commands. Every
// entry must match somewhere in the section, or the test fails: the README changed and the
// table did not. Not substituted, because the test provides them under the README's own
// names: the kubeconfig contexts hub and gpu-east, the files hub.crt, hub.key, hub-ca.crt
// and forge-token, and the images of registry.acme.example (the pod runner plays them with
// the binaries built from this repository). flotilla.acme.example, the Ingress's host, is
// only in the hub's values and the prose: no ingress controller runs here, and the test
// delivers the forge's webhooks to the hub's HTTP Service, which the Ingress routes to.
func substitutions(w *world) []substitution {
	return []substitution{
		{from: fmt.Sprintf("oci://registry.k8s.io/kueue/charts/kueue --version %s", strings.TrimPrefix(w.kueueVersion, "v")), to: w.kueueChart,
			why: "no network: the Kueue chart at the same version, as this release embeds it (agent/components/charts)"},
		{from: "wss://hub.acme.example", to: "wss://" + w.tunnelAddr,
			why: "no DNS: the loopback address that plays the tunnel Service; the test's certificate names it beside hub.acme.example"},
		{from: "https://git.acme.example/acme/fleet.git", to: w.repoURL,
			why: "the forge: the test's git server, which serves HTTP on loopback"},
	}
}

// block is one ```sh block of the section, its commands as bash reads them.
type block struct {
	// line is the README line the block starts on, for messages.
	line     int
	commands []string
}

// readSection returns the ```sh blocks of the README's section, with subs applied, and
// fails the test when a substitution matches nothing.
func readSection(t *testing.T, readme string, subs []substitution) []block {
	t.Helper()
	data, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "\n"+sectionTitle+"\n")
	if start < 0 {
		t.Fatalf("%s has no section %q", readme, sectionTitle)
	}
	start++
	end := len(text)
	if i := strings.Index(text[start+len(sectionTitle):], "\n## "); i >= 0 {
		end = start + len(sectionTitle) + i + 1
	}
	section := text[start:end]
	firstLine := strings.Count(text[:start], "\n") + 1

	used := make([]bool, len(subs))
	var out []block
	for _, m := range shBlock.FindAllStringSubmatchIndex(section, -1) {
		body := section[m[2]:m[3]]
		for i, s := range subs {
			if strings.Contains(body, s.from) {
				used[i] = true
				body = strings.ReplaceAll(body, s.from, s.to)
			}
		}
		cmds, err := splitCommands(body)
		if err != nil {
			t.Fatalf("%s:%d: %v", filepath.Base(readme), firstLine+strings.Count(section[:m[0]], "\n"), err)
		}
		out = append(out, block{line: firstLine + strings.Count(section[:m[0]], "\n"), commands: cmds})
	}
	for i, s := range subs {
		if !used[i] {
			t.Errorf("the README's section %q no longer has %q, which the test replaces (%s): update the substitution table", sectionTitle, s.from, s.why)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// shBlock is a fenced block of sh; its body is the first group.
var shBlock = regexp.MustCompile("(?ms)^```sh\n(.*?)^```$")

// heredocStart finds a here-document's delimiter on a line: <<WORD, <<'WORD', <<"WORD", <<-WORD.
var heredocStart = regexp.MustCompile(`<<-?\s*(['"]?)([A-Za-z_][A-Za-z0-9_]*)(['"]?)`)

// splitCommands splits a block into the commands bash would read one at a time: a line, with
// the lines it continues with a trailing backslash and the here-document it opens. Comment
// lines and blank lines are left out.
func splitCommands(body string) ([]string, error) {
	lines := strings.Split(strings.TrimRight(body, "\n"), "\n")
	var cmds []string
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if trimmed := strings.TrimSpace(line); trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		cmd := []string{line}
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = lines[i]
			cmd = append(cmd, line)
		}
		if m := heredocStart.FindStringSubmatch(strings.Join(cmd, "\n")); m != nil {
			found := false
			for i+1 < len(lines) {
				i++
				cmd = append(cmd, lines[i])
				if strings.TrimSpace(lines[i]) == m[2] {
					found = true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("the here-document %s is never closed", m[2])
			}
		}
		cmds = append(cmds, strings.Join(cmd, "\n"))
	}
	return cmds, nil
}

func TestCommandsSplitAsBashReadsThem(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{name: "one command a line, comments and blanks left out",
			body: "# a comment\nkubectl get pods\n\n  # another\ngit status\n",
			want: []string{"kubectl get pods", "git status"}},
		{name: "a backslash continues a command",
			body: "helm install a b \\\n  --namespace c \\\n  -f d\nnext",
			want: []string{"helm install a b \\\n  --namespace c \\\n  -f d", "next"}},
		{name: "a here-document belongs to its command, comments in it too",
			body: "cat > v.yaml <<'YAML'\na: 1\n# kept\nYAML\nhelm install x y -f v.yaml",
			want: []string{"cat > v.yaml <<'YAML'\na: 1\n# kept\nYAML", "helm install x y -f v.yaml"}},
		{name: "an unquoted delimiter",
			body: "cat <<EOF\n$HOME\nEOF",
			want: []string{"cat <<EOF\n$HOME\nEOF"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := splitCommands(tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := splitCommands("cat <<'YAML'\na: 1\n"); err == nil {
		t.Fatal("a here-document that is never closed was accepted")
	}
}
