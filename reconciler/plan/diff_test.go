package plan

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

func TestUnifiedDiffReadsLikeDiffU(t *testing.T) {
	lines := func(from, to int) string {
		var b strings.Builder
		for i := from; i <= to; i++ {
			fmt.Fprintf(&b, "l%d\n", i)
		}
		return b.String()
	}
	tests := []struct {
		name     string
		old, new string
		want     string
	}{
		{name: "equal texts give no diff", old: "a\nb\n", new: "a\nb\n", want: ""},
		{name: "both empty give no diff", old: "", new: "", want: ""},
		{
			name: "an added file is all insertions after line zero",
			old:  "", new: "a\nb\n",
			want: "--- old\n+++ new\n@@ -0,0 +1,2 @@\n+a\n+b\n",
		},
		{
			name: "a removed file is all deletions",
			old:  "a\n", new: "",
			want: "--- old\n+++ new\n@@ -1 +0,0 @@\n-a\n",
		},
		{
			name: "a changed line is removed above its replacement with context around",
			old:  lines(1, 9), new: strings.Replace(lines(1, 9), "l5\n", "L5\n", 1),
			want: "--- old\n+++ new\n@@ -2,7 +2,7 @@\n l2\n l3\n l4\n-l5\n+L5\n l6\n l7\n l8\n",
		},
		{
			name: "an insertion names the line it follows",
			old:  "a\nb\n", new: "a\nx\nb\n",
			want: "--- old\n+++ new\n@@ -1,2 +1,3 @@\n a\n+x\n b\n",
		},
		{
			name: "changes closer than twice the context share a hunk",
			old:  lines(1, 12), new: strings.Replace(strings.Replace(lines(1, 12), "l3\n", "", 1), "l9\n", "", 1),
			want: "--- old\n+++ new\n@@ -1,12 +1,10 @@\n l1\n l2\n-l3\n l4\n l5\n l6\n l7\n l8\n-l9\n l10\n l11\n l12\n",
		},
		{
			name: "changes further apart get hunks of their own",
			old:  lines(1, 20), new: strings.Replace(strings.Replace(lines(1, 20), "l2\n", "", 1), "l18\n", "", 1),
			want: "--- old\n+++ new\n@@ -1,5 +1,4 @@\n l1\n-l2\n l3\n l4\n l5\n@@ -15,6 +14,5 @@\n l15\n l16\n l17\n-l18\n l19\n l20\n",
		},
		{
			name: "the longest common subsequence is kept",
			old:  "a\nb\nc\nd\n", new: "b\nc\ne\n",
			want: "--- old\n+++ new\n@@ -1,4 +1,3 @@\n-a\n b\n c\n-d\n+e\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := unifiedDiff("old", "new", tt.old, tt.new)
			if got != tt.want {
				t.Fatalf("diff\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// Whatever the texts, applying the diff to the old one gives the new one, also past the
// size where the line-by-line search gives up on finding the shortest diff.
func TestUnifiedDiffAppliesToTheOldText(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	text := func(n int) string {
		var b strings.Builder
		for range n {
			// Few distinct lines, so that texts share many of them, as YAML does.
			b.WriteString(strconv.Itoa(rng.IntN(6)) + "\n")
		}
		return b.String()
	}
	for i := range 300 {
		old, new := text(rng.IntN(30)), text(rng.IntN(30))
		checkApplies(t, fmt.Sprintf("case %d", i), old, new)
	}
	big := 1600 // 1600*1600 cells exceed maxLCSCells
	old, new := text(big), text(big)
	checkApplies(t, "past the search's bound", "head\n"+old+"tail\n", "head\n"+new+"tail\n")
}

func checkApplies(t *testing.T, name, old, new string) {
	t.Helper()
	d := unifiedDiff("a", "b", old, new)
	got, err := applyDiff(old, d)
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, d)
	}
	if got != new {
		t.Fatalf("%s: applying\n%s\nto\n%q\ngave\n%q\nwant\n%q", name, d, old, got, new)
	}
}

// applyDiff applies a unified diff strictly: every context and removed line must be
// where the hunk header says.
func applyDiff(old, diff string) (string, error) {
	a := splitLines(old)
	dl := splitLines(diff)
	if len(dl) == 0 {
		return old, nil
	}
	if len(dl) < 2 || !strings.HasPrefix(dl[0], "--- ") || !strings.HasPrefix(dl[1], "+++ ") {
		return "", fmt.Errorf("no file headers")
	}
	var out []string
	pos := 0 // next line of a to copy
	for i := 2; i < len(dl); {
		var os, ol, ns, nl int
		if err := parseHunkHeader(dl[i], &os, &ol, &ns, &nl); err != nil {
			return "", err
		}
		start := os - 1
		if ol == 0 {
			start = os
		}
		if start < pos {
			return "", fmt.Errorf("hunk %q overlaps the previous one", dl[i])
		}
		out = append(out, a[pos:start]...)
		pos = start
		i++
		gotOld, gotNew := 0, 0
		for ; i < len(dl) && !strings.HasPrefix(dl[i], "@@"); i++ {
			l := dl[i]
			switch l[0] {
			case ' ', '-':
				if pos >= len(a) || a[pos] != l[1:] {
					return "", fmt.Errorf("line %d of the old text is not %q", pos+1, l[1:])
				}
				pos++
				gotOld++
				if l[0] == ' ' {
					out = append(out, l[1:])
					gotNew++
				}
			case '+':
				out = append(out, l[1:])
				gotNew++
			default:
				return "", fmt.Errorf("bad line %q", l)
			}
		}
		if gotOld != ol || gotNew != nl {
			return "", fmt.Errorf("hunk counts -%d +%d, header says -%d +%d", gotOld, gotNew, ol, nl)
		}
	}
	out = append(out, a[pos:]...)
	if len(out) == 0 {
		return "", nil
	}
	return strings.Join(out, "\n") + "\n", nil
}

func parseHunkHeader(h string, os, ol, ns, nl *int) error {
	var oldR, newR string
	if _, err := fmt.Sscanf(h, "@@ -%s +%s @@", &oldR, &newR); err != nil {
		return fmt.Errorf("hunk header %q: %v", h, err)
	}
	parse := func(r string, s, l *int) error {
		start, length, ok := strings.Cut(r, ",")
		*l = 1
		var err error
		if *s, err = strconv.Atoi(start); err != nil {
			return err
		}
		if ok {
			*l, err = strconv.Atoi(length)
		}
		return err
	}
	if err := parse(oldR, os, ol); err != nil {
		return err
	}
	return parse(newR, ns, nl)
}
