//go:build !race

package install

const raceEnabled = false
