//go:build race

package install

// raceEnabled builds the binaries under test with the race detector when the test runs
// with it: the builds then share the test's compiled packages, and a race in a real binary
// fails the test too.
const raceEnabled = true
