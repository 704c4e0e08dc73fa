package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// versionVar is the variable the binaries report in --version.
const versionVar = "github.com/flotilla-gitops/flotilla/cmd/internal/version.Version"

// compiler builds the images' binaries.
type compiler struct {
	// Go is the go command.
	Go string
	// Root is the repository.
	Root string
}

// compile builds the commands (directories under cmd/) for one platform into out, in one
// go build so that the packages they share compile once.
func (c compiler) compile(ctx context.Context, p v1.Platform, version, out string, commands []string) error {
	args := append([]string{"build"}, buildFlags(version)...)
	args = append(args, "-o", out+string(filepath.Separator))
	for _, cmd := range commands {
		args = append(args, "./cmd/"+cmd)
	}
	cmd := exec.CommandContext(ctx, c.Go, args...)
	cmd.Dir = c.Root
	cmd.Env = append(os.Environ(), buildEnv(p)...)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s for %s: %w\n%s", strings.Join(commands, ", "), p.String(), err, output.Bytes())
	}
	return nil
}

// buildFlags are the flags of go build besides -o; cmd/Dockerfile passes the same.
func buildFlags(version string) []string {
	return []string{"-trimpath",
		// The revision is the image's label. Stamped into the binaries it would tie their
		// bytes to whether git is at hand and to uncommitted files that are not in the
		// image at all (vcs.modified).
		"-buildvcs=false",
		// -s -w: no symbol table or DWARF, a third of the size; -buildid=: no build ID,
		// which -trimpath already makes stable but nothing reads in an image.
		"-ldflags", "-s -w -buildid= -X " + versionVar + "=" + version,
	}
}

// buildEnv makes the binaries static and the same on every machine: the caller's GOFLAGS
// (-race, tags) and microarchitecture levels do not reach them. Later entries win in
// os/exec, so these override the environment.
func buildEnv(p v1.Platform) []string {
	return []string{
		"CGO_ENABLED=0",
		"GOOS=" + p.OS,
		"GOARCH=" + p.Architecture,
		"GOAMD64=v1",
		"GOARM64=v8.0",
		"GOFLAGS=",
	}
}
