package plan

import (
	"fmt"
	"strings"
)

// DiffContext is how many unchanged lines surround each change in a diff.
const DiffContext = 3

// maxLCSCells bounds the table of the longest-common-subsequence search. Rendered
// objects are tens of lines, so the bound is only reached by a pathological file; the
// differing middle of such a pair is then shown as removed and added whole, which is a
// correct diff, just not the shortest one.
const maxLCSCells = 1 << 21

type editKind byte

const (
	editEqual  editKind = ' '
	editDelete editKind = '-'
	editInsert editKind = '+'
)

// edit is one step of an edit script. a and b are the positions in the old and the new
// lines the step is at: for an insertion a is the old line it comes before, for a
// deletion b is the new line it comes before.
type edit struct {
	kind editKind
	a, b int
}

// splitLines splits text into lines without their newlines. A missing newline at the
// end is not told apart from a present one: rendered YAML always ends with one.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// edits returns an edit script that turns a into b, keeping the longest common
// subsequence of lines. Common leading and trailing lines are matched first, so the
// table only covers what differs.
func edits(a, b []string) []edit {
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	out := make([]edit, 0, len(a)+len(b)-pre-suf)
	for i := range pre {
		out = append(out, edit{editEqual, i, i})
	}
	out = appendMiddle(out, a[pre:len(a)-suf], b[pre:len(b)-suf], pre, pre)
	for i := range suf {
		out = append(out, edit{editEqual, len(a) - suf + i, len(b) - suf + i})
	}
	return out
}

// appendMiddle appends the edits turning a into b, whose first lines are at offA and
// offB of the whole texts.
func appendMiddle(out []edit, a, b []string, offA, offB int) []edit {
	n, m := len(a), len(b)
	i, j := 0, 0
	if n > 0 && m > 0 && n*m <= maxLCSCells {
		// lcs[i*(m+1)+j] is the length of the longest common subsequence of a[i:] and
		// b[j:]; it fits uint16 because the cell bound keeps min(n, m) below 2^16.
		w := m + 1
		lcs := make([]uint16, (n+1)*w)
		for i := n - 1; i >= 0; i-- {
			for j := m - 1; j >= 0; j-- {
				switch {
				case a[i] == b[j]:
					lcs[i*w+j] = lcs[(i+1)*w+j+1] + 1
				case lcs[(i+1)*w+j] >= lcs[i*w+j+1]:
					lcs[i*w+j] = lcs[(i+1)*w+j]
				default:
					lcs[i*w+j] = lcs[i*w+j+1]
				}
			}
		}
		for i < n && j < m {
			switch {
			case a[i] == b[j]:
				out = append(out, edit{editEqual, offA + i, offB + j})
				i++
				j++
			case lcs[(i+1)*w+j] >= lcs[i*w+j+1]:
				// Deleting first puts the old line above the new one, as readers expect.
				out = append(out, edit{editDelete, offA + i, offB + j})
				i++
			default:
				out = append(out, edit{editInsert, offA + i, offB + j})
				j++
			}
		}
	}
	for ; i < n; i++ {
		out = append(out, edit{editDelete, offA + i, offB + j})
	}
	for ; j < m; j++ {
		out = append(out, edit{editInsert, offA + n, offB + j})
	}
	return out
}

// unifiedDiff returns the unified diff (as diff -u and git write it) turning old into
// new, headed by the two names, with DiffContext lines of context; empty when the texts
// are equal.
func unifiedDiff(oldName, newName, old, new string) string {
	a, b := splitLines(old), splitLines(new)
	es := edits(a, b)
	var sb strings.Builder
	for i := 0; i < len(es); {
		for i < len(es) && es[i].kind == editEqual {
			i++
		}
		if i == len(es) {
			break
		}
		// A hunk runs from DiffContext lines before its first change to DiffContext
		// lines after its last; changes closer than twice that share a hunk.
		start, last := max(0, i-DiffContext), i
		for k := i + 1; k < len(es) && k-last-1 <= 2*DiffContext; k++ {
			if es[k].kind != editEqual {
				last = k
			}
		}
		end := min(len(es), last+1+DiffContext)
		if sb.Len() == 0 {
			fmt.Fprintf(&sb, "--- %s\n+++ %s\n", oldName, newName)
		}
		writeHunk(&sb, es[start:end], a, b)
		i = end
	}
	return sb.String()
}

func writeHunk(sb *strings.Builder, hunk []edit, a, b []string) {
	oldLen, newLen := 0, 0
	for _, e := range hunk {
		if e.kind != editInsert {
			oldLen++
		}
		if e.kind != editDelete {
			newLen++
		}
	}
	fmt.Fprintf(sb, "@@ -%s +%s @@\n", hunkRange(hunk[0].a, oldLen), hunkRange(hunk[0].b, newLen))
	for _, e := range hunk {
		line := ""
		if e.kind == editInsert {
			line = b[e.b]
		} else {
			line = a[e.a]
		}
		sb.WriteByte(byte(e.kind))
		sb.WriteString(line)
		sb.WriteByte('\n')
	}
}

// hunkRange formats where a hunk lies in one file: 1-based, the length left out when it
// is 1, and for an empty range the line after which it lies, as GNU diff does.
func hunkRange(pos, n int) string {
	switch n {
	case 0:
		return fmt.Sprintf("%d,0", pos)
	case 1:
		return fmt.Sprintf("%d", pos+1)
	default:
		return fmt.Sprintf("%d,%d", pos+1, n)
	}
}
