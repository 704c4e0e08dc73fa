//go:build race

package e2e

// raceEnabled builds the binaries under test with the race detector when the tests
// run with it: the builds then share the tests' compiled packages, and races in the
// real binaries fail the tests too.
const raceEnabled = true
