package fleet

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Error is one problem in a fleet repository, placed where a fleet owner has to change
// something.
type Error struct {
	// File is the slash-separated path of the file from the repository's root; empty
	// for a problem of the whole head, such as a budget it exceeds.
	File string
	// Line and Column are 1-based; zero when the problem concerns the file as a whole.
	Line, Column int
	// Cluster is the worker the problem belongs to; empty for the fleet as a whole.
	Cluster string
	// Message says what is wrong and, where it is not obvious, what to do about it.
	Message string
}

func (e Error) Error() string {
	switch {
	case e.File == "":
		return e.Message
	case e.Line > 0 && e.Column > 0:
		return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Message)
	case e.Line > 0:
		return fmt.Sprintf("%s:%d:1: %s", e.File, e.Line, e.Message)
	default:
		return fmt.Sprintf("%s:1:1: %s", e.File, e.Message)
	}
}

// ErrorList is every problem found, in file and line order.
type ErrorList []Error

func (l ErrorList) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Sort orders the list by file, line and column so that output is stable.
func (l ErrorList) Sort() {
	slices.SortStableFunc(l, func(a, b Error) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line),
			cmp.Compare(a.Column, b.Column), cmp.Compare(a.Message, b.Message))
	})
}

// errs collects errors for one file.
type errs struct {
	file    string
	cluster string
	list    *ErrorList
}

func (e errs) at(line, col int, format string, args ...any) {
	*e.list = append(*e.list, Error{File: e.file, Line: line, Column: col, Cluster: e.cluster, Message: fmt.Sprintf(format, args...)})
}

func (e errs) whole(format string, args ...any) { e.at(0, 0, format, args...) }
